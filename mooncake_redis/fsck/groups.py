"""Groups and radix nodes (composite units): the member set, the counters (members, processing,
hard_pinned, task_refs), the member soft-pin and guarantee aggregates and the unit's tier
against the members' objects, all from one atomic snapshot per group. A radix node's keys are
audited the same way, as the group RADIX_MARK + <hash> (unit r:<tenant>:<hash>). Repaired by
mc_fsck_group (re-derived from the members inside the call), then mc_fsck_retention."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..keys import CLOCK_FIELD
from ..layout import in_progress, node_of
from .base import (
    _UNIT_RE,
    ERROR,
    RADIX_MARK,
    Action,
    Checker,
    Finding,
    Kind,
    ObjectRead,
    _d,
    _int,
    _Pass,
)
from .objects import compare_unit, snapshot

GROUP_MAX_MEMBERS = 4096    # members one group snapshot / mc_fsck_group call may cover (Lua cap: 10000)


@dataclass(frozen=True)
class Group(Action):
    """Re-derive a group (or a radix node's keys) from the given members: mc_fsck_group, then the
    group's retention index entry (mc_fsck_retention)."""
    tenant: bytes
    group: bytes
    members: tuple
    order = 1

    def apply(self, audit: Any) -> tuple[bool, str]:
        audit.fcall("mc_fsck_group", self.shard, self.tenant, self.group, GROUP_MAX_MEMBERS, *self.members)
        if not self.group.startswith(RADIX_MARK):
            audit.fcall("mc_fsck_retention", self.shard, self.tenant, self.group)
        return True, ""


KINDS: dict[str, Kind] = {
    "group_member_missing": Kind(ERROR, True, "an object names a group but is not in its member set"),
    "group_member_stray": Kind(ERROR, True, "a group member set holds a key whose object is missing or elsewhere"),
    "group_counters": Kind(ERROR, True, "members / processing / hard_pinned / task_refs differ from the members' "
                                        "objects"),
    "group_soft_pin": Kind(ERROR, True, "the group's member soft pins (P:agg:soft_pin:<unit>) differ from its "
                                        "complete members'"),
    "group_guarantee": Kind(ERROR, True, "the group's member guarantees (P:agg:guarantee:<unit>) differ from its "
                                         "members'"),
    "unit_memo": Kind(ERROR, True, "a composite unit has an index entry its record's memo (at) does not list"),
}


class Groups(Checker):
    name = "groups"
    kinds = KINDS
    actions = (Group,)

    def see_object(self, audit: Any, ps: _Pass, obj: ObjectRead) -> None:
        h = obj.h
        if isinstance(h, Exception):
            return
        group = h.get(b"group")
        if group is None and h.get(b"node") is not None:
            group = RADIX_MARK + node_of(obj.key, h[b"node"])
        if group is not None:
            ps.groups[(obj.tenant, group)].add(obj.key)

    def shard(self, audit: Any, shard: int, ps: _Pass) -> list[Finding]:
        """Every group an object, a group key or a unit names."""
        groups = dict(ps.groups)
        for tg in group_keys(audit, shard):
            groups.setdefault(tg, set())
        for unit in ps.units:
            m = _UNIT_RE.match(unit)
            if m and m.group(1) == b"g":
                groups.setdefault((m.group(2), m.group(3)), set())
            elif m and m.group(1) == b"r":
                groups.setdefault((m.group(2), RADIX_MARK + m.group(3)), set())
        findings: list[Finding] = []
        for (tenant, group), keys in sorted(groups.items()):
            findings += check_group(audit, shard, tenant, group, keys)
        return findings


def check_group(audit: Any, shard: int, tenant: bytes, group: bytes, keys: set) -> list[Finding]:
    sk = audit.keys(shard)
    gkey, mkey = sk.group(tenant, group), sk.group_members(tenant, group)
    unit = b"g:" + tenant + b":" + group
    member_field, member_value = "group", group
    node = None
    if group.startswith(RADIX_MARK):  # a radix node's keys: the same composite unit
        node = group[len(RADIX_MARK):]
        gkey, mkey, unit = sk.radix_node(tenant, node), sk.radix_keys(tenant, node), b"r:" + tenant + b":" + node
        member_field, member_value = "node", node

    def read_members(pipe: Any) -> None:
        """The member set's keys: a radix node's from the functions (its set holds them with the
        node's hash taken out, lua/lib/20_object.lua), a group's as they are."""
        if node is None:
            pipe.smembers(mkey)
        else:
            pipe.execute_command("FCALL_RO", "mc_radix_nodes", 1, sk.P, 1, "tenant", tenant, 1, "node", node)

    def keys_in(reply: Any) -> set:
        return set(reply) if node is None else set(reply[0][0])

    subject = _d(tenant + b":" + group)
    # (a node's keys are fields of its record, schema 7: its length bounds them; the set an older
    # layout left counts too)
    listed_n = audit.r.scard(mkey) + (audit.r.hlen(gkey) if node is not None else 0)
    if listed_n + len(keys) > GROUP_MAX_MEMBERS:
        audit.unverify(shard, f"group {subject} has more than {GROUP_MAX_MEMBERS} candidate members: not checked")
        return []
    listed = snapshot(audit, shard, read_members)[0]
    if isinstance(listed, Exception):
        raise listed
    cand = set(keys) | keys_in(listed)
    for _ in range(4):
        order = sorted(cand)

        def fill(pipe: Any) -> None:
            pipe.hget(sk.config, CLOCK_FIELD)
            pipe.time()
            pipe.hgetall(gkey)
            read_members(pipe)
            pipe.execute_command("FCALL_RO", "mc_unit_state", 1, sk.P, unit)
            pipe.zrange(sk.aggregate(b"soft_pin", unit), 0, -1, withscores=True)
            pipe.zrange(sk.aggregate(b"guarantee", unit), 0, -1, withscores=True)
            pipe.execute_command("FCALL_RO", "mc_fsck_sweep_due", 1, sk.P, unit)
            for key in order:
                pipe.hmget(sk.object(tenant, key), member_field, "status", "hard_pin", "soft_pin_until",
                           "task_refs", "guaranteed_until")

        res = snapshot(audit, shard, fill)
        for x in res:
            if isinstance(x, Exception):
                raise x
        if keys_in(res[3]) <= cand:
            break
        cand |= keys_in(res[3])
    now, g, mset, st, agg, g_agg = audit.clock(res), res[2], keys_in(res[3]), res[4], res[5], res[6]
    due, rows = res[7][0] == 1, res[8:]
    if node is not None:  # the field says where the node's hash sits in the key
        rows = [[row[0] and node_of(key, row[0]), *row[1:]] for key, row in zip(order, rows)]
    members = {k: row for k, row in zip(order, rows) if row[0] == member_value}
    action = Group(shard, tenant, group, tuple(sorted(members)))
    out: list[Finding] = []
    for k in sorted(set(members) - mset):
        out.append(audit.finding("group_member_missing", shard, f"group {subject} member {_d(k)}",
                                "in the member set", "absent", action))
    row_of = dict(zip(order, rows))
    for k in sorted(mset - set(members)):
        row = row_of.get(k, [None] * 6)
        why = ("object missing" if row[0] is None and row[1] is None else
               "object has no group" if row[0] is None else f"object in group {_d(row[0])}")
        out.append(audit.finding("group_member_stray", shard, f"group {subject} member {_d(k)}",
                                "not in the member set", f"in it ({why})", action))
    n = len(members)
    proc = sum(1 for r in members.values() if in_progress(r[1]))
    hard = sum(1 for r in members.values() if r[2] == b"1")
    refs = sum(_int(r[4]) or 0 for r in members.values())
    have = tuple(_int(g.get(f)) or 0 for f in (b"members", b"processing", b"hard_pinned", b"task_refs"))
    if have != (n, proc, hard, refs):
        out.append(audit.finding("group_counters", shard, f"group {subject}",
                                f"members={n} processing={proc} hard_pinned={hard} task_refs={refs}",
                                "members={} processing={} hard_pinned={} task_refs={}".format(*have), action))
    pins = {k: _int(r[3]) for k, r in members.items() if not in_progress(r[1]) and (_int(r[3]) or 0) > 0}
    stored = {k: int(v) for k, v in agg}
    if pins != stored and g.get(b"draining") != b"1":  # a draining group's zset goes with it
        out.append(audit.finding("group_soft_pin", shard, f"group {subject}", f"{len(pins)} member soft pins",
                                f"{len(stored)} entries" if len(stored) != len(pins) else "other values", action))
    guarantees = {k: _int(r[5]) for k, r in members.items() if r[5] is not None}
    if guarantees != {k: int(v) for k, v in g_agg} and g.get(b"draining") != b"1":
        out.append(audit.finding("group_guarantee", shard, f"group {subject}", f"{len(guarantees)} member guarantees",
                                f"{len(g_agg)} entries" if len(g_agg) != len(guarantees) else "other values", action))
    if not isinstance(st, Exception) and len(st) > 6 and st[6] == 1:  # the functions say so (mc_unit_state)
        out.append(audit.finding("unit_memo", shard, f"group {subject}", "entries within the memo",
                                 "an entry outside it", action))
    return out + compare_unit(audit, shard, unit, st, due, now, action)

def group_keys(audit: Any, shard: int) -> set[tuple[bytes, bytes]]:
    k = audit.keys(shard)
    out = set()
    families = [(k.prefix("group"), b""), (k.prefix("group_members"), b"")]
    if audit.radix_present(shard):
        families += [(k.prefix("radix_node"), RADIX_MARK), (k.prefix("radix_keys"), RADIX_MARK)]
    for prefix, mark in families:
        for key in audit.scan(shard, prefix + b"*"):
            tenant, _, group = key[len(prefix):].partition(b":")
            if group:
                out.add((tenant, mark + group))
    return out
