"""Grouped radix keys (lua/lib/30_units.lua): a key put with a group id under the radix index
has its node as its unit and is an indexed member of its group. Its group's P:agg:indexed (the
members) and P:agg:nodes (node -> members there), each node's P:agg:groups (group -> its keys
in it) and the node record's grouped = 1 must agree with the objects' `ugroup` and `node`
fields, read in one snapshot per group; the nodes' tiers, with the retention they take from
these groups, are audited with the radix nodes (groups.py, mc_unit_state). Repaired by
mc_fsck_indexed (re-derived from the objects inside the call, the nodes re-placed)."""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from ..layout import node_of
from .base import ERROR, Action, Checker, Finding, Kind, ObjectRead, _d, _Pass
from .objects import snapshot

INDEXED_MAX = 4096  # keys one snapshot / mc_fsck_indexed call may cover (its cap)


@dataclass(frozen=True)
class Indexed(Action):
    """Re-derive a group's indexed membership from the given keys and nodes (mc_fsck_indexed)."""
    tenant: bytes
    group: bytes
    members: tuple
    nodes: tuple
    order = 2  # after the groups' and nodes' own repairs

    def apply(self, audit: Any) -> tuple[bool, str]:
        audit.fcall("mc_fsck_indexed", self.shard, self.tenant, self.group, len(self.members), *self.members,
                    *self.nodes)
        return True, ""


KINDS: dict[str, Kind] = {
    "indexed_members": Kind(ERROR, True, "a group's radix-indexed members (P:agg:indexed) differ from the objects "
                                         "that name it in `ugroup`"),
    "indexed_nodes": Kind(ERROR, True, "a group's nodes (P:agg:nodes) or a node's groups (P:agg:groups) differ "
                                       "from its indexed members' nodes, or such a node's record lacks grouped = 1"),
}


class IndexedMembers(Checker):
    name = "indexed"
    kinds = KINDS
    actions = (Indexed,)

    def begin(self, audit: Any, ps: _Pass) -> None:
        ps.indexed.clear()

    def see_object(self, audit: Any, ps: _Pass, obj: ObjectRead) -> None:
        h = obj.h
        if isinstance(h, Exception) or h.get(b"ugroup") is None:
            return
        node = h.get(b"node")
        ps.indexed[(obj.tenant, h[b"ugroup"])][obj.key] = node_of(obj.key, node) if node is not None else None

    def shard(self, audit: Any, shard: int, ps: _Pass) -> list[Finding]:
        k = audit.keys(shard)
        groups: dict[tuple[bytes, bytes], set] = defaultdict(set)  # (tenant, group) -> nodes named
        for tg, keys in ps.indexed.items():
            groups[tg] |= {n for n in keys.values() if n}
        for kind in (b"indexed", b"nodes"):
            prefix = k.aggregate(kind, b"g:")
            for key in audit.scan(shard, prefix + b"*"):
                tenant, _, group = key[len(prefix):].partition(b":")
                if group:
                    groups[(tenant, group)]
        prefix = k.aggregate(b"groups", b"r:")
        for key in audit.scan(shard, prefix + b"*"):
            tenant, _, node = key[len(prefix):].partition(b":")
            for group in audit.r.zrange(key, 0, -1):
                groups[(tenant, group)].add(node)
        findings: list[Finding] = []
        for (tenant, group), nodes in sorted(groups.items()):
            findings += check_indexed(audit, shard, tenant, group, set(ps.indexed.get((tenant, group), {})), nodes)
        return findings


def check_indexed(audit: Any, shard: int, tenant: bytes, group: bytes, keys: set, nodes: set) -> list[Finding]:
    k = audit.keys(shard)
    unit = b"g:" + tenant + b":" + group
    ikey, nkey = k.aggregate(b"indexed", unit), k.aggregate(b"nodes", unit)
    subject = _d(tenant + b":" + group)
    cand = sorted(keys | set(audit.r.zrange(ikey, 0, -1)))
    nodes = nodes | set(audit.r.zrange(nkey, 0, -1))
    if len(cand) > INDEXED_MAX:
        audit.unverify(shard, f"group {subject} has more than {INDEXED_MAX} indexed members: not checked")
        return []
    order = sorted(nodes)

    def fill(pipe: Any) -> None:
        pipe.zrange(ikey, 0, -1)
        pipe.zrange(nkey, 0, -1, withscores=True)
        for node in order:
            pipe.zscore(k.aggregate(b"groups", b"r:" + tenant + b":" + node), group)
        for node in order:
            pipe.hget(k.radix_node(tenant, node), "grouped")
        for key in cand:
            pipe.hmget(k.object(tenant, key), "ugroup", "node")

    res = snapshot(audit, shard, fill)
    for x in res:
        if isinstance(x, Exception):
            raise x
    stored, stored_nodes = set(res[0]), {n: int(s) for n, s in res[1]}
    node_side = {n: int(s) for n, s in zip(order, res[2:2 + len(order)]) if s is not None}
    flagged = {n for n, f in zip(order, res[2 + len(order):2 + 2 * len(order)]) if f == b"1"}
    rows = [[row[0], row[1] and node_of(key, row[1])] for key, row in zip(cand, res[2 + 2 * len(order):])]
    members = {key: row[1] for key, row in zip(cand, rows) if row[0] == group and row[1]}
    want = dict(Counter(members.values()))
    action = Indexed(shard, tenant, group, tuple(sorted(members)), tuple(sorted(nodes)))
    out: list[Finding] = []
    if set(members) != stored:
        out.append(audit.finding("indexed_members", shard, f"group {subject}", f"{len(members)} indexed members",
                                 f"{len(stored)}" if len(stored) != len(members) else "other keys", action))
    if want != stored_nodes or want != node_side or not set(want) <= flagged:
        out.append(audit.finding("indexed_nodes", shard, f"group {subject}", f"nodes {sorted(want.items())}",
                                 f"P:agg:nodes {sorted(stored_nodes.items())}, P:agg:groups "
                                 f"{sorted(node_side.items())}", action))
    return out
