"""Segments: each mounted segment's record (P:seg:<name>: base, size, used, mount) and its
P:segs score against the extents allocated in it (live replicas, held extents), the index
against the records, and free lists left by segments that are gone. The allocator's tiling of
each segment is allocator.py's; the shard's used and capacity totals are counters.py's."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..figures import parse
from ..keys import HELD_DUE_FIELD
from . import allocator
from .base import (
    _HELD_RE,
    ERROR,
    WARNING,
    Action,
    Checker,
    Finding,
    Kind,
    SetFigures,
    _d,
    _malformed,
    _Pass,
    _score,
    _Seg,
)


@dataclass(frozen=True)
class SegmentUsed(Action):
    """Compare-and-add on P:seg:<segment>.used, then the P:segs score rewritten from the record
    (mc_fsck_segment_used)."""
    segment: bytes
    used: int
    delta: int
    order = 2

    def apply(self, audit: Any) -> tuple[bool, str]:
        applied, used, _ = audit.fcall("mc_fsck_segment_used", self.shard, self.segment, self.used, self.delta)
        if not applied:
            return False, f"not repaired: used moved to {used} since fsck read it; rerun fsck"
        return True, ""


@dataclass(frozen=True)
class HeldBound(Action):
    """Rewrite P:config's held_due from P:held (mc_fsck_held_due)."""
    order = 2

    def apply(self, audit: Any) -> tuple[bool, str]:
        audit.fcall("mc_fsck_held_due", self.shard)
        return True, ""


@dataclass(frozen=True)
class Forget(Action):
    """Drop a segment that is not mounted from P:segs, with its free lists (mc_fsck_forget_segment)."""
    segment: bytes
    order = 2

    def apply(self, audit: Any) -> tuple[bool, str]:
        audit.fcall("mc_fsck_forget_segment", self.shard, self.segment)
        return True, ""


KINDS: dict[str, Kind] = {
    "segment_used": Kind(ERROR, True, "P:seg:<name>.used differs from live replicas + held extents (or is "
                                      "malformed)"),
    "segment_free": Kind(ERROR, True, "the P:segs score differs from size - recomputed used"),
    "segment_not_indexed": Kind(ERROR, True, "a mounted segment is missing from P:segs"),
    "segment_stale_index": Kind(ERROR, True, "P:segs names a segment that is not mounted"),
    "orphan_free_list": Kind(WARNING, True, "free lists of a segment that is not mounted"),
    "bad_segment": Kind(ERROR, False, "a segment hash without a valid base, size or mount (its replicas are not "
                                      "judged, and the shard counters it is part of are not repaired)"),
    "bad_held": Kind(ERROR, False, "a P:held entry that is not '<mount> <offset> <size> <segment>'"),
    "held_bound": Kind(ERROR, True, "P:config held_due is after the first P:held deadline (or malformed): put_start "
                                    "would not release that extent when it is due"),
    **allocator.KINDS,
}


class Segments(Checker):
    name = "segments"
    kinds = KINDS
    actions = (SegmentUsed, HeldBound, Forget, allocator.Rebuild)

    def fingerprint(self, audit: Any, k: Any) -> tuple:
        pipe = audit.t.pipeline(k.shard)
        pipe.get(k.mount_seq)
        pipe.zcard(k.held)
        pipe.zcard(k.segments)
        return tuple(pipe.execute())

    def begin(self, audit: Any, ps: _Pass) -> None:
        k = audit.keys(ps.shard)
        read_segments(audit, ps)
        # held extents (preempted puts) stay allocated until released
        held = audit.zall(k.held)
        finding = check_held_bound(audit, ps.shard, audit.r.hget(k.config, HELD_DUE_FIELD), held)
        if finding:
            ps.aggregate.append(finding)
        for entry, _ in sorted(held.items()):
            m = _HELD_RE.match(entry)
            if not m:
                ps.aggregate.append(audit.finding("bad_held", ps.shard, _d(entry),
                                                  "'<mount> <offset> <size> <segment>'", "malformed"))
                continue
            mount, off, size, seg = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
            if seg in ps.segs and ps.segs[seg].mount == mount:
                ps.extents[seg].append((off, size, ("held", entry)))

    def end(self, audit: Any, ps: _Pass) -> None:
        for name, seg in ps.segs.items():
            ext = ps.extents.get(name, [])
            used = sum(e[1] for e in ext)
            ps.used_total += used
            ps.cap_total += seg.size
            check_segment(audit, ps.shard, seg, ext, used, ps)

    def settle(self, audit: Any, ps: _Pass, fp: tuple) -> None:
        if audit.zall(audit.keys(ps.shard).segments) != ps.segs_index:
            ps.moved = True

    def confirm(self, audit: Any, shard: int, ps: _Pass) -> list[Finding]:
        """Allocation overlaps, confirmed one by one (reported even from a busy shard)."""
        return [f for f, a, b in ps.overlaps if allocator.confirm_overlap(audit, shard, a, b)]


def check_held_bound(audit: Any, shard: int, bound: bytes | None, held: dict[bytes, float]) -> Finding | None:
    """held_due must not lie after the first deadline of P:held (absent: unknown, which is fine)."""
    first = min(held.values(), default=None)
    if bound is None or (bound == b"none" and first is None):
        return None
    value = None if bound == b"none" else parse(bound)
    if value is not None and (first is None or value <= first):
        return None
    return audit.finding("held_bound", shard, "held_due", "none" if first is None else f"at most {_score(first)}",
                         _d(bound), HeldBound(shard))


def read_segments(audit: Any, ps: _Pass) -> None:
    shard = ps.shard
    k = audit.keys(shard)
    index = audit.zall(k.segments)
    prefix = k.prefix("segment")
    names = sorted(set(index) | {key[len(prefix):] for key in audit.scan(shard, prefix + b"*")})
    pipe = audit.t.pipeline(shard, transaction=False)
    for n in names:
        pipe.hgetall(k.segment(n))
    segs: dict[bytes, _Seg] = {}
    for n, row in zip(names, pipe.execute()):
        if not row:
            ps.aggregate.append(audit.finding("segment_stale_index", shard, f"segment {_d(n)}",
                                             "no P:segs entry (not mounted)",
                                             f"P:segs score {_score(index.get(n))}", Forget(shard, n)))
            continue
        base, size, mount = parse(row.get(b"base", b"")), parse(row.get(b"size", b"")), row.get(b"mount")
        if base is None or size is None or size <= 0 or mount is None:
            # its facts are unknown: its replicas are neither live nor dead, its bytes not counted
            ps.bad_segments.add(n)
            ps.aggregate.append(audit.finding("bad_segment", shard, f"segment {_d(n)}",
                                             "base, size, mount", {_d(k): _d(v) for k, v in row.items()}))
            continue
        # used and g:<tenant> are derived: a malformed one is recomputed (check_segment, guarantees)
        used = parse(row.get(b"used", b""))
        segs[n] = _Seg(n, base, size, 0 if used is None else used, mount,
                       {f[2:]: v for f, v in row.items() if f.startswith(b"g:")},
                       None if used is not None else row.get(b"used", b""))
        if n not in index:
            ps.aggregate.append(audit.finding("segment_not_indexed", shard, f"segment {_d(n)}",
                                             "in P:segs", "absent", None))  # action set with segment_used
    # free lists of segments that are not mounted
    orphans = set()
    for key in audit.scan(shard, k.prefix("free") + b"*"):
        seg = k.free_segment(key)
        if seg is not None and seg not in segs and seg not in index:
            orphans.add(seg)
    for n in sorted(orphans):
        ps.aggregate.append(audit.finding("orphan_free_list", shard, f"segment {_d(n)}",
                                         "no free lists (not mounted)", "free lists present", Forget(shard, n)))
    ps.segs_index = index
    for n in segs:
        by_off, by_size = k.free(n)
        ps.free_before[n] = (audit.zall(by_off), audit.zall(by_size))
    ps.segs = segs


def check_segment(audit: Any, shard: int, seg: _Seg, ext: list, used: int, ps: _Pass) -> None:
    sname = _d(seg.name)
    index = ps.segs_index
    action: Action
    if seg.used_raw is not None:  # malformed: set to the recomputed value (the P:segs score with it)
        action = SetFigures(shard, ((b"seg:" + seg.name, b"used", seg.used_raw, used),))
    else:
        action = SegmentUsed(shard, seg.name, seg.used, used - seg.used)
    seg_findings = []
    if seg.used_raw is not None:
        seg_findings.append(audit.finding("segment_used", shard, f"segment {sname}", used, _malformed(seg.used_raw),
                                          action))
    elif seg.used != used:
        seg_findings.append(audit.finding("segment_used", shard, f"segment {sname}", used, seg.used, action))
    score = index.get(seg.name)
    if score is not None and _score(score) != seg.size - used:
        seg_findings.append(audit.finding("segment_free", shard, f"segment {sname}", f"P:segs score {seg.size - used}",
                                         f"P:segs score {_score(score)}", action))
    if seg_findings or score is None:
        for f in ps.aggregate:
            if f.kind == "segment_not_indexed" and f.subject == f"segment {sname}":
                f.action, f.repairable = action, True
    ps.aggregate += seg_findings
    allocator.check_free(audit, shard, seg, ext, ps)
