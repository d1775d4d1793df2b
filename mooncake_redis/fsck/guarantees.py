"""Guarantees (explicit context caching): the guaranteed bytes of each tenant, on the shard
(P:gtenants) and on each segment (its g:<tenant> fields), against the live replicas of the
tenant's guaranteed objects, and the prefix sets (P:gpfx:<tenant>:<prefix>) against the
guaranteed objects of each prefix. The per-object P:guaranteed entry is checked with the object
(objects.py); the shard's total is a shard counter (counters.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..figures import parse
from .base import ERROR, WARNING, Action, Checker, Kind, ObjectRead, SetFigures, _d, _malformed, _Pass
from .objects import Place


@dataclass(frozen=True)
class Guaranteed(Action):
    """Compare-and-add of guaranteed-bytes counts (mc_fsck_guaranteed): (segment or b"" for the
    tenant's shard total, tenant, value read, delta) quadruples."""
    quads: tuple
    order = 4

    def apply(self, audit: Any) -> tuple[bool, str]:
        replies = audit.fcall("mc_fsck_guaranteed", self.shard, *(x for q in self.quads for x in q))
        if not all(r[0] for r in replies):
            return False, "not repaired: a guaranteed-bytes count moved since fsck read it; rerun fsck"
        return True, ""


KINDS: dict[str, Kind] = {
    "tenant_guaranteed_bytes": Kind(ERROR, True, "a tenant's P:gtenants entry differs from its guaranteed objects' "
                                                 "live replicas"),
    "segment_guaranteed_bytes": Kind(ERROR, True, "a segment's g:<tenant> field differs from the tenant's guaranteed "
                                                  "replicas on it"),
    "guarantee_prefix_missing": Kind(ERROR, True, "a guaranteed object is missing from its prefix's P:gpfx set"),
    "guarantee_prefix_stray": Kind(WARNING, True, "a P:gpfx set holds a key that is not a guaranteed object of that "
                                                  "prefix"),
}


class Guarantees(Checker):
    name = "guarantees"
    kinds = KINDS
    actions = (Guaranteed, SetFigures)

    def fingerprint(self, audit: Any, k: Any) -> tuple:
        return (audit.r.zcard(k.guaranteed),)

    def see_object(self, audit: Any, ps: _Pass, obj: ObjectRead) -> None:
        h = obj.h
        if not isinstance(h, Exception) and b"guaranteed_until" in h:
            ps.guarantee_prefix[(obj.tenant, h.get(b"prefix", obj.key))].add(obj.key)

    def end(self, audit: Any, ps: _Pass) -> None:
        check_books(audit, ps)


def check_books(audit: Any, ps: _Pass) -> None:
    shard, segs = ps.shard, ps.segs
    k = audit.keys(shard)
    stored: dict[tuple[bytes, bytes], bytes] = {(b"", t): v for t, v in audit.r.hgetall(k.guaranteed_tenants).items()}
    for name, seg in segs.items():
        stored.update({(name, t): v for t, v in seg.guaranteed.items()})
    quads, malformed = [], []
    for where in sorted(set(stored) | set(ps.guaranteed)):
        want, found = ps.guaranteed.get(where, 0), parse(stored.get(where))
        if found is None:  # not a number: set to the recomputed value
            malformed.append((b"gtenants" if where[0] == b"" else b"seg:" + where[0],
                              where[1] if where[0] == b"" else b"g:" + where[1], stored[where], want, where))
        elif want != found:
            quads.append((where[0], where[1], found, want - found))
    held = bool(ps.bad_segments)  # the tenants' totals leave out the replicas on malformed segment records
    action = Guaranteed(shard, tuple(q for q in quads if not (held and q[0] == b""))) if quads else None
    put = SetFigures(shard, tuple(m[:4] for m in malformed if not (held and m[4][0] == b""))) if malformed else None
    rows: list[tuple[bytes, bytes, int, Any, Action | None]] = [
        (seg, tenant, found + delta, found, action) for seg, tenant, found, delta in quads]
    rows += [(where[0], where[1], want, _malformed(raw), put) for _, _, raw, want, where in malformed]
    for seg, tenant, want, found, act in sorted(rows, key=lambda r: (r[0], r[1])):
        kind, subject = (("tenant_guaranteed_bytes", f"P:gtenants {_d(tenant)}") if seg == b"" else
                         ("segment_guaranteed_bytes", f"segment {_d(seg)} g:{_d(tenant)}"))
        finding = audit.finding(kind, shard, subject, want, found, act)
        if held and seg == b"":
            finding.refuse("not repaired: a segment record is malformed (bad_segment), so the recomputed figure "
                           "leaves its replicas out")
        ps.aggregate.append(finding)
    prefix = k.prefix("guarantee_prefix")
    seen: dict[tuple[bytes, bytes], set] = {}
    for set_key in audit.scan(shard, prefix + b"*"):
        tenant, _, pfx = set_key[len(prefix):].partition(b":")
        seen[(tenant, pfx)] = set(audit.r.smembers(set_key))
    for (tenant, pfx) in sorted(set(seen) | set(ps.guarantee_prefix)):
        want, listed = ps.guarantee_prefix.get((tenant, pfx), set()), seen.get((tenant, pfx), set())
        for key in sorted(want - listed):
            ps.aggregate.append(audit.finding("guarantee_prefix_missing", shard, _d(tenant + b":" + key),
                                             f"in P:gpfx {_d(pfx)}", "absent", Place(shard, tenant, key)))
        for key in sorted(listed - want):
            ps.aggregate.append(audit.finding("guarantee_prefix_stray", shard, _d(tenant + b":" + key),
                                             f"not in P:gpfx {_d(pfx)}", "present", Place(shard, tenant, key, pfx)))
