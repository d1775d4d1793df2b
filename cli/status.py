"""`mooncake-redis status`: capacity, usage and objects per shard, mounted segments, the store
clock, the functions version, eviction and workers, offload, gateways (--json: docs/json.md)."""
from __future__ import annotations

import click

from mooncake_redis.cluster import is_cluster, primary_clients
from mooncake_redis.functions import LIBRARY_NAME, LIBRARY_PROTOCOL, library_source, server_library
from mooncake_redis.gateway.store import GatewayStore
from mooncake_redis.keys import ShardKeys
from mooncake_redis.preflight import REQUIRED_POLICY, maxmemory_policy

from .context import Opts, open_existing, safe_url
from .output import emit_json, human, iso, json_option, pct, span, table, text
from .radix import radix_report, radix_status_lines
from .retention import retention_report, status_lines


@click.command()
@json_option
@click.pass_obj
def status(opts: Opts, as_json: bool) -> None:
    """Capacity, usage and objects per shard, mounted segments, store clock, functions version.

    Warns (first lines) when no worker has run on a shard recently, and when the server's
    maxmemory-policy is not noeviction. Sizes in human units (--json: exact bytes).
    Read-only: writes nothing and loads nothing. Exit 1 if there is no store under the namespace."""
    report = _status_report(opts)
    if as_json:
        emit_json("status", report)
    else:
        _print_status(report)


def _status_report(opts: Opts) -> dict:
    """What status shows, as the documented JSON fields (docs/json.md)."""
    master = open_existing(opts)
    try:
        usage = master.usage()
        segments = master.segments()
        stats = master.shard_stats()
        secs, micros = primary_clients(master.redis)[0].time()
        nodes = [master.transport.node_name(s) or None for s in range(master.shards)]
        running = server_library(master.redis)
        retention = master.retention_usage()
        radix = radix_report(master.config.enable_radix_tree, master.radix_stats())
        offload_clients, offload_counters = master.offload_clients(), master.offload_counters()
        gateways = GatewayStore(master).gateways()
        policies = [] if opts.require_url().startswith("memory://") else _policies(master)
        silence_ms = worker_silence_ms(master.config.client_ttl)
    finally:
        master.close()
    clocks = [st.clock_ms for st in stats]
    now = clocks[0] if clocks[0] is not None else secs * 1000 + micros // 1000  # the store clock
    shards = []
    for s, st in zip(usage.shards, stats):
        m = st.worker_figures
        shards.append({
            "shard": s.shard, "node": nodes[s.shard], "capacity_bytes": s.capacity_bytes, "used_bytes": s.used_bytes,
            "objects": s.objects, "puts_in_progress": st.puts_in_progress, "held_extents": st.held_extents,
            "guaranteed_bytes": s.guaranteed_bytes, "guaranteed_limit_bytes": s.guaranteed_limit_bytes,
            "candidates": st.candidates["ordinary"], "soft_pinned_candidates": st.candidates["soft_pinned"],
            "candidates_by_tier": st.candidates,
            # the claim is "<worker id> <until ms>"; ids are bytes on the wire
            "claimed_by": text(st.claim).rsplit(" ", 1)[0] if st.claim else None,
            "last_pass_ms": int(m["last_pass_ms"]) if "last_pass_ms" in m else None,
            **{name: int(m.get(name, 0)) for name in WORKER_TOTALS}})
    return {
        "store": {"url": safe_url(opts.require_url()), "namespace": opts.namespace, "shards": len(shards)},
        "functions": {"library": LIBRARY_NAME, "version": running[0] if running else None,
                      "protocol": running[1] if running else None,
                      "package_version": library_source()[1], "package_protocol": LIBRARY_PROTOCOL},
        "clock": {"now_ms": now, "frozen_shards": [i for i, c in enumerate(clocks) if c is not None],
                  "frozen_values_ms": sorted({c for c in clocks if c is not None})},
        "total": {"capacity_bytes": usage.capacity_bytes, "used_bytes": usage.used_bytes,
                  "objects": usage.objects, "guaranteed_bytes": usage.guaranteed_bytes,
                  "guaranteed_limit_bytes": usage.guaranteed_limit_bytes,
                  "puts_in_progress": sum(s["puts_in_progress"] for s in shards),
                  "held_extents": sum(s["held_extents"] for s in shards)},
        "shards": shards,
        "segments": [{"name": s["name"], "client": s["client"], "size_bytes": s["size"], "used_bytes": s["used"]}
                     for s in sorted(segments, key=lambda s: s["name"])],
        "retention": retention_report(retention),
        "radix": radix,
        "offload": {"counters": offload_counters,
                    "clients": [{"client": c.client, "enabled": c.enabled, "capacity_bytes": c.capacity_bytes,
                                 "used_bytes": c.used_bytes, "inflight_bytes": c.inflight_bytes,
                                 "queued": c.queued, "overflow": c.overflow, "inflight": c.inflight,
                                 "removals": c.removals, "orphaned": c.orphaned}
                                for c in offload_clients]},
        "gateways": gateways,
        "maxmemory_policy": policies,
        "warnings": _warnings(shards, policies, now, silence_ms),
    }


# ---- warnings ------------------------------------------------------------------------------

def worker_silence_ms(client_ttl: int) -> int:
    """How long a shard may go without a worker pass before status warns: a worker passes a few
    times a second; without one, abandoned puts, client expiry and eviction wait."""
    return max(10_000, client_ttl)


def _policies(master) -> list[dict]:
    """maxmemory-policy of every primary (`node`: host:port on a Redis Cluster, else null)."""
    out = []
    for server in primary_clients(master.redis):
        policy, why = maxmemory_policy(server)
        kw = server.connection_pool.connection_kwargs
        node = f"{kw.get('host')}:{kw.get('port')}" if is_cluster(master.redis) else None
        out.append({"node": node, "policy": policy, "unreadable": why or None})
    return out


def _warnings(shards: list[dict], policies: list[dict], now: int, silence_ms: int) -> list[dict]:
    """What an operator should act on (docs/json.md): `kind`, `message` and what it is about."""
    out = []
    silent = [s for s in shards if s["last_pass_ms"] is None or now - s["last_pass_ms"] > silence_ms]
    if silent:
        last = [s["last_pass_ms"] for s in silent]
        when = ("no pass yet" if all(t is None for t in last)
                else f"last pass {span(now - max(t for t in last if t is not None))} ago")
        out.append({"kind": "no_recent_worker", "shards": [s["shard"] for s in silent], "silence_ms": silence_ms,
                    "message": f"no worker has run on shard(s) {', '.join(str(s['shard']) for s in silent)} in the "
                               f"last {span(silence_ms)} ({when}): abandoned puts, client expiry and eviction wait "
                               f"for one; run `mooncake-redis worker` (or `serve`) against this store"})
    for p in policies:
        where = f" on {p['node']}" if p["node"] else ""
        if p["policy"] is None:
            out.append({"kind": "maxmemory_policy_unknown", "node": p["node"], "policy": None,
                        "message": f"cannot read maxmemory-policy{where} ({p['unreadable']}): make sure it is "
                                   f"{REQUIRED_POLICY}, any other policy may delete store keys"})
        elif p["policy"] != REQUIRED_POLICY:
            out.append({"kind": "maxmemory_policy", "node": p["node"], "policy": p["policy"],
                        "message": f"maxmemory-policy {p['policy']}{where}: under memory pressure Redis may delete "
                                   f"store keys and corrupt the store; the store needs {REQUIRED_POLICY} "
                                   f"(CONFIG SET maxmemory-policy {REQUIRED_POLICY}; docs/operations.md#sizing)"})
    return out


# worker metrics (P:metrics fields) that status shows per shard
WORKER_TOTALS = ("evicted_objects_total", "evicted_bytes_total", "discarded_puts_total", "clients_expired_total")


def _print_status(r: dict) -> None:
    out, fn, total = click.echo, r["functions"], r["total"]
    out(f"store      {r['store']['url']}  namespace {r['store']['namespace']}  shards {r['store']['shards']}")
    for w in r["warnings"]:
        out(f"WARNING    {w['message']}")
    readable = {p["policy"] for p in r["maxmemory_policy"] if p["policy"] is not None}
    if readable:
        out(f"server     maxmemory-policy {', '.join(sorted(readable))}")
    local = f"{fn['package_version']} protocol {fn['package_protocol']}"
    if fn["version"] is None:
        out(f"functions  library {LIBRARY_NAME!r} not loaded (this package: {local}; "
            f"the next master call loads it)")
    elif fn["version"] == fn["package_version"]:  # the same build
        out(f"functions  library {LIBRARY_NAME!r} version {local} (same as this package)")
    else:
        out(f"functions  library {LIBRARY_NAME!r} version {fn['version']} protocol {fn['protocol']} "
            f"(this package has {local})")
    frozen, n = r["clock"]["frozen_shards"], r["store"]["shards"]
    values = r["clock"]["frozen_values_ms"]
    if not frozen:
        out("clock      server TIME (not frozen)")
    elif len(frozen) == n and len(values) == 1:
        out(f"clock      FROZEN at {iso(values[0])} ({values[0]} ms) by the test hook "
            f"(the clock field of {ShardKeys(r['store']['namespace'], 0).config.decode()})")
    else:
        out(f"clock      FROZEN on shards {frozen} only (values {values}); "
            f"the other shards read server TIME")
    out(f"usage      {human(total['used_bytes'])} used of {human(total['capacity_bytes'])} "
        f"({pct(total['used_bytes'], total['capacity_bytes'])}), {total['objects']} objects")
    out(f"guaranteed {human(total['guaranteed_bytes'])} of a limit of {human(total['guaranteed_limit_bytes'])} "
        f"({pct(total['guaranteed_bytes'], total['guaranteed_limit_bytes'])})")
    for line in status_lines(r["retention"]):
        out(line)
    for line in radix_status_lines(r["radix"]):
        out(line)
    out("")
    on_cluster = any(s["node"] for s in r["shards"])  # a node column only on a Redis Cluster
    rows = [[s["shard"], *([s["node"]] if on_cluster else []), human(s["capacity_bytes"]), human(s["used_bytes"]),
             pct(s["used_bytes"], s["capacity_bytes"]), s["objects"], s["puts_in_progress"], s["held_extents"]]
            for s in r["shards"]]
    rows.append(["total", *([""] if on_cluster else []), human(total["capacity_bytes"]), human(total["used_bytes"]),
                 pct(total["used_bytes"], total["capacity_bytes"]), total["objects"], total["puts_in_progress"],
                 total["held_extents"]])
    for line in table(["shard", *(["node"] if on_cluster else []), "capacity", "used", "used%", "objects",
                       "in-progress", "held"], rows):
        out(line)
    out("")
    now = r["clock"]["now_ms"]
    rows = [[s["shard"], s["candidates"], s["soft_pinned_candidates"], s["candidates_by_tier"]["retained"],
             s["candidates_by_tier"]["soft_pinned_retained"], s["claimed_by"] or "-",
             span(now - s["last_pass_ms"]) + " ago" if s["last_pass_ms"] is not None else "never",
             s["evicted_objects_total"], human(s["evicted_bytes_total"]), s["discarded_puts_total"],
             s["clients_expired_total"]] for s in r["shards"]]
    out("eviction and workers")
    for line in table(["shard", "candidates", "soft-pinned", "retained", "retained soft-pinned", "claimed by",
                       "last pass", "evicted", "evicted bytes", "discarded puts", "clients expired"], rows, left=6):
        out("  " + line)
    off = r["offload"]
    if off["clients"] or any(off["counters"].values()):
        out("")
        c = off["counters"]
        out(f"offload    enqueued {c['enqueued']}, done {c['done']}, timed out {c['redelivered']}, stale {c['stale']}, "
            f"dropped high/normal/low {c['dropped_high']}/{c['dropped_normal']}/{c['dropped_low']}, "
            f"waited for room {c['deferred']}, orphaned files {c['orphaned']}")
        rows = [[x["client"], "yes" if x["enabled"] else "no", human(x["used_bytes"]),
                 "-" if x["capacity_bytes"] is None else human(x["capacity_bytes"]),
                 "-" if x["capacity_bytes"] is None else pct(x["used_bytes"], x["capacity_bytes"]),
                 x["queued"]["high"], x["queued"]["normal"], x["queued"]["low"], x["overflow"],
                 f"{x['inflight']} ({human(x['inflight_bytes'])})", x["removals"], x["orphaned"]]
                for x in off["clients"]]
        for line in table(["disk client", "offloading", "used", "capacity", "used%", "high", "normal", "low",
                           "overflow", "in flight", "removals", "orphaned"], rows, left=2):
            out("  " + line)
    out("")
    out(f"gateways   {len(r['gateways'])} serving (Mooncake's master protocol)")
    for g in r["gateways"]:
        out(f"  {g['id']}  rpc {g['rpc']}  metadata {g['metadata'] or 'off'}")
    out(f"segments   {len(r['segments'])} mounted")
    if r["segments"]:
        rows = [[s["name"], s["client"], human(s["size_bytes"]), human(s["used_bytes"]),
                 pct(s["used_bytes"], s["size_bytes"])] for s in r["segments"]]
        for line in table(["name", "client", "size", "used", "used%"], rows, left=2):
            out("  " + line)

