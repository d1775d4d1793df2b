"""The shard's counters (hash P): used_bytes, capacity_bytes, objects and guaranteed_bytes
against what the pass recomputed (the segments' used bytes and sizes, the object hashes read,
the live replicas of guaranteed objects). Read at the end of the pass, with its fingerprint;
repaired by compare-and-add (mc_fsck_counters), refused when a counter moved meanwhile."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .base import ERROR, Action, Checker, Kind, _int, _Pass

FIELDS = ("used_bytes", "capacity_bytes", "objects", "guaranteed_bytes")


@dataclass(frozen=True)
class Counters(Action):
    """(field, value read, delta) triples for mc_fsck_counters."""
    triples: tuple
    order = 4

    def apply(self, audit: Any) -> tuple[bool, str]:
        replies = audit.fcall("mc_fsck_counters", self.shard, *(x for t in self.triples for x in t))
        if not all(r[0] for r in replies):
            return False, "not repaired: a counter moved since fsck read it; rerun fsck"
        return True, ""


KINDS: dict[str, Kind] = {
    "shard_used_bytes": Kind(ERROR, True, "P.used_bytes differs from the sum of the segments' recomputed used bytes"),
    "shard_capacity_bytes": Kind(ERROR, True, "P.capacity_bytes differs from the sum of the mounted segments' sizes"),
    "shard_objects": Kind(ERROR, True, "P.objects differs from the number of object hashes"),
    "shard_guaranteed_bytes": Kind(ERROR, True, "P.guaranteed_bytes differs from the live replicas of guaranteed "
                                                "objects"),
}


class ShardCounters(Checker):
    name = "counters"
    kinds = KINDS
    actions = (Counters,)

    def fingerprint(self, audit: Any, k: Any) -> tuple:
        return tuple(audit.r.hmget(k.P, *FIELDS))

    def settle(self, audit: Any, ps: _Pass, fp: tuple) -> None:
        """fp holds the counters as read at the end of the pass."""
        guaranteed_total = sum(v for (seg, _), v in ps.guaranteed.items() if seg == b"")
        triples = []
        for i, (fname, want) in enumerate(zip(FIELDS, (ps.used_total, ps.cap_total, ps.objects, guaranteed_total))):
            have = _int(fp[i]) or 0
            if have != want:
                triples.append((fname, have, want - have))
        action = Counters(ps.shard, tuple(triples)) if triples else None
        for fname, have, delta in triples:
            ps.aggregate.append(audit.finding(f"shard_{fname}", ps.shard, f"P.{fname}", have + delta, have, action))
