"""The CLI's radix index parts: status's radix report and lines, and the `inspect --node` view
(used by cli/status.py and cli/inspect.py)."""
from __future__ import annotations

from mooncake_redis.radix import RadixNodeInfo, RadixShardStats


def radix_report(enabled: bool, stats: list[RadixShardStats]) -> dict:
    """status's `radix` object (docs/json.md)."""
    return {"enabled": enabled, "nodes": sum(s.nodes for s in stats), "shells": sum(s.shells for s in stats),
            "leaves": sum(s.leaves for s in stats), "outbox": sum(s.outbox for s in stats),
            "shards": [{"shard": s.shard, "nodes": s.nodes, "shells": s.shells, "leaves": s.leaves,
                        "outbox": s.outbox} for s in stats]}


def radix_status_lines(r: dict) -> list[str]:
    lines = [f"radix      {'on' if r['enabled'] else 'off'}: {r['nodes']} node(s), {r['shells']} shell(s), "
             f"{r['leaves']} leaf/leaves, {r['outbox']} outbox entr(y/ies)"]
    if r["nodes"] or r["outbox"]:
        for s in r["shards"]:
            lines.append(f"  shard {s['shard']}: {s['nodes']} nodes, {s['shells']} shells, {s['leaves']} leaves, "
                         f"{s['outbox']} outbox")
    return lines


def node_report(info: RadixNodeInfo) -> dict:
    """inspect --node's JSON fields (docs/json.md)."""
    d = lambda b: b.decode(errors="replace")  # noqa: E731
    return {"node": d(info.prefix_hash), "tenant": info.tenant_id, "found": True, "shard": info.shard,
            "parent": d(info.parent) if info.parent else None, "children": [d(c) for c in info.children],
            "keys": [d(k) for k in info.keys], "shell": info.shell, "created_ms": info.created_ms,
            "link_pending": info.link_pending, "why": info.why}


def node_lines(r: dict) -> list[str]:
    why = r["why"] or "evictable (a leaf with no protection)"
    lines = [f"node         {r['node']}", f"tenant       {r['tenant']}", f"shard        {r['shard']}",
             f"parent       {r['parent'] or 'none (a root)'}"
             + ("  (link still in the outbox)" if r["link_pending"] else ""),
             f"state        {'shell (no keys)' if r['shell'] else 'has keys'}; eviction: {why}",
             f"children     {len(r['children'])}"]
    lines += [f"  {c}" for c in r["children"]]
    lines.append(f"keys         {len(r['keys'])}")
    lines += [f"  {k}" for k in r["keys"]]
    return lines
