"""fsck of group retention's counts: P:retained_tenants (tenant -> retention records on the
shard) must equal the number of P:deadline:retention entries of each tenant. The index entries
themselves are checked per group against the records (mc_unit_state reports them; see
objects.compare_unit), and repaired with mc_fsck_retention (after mc_fsck_group).

The index can hold a shard's whole share of max_retained_groups, so it is read with ZSCAN and
the counts are trusted only when the index size and the counts hash read before and after the
scan agree; repairs are compare-and-set (mc_fsck_retention_counts)."""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from .base import ERROR, Action, Checker, Finding, Kind, _Pass

_UNIT_RE = re.compile(rb"^g:([A-Za-z0-9_.\-]{1,64}):(.+)$", re.S)
SCAN_COUNT = 1000
TRIPLES_PER_CALL = 16


@dataclass(frozen=True)
class RetentionCounts(Action):
    """(tenant, value read, count) triples for mc_fsck_retention_counts (compare-and-set)."""
    triples: tuple
    order = 2

    def apply(self, audit: Any) -> tuple[bool, str]:
        replies = audit.fcall("mc_fsck_retention_counts", self.shard, *(x for t in self.triples for x in t))
        if not all(r[0] for r in replies):
            return False, "not repaired: a count moved since fsck read it; rerun fsck"
        return True, ""


KINDS: dict[str, Kind] = {
    "retention_counts": Kind(ERROR, True, "P:retained_tenants differs from the tenant's P:deadline:retention entries"),
}


class Retention(Checker):
    name = "retention"
    kinds = KINDS
    actions = (RetentionCounts,)

    def shard(self, audit: Any, shard: int, ps: _Pass) -> list[Finding]:
        return retention_count_findings(audit, shard)


def retention_count_findings(audit: Any, shard: int) -> list[Finding]:
    """Findings of kind retention_counts for one shard (none when the shard moved meanwhile:
    then the shard is marked unverified)."""
    k = audit.keys(shard)
    r = audit.r

    def state() -> tuple:
        pipe = audit.t.pipeline(shard)
        pipe.zcard(k.deadline_retention)
        pipe.hgetall(k.retained_tenants)
        return tuple(pipe.execute())

    before = state()
    counted: Counter = Counter()
    for unit, _ in r.zscan_iter(k.deadline_retention, count=SCAN_COUNT):
        m = _UNIT_RE.match(unit)
        if m:
            counted[m.group(1)] += 1
    after = state()
    if before[0] != after[0] or before[1] != after[1]:
        audit.unverify(shard, "retention records changed during the count check (rerun fsck)")
        return []
    stored = {t: int(v) if v.isdigit() else -1 for t, v in after[1].items()}
    out = []
    wrong = sorted(t for t in set(stored) | set(counted) if stored.get(t, 0) != counted.get(t, 0))
    for i in range(0, len(wrong), TRIPLES_PER_CALL):
        part = wrong[i:i + TRIPLES_PER_CALL]
        action = RetentionCounts(shard, tuple((t, max(stored.get(t, 0), 0), counted.get(t, 0)) for t in part))
        for t in part:
            out.append(audit.finding("retention_counts", shard, f"P:retained_tenants {t.decode(errors='replace')}",
                                     counted.get(t, 0), after[1].get(t, b"absent").decode(errors="replace"),
                                     action if stored.get(t, 0) >= 0 else None))
    return out

