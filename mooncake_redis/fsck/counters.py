"""The shard's counters (hash P): used_bytes, capacity_bytes, objects, guaranteed_bytes and
offload_evict_bytes against what the pass recomputed (the segments' used bytes and sizes, the
object hashes read, the live replicas of guaranteed objects, the sizes of the objects eviction
queued for offload). Read at the end of the pass, with its fingerprint;
repaired by compare-and-add (mc_fsck_counters), refused when a counter moved meanwhile. A
counter stored malformed (not an integer: mooncake_redis.figures) is set to the recomputed value
instead (mc_fsck_figures, compare-and-set on the malformed value). Every other field of P is a
figure the functions count with (offload counters, sequences, the client watch's clocks): one
stored malformed is reported (bad_figure), not repaired, since nothing derives it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..figures import parse
from .base import ERROR, WARNING, Action, Checker, Finding, Kind, SetFigures, _d, _malformed, _Pass

FIELDS = ("used_bytes", "capacity_bytes", "objects", "guaranteed_bytes", "offload_evict_bytes")
BY_SEGMENTS = ("used_bytes", "capacity_bytes", "guaranteed_bytes")  # recomputed from the segments


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
    "shard_offload_evict_bytes": Kind(ERROR, True, "P.offload_evict_bytes differs from the sizes of the objects "
                                                   "eviction queued for offload (offload_evict)"),
    "bad_figure": Kind(ERROR, False, "a field of P that is not an integer (an offload counter, a sequence, a clock): "
                                     "the functions that count with it fail; nothing derives it, set it by hand"),
    "bad_worker_figure": Kind(WARNING, False, "a figure of the workers' P:metrics that is not an integer: a worker's "
                                              "publication of its pass fails; set it by hand (a counter may restart "
                                              "at 0)"),
}
WORKER_TEXT_FIELDS = (b"last_worker",)  # the P:metrics fields that are not figures


class ShardCounters(Checker):
    name = "counters"
    kinds = KINDS
    actions = (Counters, SetFigures)

    def fingerprint(self, audit: Any, k: Any) -> tuple:
        return tuple(audit.r.hmget(k.P, *FIELDS))

    def settle(self, audit: Any, ps: _Pass, fp: tuple) -> None:
        """fp holds the counters as read at the end of the pass."""
        guaranteed_total = sum(v for (seg, _), v in ps.guaranteed.items() if seg == b"")
        drift = []  # (field, value read or None when malformed, raw, recomputed)
        recomputed = (ps.used_total, ps.cap_total, ps.objects, guaranteed_total, ps.offload_evict_bytes)
        for raw, fname, want in zip(fp, FIELDS, recomputed):
            have = parse(raw)
            if have != want:
                drift.append((fname, have, raw, want))
        # a malformed segment record is left out of the recomputed figures: they are not repaired
        held = {f for f, *_ in drift if ps.bad_segments and f in BY_SEGMENTS}
        triples = tuple((f, have, want - have) for f, have, _, want in drift if have is not None and f not in held)
        quads = tuple((b"", f, raw, want) for f, have, raw, want in drift if have is None and f not in held)
        add = Counters(ps.shard, triples) if triples else None
        put = SetFigures(ps.shard, quads) if quads else None
        for fname, have, raw, want in drift:
            finding = audit.finding(f"shard_{fname}", ps.shard, f"P.{fname}", want,
                                    _malformed(raw) if have is None else have, put if have is None else add)
            if fname in held:
                finding.refuse(f"not repaired: segment record(s) {', '.join(sorted(map(_d, ps.bad_segments)))} "
                               "malformed (bad_segment), so the recomputed figure leaves them out")
            ps.aggregate.append(finding)

    def shard(self, audit: Any, shard: int, ps: _Pass) -> list[Finding]:
        """The other fields of P and the workers' P:metrics figures: each must be an integer (a
        repair of the counters is settle's)."""
        k = audit.keys(shard)
        out = []
        for name, raw in sorted(audit.r.hgetall(k.P).items()):
            if name.decode(errors="replace") not in FIELDS and parse(raw) is None:
                out.append(audit.finding("bad_figure", shard, f"P.{_d(name)}", "an integer", _malformed(raw)))
        for name, raw in sorted(audit.r.hgetall(k.metrics).items()):
            if name not in WORKER_TEXT_FIELDS and parse(raw) is None:
                out.append(audit.finding("bad_worker_figure", shard, f"P:metrics.{_d(name)}", "an integer",
                                         _malformed(raw)))
        return out
