"""The allocator of each mounted segment: its free extents (P:free:<segment> by_off and by_size)
and its allocated extents (live replicas, held extents) must tile [base, base + size) exactly:
no overlap, nothing outside the slice, no leaked gap, adjacent free extents merged, both free
lists holding the same members. Free lists are rebuilt with mc_fsck_rebuild_free, in one call
when the segment fits in REBUILD_MAX entries (then leaked bytes are reclaimed too), else in
windows of WINDOW_EXTENTS allocated extents. Overlapping allocations are only reported: they
are re-read atomically (confirm_overlap) and reported even from a busy shard."""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

from ..layout import stored_replicas
from .base import (
    CRITICAL,
    ERROR,
    WARNING,
    Action,
    Finding,
    Kind,
    _d,
    _int,
    _Pass,
    _score,
    _Seg,
)

WINDOW_EXTENTS = 256        # allocated extents per mc_fsck_rebuild_free call
REBUILD_MAX = 4096          # entries per mc_fsck_rebuild_free call (Lua cap: 8192)

KINDS: dict[str, Kind] = {
    "overlap": Kind(CRITICAL, False, "two allocated extents (replicas / held extents) share bytes"),
    "replica_out_of_bounds": Kind(CRITICAL, False, "an allocated extent reaches outside its segment slice"),
    "free_overlaps_allocated": Kind(CRITICAL, True, "a free extent covers allocated bytes: they can be handed out "
                                                    "twice"),
    "free_overlap": Kind(ERROR, True, "two free extents overlap"),
    "free_out_of_bounds": Kind(ERROR, True, "a free extent reaches outside its segment slice"),
    "gap": Kind(ERROR, True, "bytes neither free nor allocated (leaked)"),
    "uncoalesced": Kind(WARNING, True, "two adjacent free extents were not merged"),
    "free_list_mismatch": Kind(ERROR, True, "by_off and by_size do not hold the same members"),
    "free_bad_entry": Kind(ERROR, True, "a free-list member that is not its offset, or a bad length"),
}


@dataclass(frozen=True)
class Rebuild(Action):
    """Rebuild a segment's free lists from the plan fsck made for it (audit.rebuild_plans)."""
    segment: bytes
    order = 3

    def apply(self, audit: Any) -> tuple[bool, str]:
        mount, windows = audit.rebuild_plans[(self.shard, self.segment)]
        for lo, hi, seen, alloc, drop in windows:
            if len(seen) + len(alloc) + len(drop) > REBUILD_MAX:
                return False, "not repaired: too many free-list entries in one window"
            args: list[Any] = [self.segment, mount, lo, hi, len(seen)]
            for member, so, ss in seen:
                args += [member, "" if so is None else so, "" if ss is None else ss]
            args.append(len(alloc))
            for a in alloc:
                args += list(a)
            args.append(len(drop))
            args += drop
            applied, detail = audit.fcall("mc_fsck_rebuild_free", self.shard, *args)
            if not applied:
                return False, f"not repaired: {_d(detail)}; rerun fsck"
        return True, ""


def check_free(audit: Any, shard: int, seg: _Seg, ext: list, ps: _Pass) -> None:
    """The tiling of one segment (its allocated extents `ext`); findings go to ps.aggregate,
    except overlaps (ps.overlaps, confirmed after the pass)."""
    sname = _d(seg.name)
    # allocator: free extents + allocated extents must tile [base, base + size)
    by_off, by_size = (audit.zall(key) for key in audit.keys(shard).free(seg.name))
    if ps.free_before.get(seg.name) != (by_off, by_size):
        ps.moved = True  # an allocation or a free landed during the pass
    rebuild = Rebuild(shard, seg.name)
    found: list[Finding] = []
    free: list[tuple[int, int, tuple]] = []
    for member in sorted(set(by_off) | set(by_size)):
        so, ss = by_off.get(member), by_size.get(member)
        where = f"segment {sname} free extent {_d(member)}"
        if so is None or ss is None:
            found.append(audit.finding("free_list_mismatch", shard, where, "in by_off and by_size",
                                      "only in " + ("by_off" if ss is None else "by_size"), rebuild))
        off = _int(member)
        if off is None or (so is not None and _score(so) != off) or (ss is not None and ss <= 0):
            found.append(audit.finding("free_bad_entry", shard, where, "by_off score = member = offset, length > 0",
                                      f"by_off {_score(so) if so is not None else '-'}, "
                                      f"by_size {_score(ss) if ss is not None else '-'}", rebuild))
            continue
        if ss is not None:  # what the allocator can hand out: member offset, by_size length
            free.append((off, int(ss), ("free", member)))
    lo, hi = seg.base, seg.base + seg.size
    items = sorted([(o, n, own) for o, n, own in ext] + free, key=lambda e: (e[0], e[0] + e[1]))
    cursor, last = lo, None
    critical = False
    for it in items:
        off, n, own = it
        end = off + n
        is_free = own[0] == "free"
        if off < lo or end > hi:
            kind = "free_out_of_bounds" if is_free else "replica_out_of_bounds"
            critical |= not is_free
            found.append(audit.finding(kind, shard, f"segment {sname} {owner(own)}", f"inside [{lo}, {hi})",
                                      f"[{off}, {end})", rebuild if is_free else None))
        if off > cursor:
            found.append(audit.finding("gap", shard, f"segment {sname} [{cursor}, {off})",
                                      "free or allocated", f"{off - cursor} bytes neither", rebuild))
        elif off < cursor and last is not None:
            l_off, l_n, l_own = last
            l_free = l_own[0] == "free"
            both = f"{owner(l_own)} [{l_off}, {l_off + l_n}) and {owner(own)} [{off}, {end})"
            span = f"{min(end, cursor) - off} bytes shared at [{off}, {min(end, cursor)})"
            if not l_free and not is_free:
                critical = True
                f = audit.finding("overlap", shard, f"segment {sname}: {both}", "disjoint extents", span,
                                 note="not auto-repaired: at least one object holds garbage; "
                                      "remove one or both (remove force=True), then rerun fsck")
                ps.overlaps.append((f, l_own + (l_off, l_n), own + (off, n)))
                found.append(f)
            elif l_free and is_free:
                found.append(audit.finding("free_overlap", shard, f"segment {sname}: {both}",
                                          "disjoint free extents", span, rebuild))
            else:
                found.append(audit.finding("free_overlaps_allocated", shard, f"segment {sname}: {both}",
                                          "free extents disjoint from allocated ones", span, rebuild))
        elif off == cursor and last is not None and last[2][0] == "free" and is_free:
            found.append(audit.finding("uncoalesced", shard,
                                      f"segment {sname} free [{last[0]}, {cursor}) + [{off}, {end})",
                                      "one merged free extent", "two adjacent free extents", rebuild))
        if end > cursor:
            cursor, last = end, it
    if cursor < hi:
        found.append(audit.finding("gap", shard, f"segment {sname} [{cursor}, {hi})",
                                  "free or allocated", f"{hi - cursor} bytes neither", rebuild))
    if critical:
        for f in found:
            if f.action == rebuild:
                f.action, f.repairable = None, False
                f.note = "not repaired while the segment has overlapping or out-of-bounds allocations"
    elif any(f.action == rebuild for f in found):
        plan = plan_rebuild(seg, ext, by_off, by_size)
        ps.rebuild[seg.name] = (seg.mount, plan)
        if len(plan) > 1:  # a windowed rebuild cannot prove its allocation list complete
            for f in found:
                if f.kind == "gap" and f.action == rebuild:
                    f.action, f.repairable = None, False
                    f.note = (f"leaked bytes are only reclaimed in a segment with at most {REBUILD_MAX} "
                              "extents; remount the segment to reclaim them")
    # overlaps are kept apart: they are re-read atomically and reported even from a busy shard
    ps.aggregate += [f for f in found if f.kind != "overlap"]


def owner(own: tuple) -> str:
    if own[0] == "rep":
        return f"replica of {_d(own[1] + b':' + own[2])}"
    if own[0] == "held":
        return f"held extent '{_d(own[1])}'"
    return f"free extent {_d(own[1])}"

def plan_rebuild(seg: _Seg, ext: list, by_off: dict, by_size: dict) -> list[tuple]:
    """One mc_fsck_rebuild_free call for the whole segment when it fits in REBUILD_MAX entries
    (then the call can prove its allocation list complete and reclaim leaked bytes), else
    windows of at most WINDOW_EXTENTS allocated extents; each window is one call:
    (lo, hi, seen, alloc, drop), alloc entries (offset, length, kind, ref) that the function
    checks against the records ("r", b"<tenant>:<key>") or ("h", held member)."""
    lo, hi = seg.base, seg.base + seg.size
    alloc = sorted((o, n) + ((b"r", own[1] + b":" + own[2]) if own[0] == "rep" else (b"h", own[1]))
                   for o, n, own in ext if o < hi and o + n > lo)
    whole = len(alloc) + len(by_off) + len(set(by_size) - set(by_off)) <= REBUILD_MAX
    step = len(alloc) + 1 if whole else WINDOW_EXTENTS
    cuts = [alloc[i][0] for i in range(step, len(alloc), step)]
    edges = [lo] + cuts + [hi]
    windows = [[edges[i], edges[i + 1], [], [], []] for i in range(len(edges) - 1)]
    for a in alloc:
        windows[_window_of(edges, a[0])][3].append(a)
    for member, so in by_off.items():
        ss = by_size.get(member)
        off = _score(so)
        entry = (member, off, None if ss is None else _score(ss))
        if off is None or _int(member) != off:
            windows[0][2].append(entry)  # the first call removes misfiled members
        else:
            windows[_window_of(edges, off)][2].append(entry)
    for member in by_size:
        if member not in by_off:
            windows[0][4].append(member)
    return [tuple(w) for w in windows]


def _window_of(edges: list[int], x: int) -> int:
    """Index of the window [edges[i], edges[i+1]) holding x; values outside go to the end windows."""
    i = bisect.bisect_right(edges, x) - 1
    return min(max(i, 0), len(edges) - 2)


def confirm_overlap(audit: Any, shard: int, a: tuple, b: tuple) -> bool:
    k = audit.keys(shard)
    pipe = audit.t.pipeline(shard)
    for own in (a, b):
        if own[0] == "rep":
            _, tenant, key, seg, off, n = own
            pipe.hgetall(k.object(tenant, key))
            pipe.hget(k.segment(seg), "mount")
        else:
            pipe.zscore(k.held, own[1])
            pipe.hget(k.segment(own[1].split(b" ", 3)[3]), "mount")
    res = pipe.execute()
    for i, own in enumerate((a, b)):
        got, mount = res[2 * i], res[2 * i + 1]
        if own[0] == "rep":
            rep = next((r for r in stored_replicas(got) or [] if r.segment == own[3]), None)
            if rep is None or rep.offset != own[4] or _int(got.get(b"size")) != own[5] or rep.mount != mount:
                return False
        elif got is None or own[1].split(b" ", 1)[0] != mount:
            return False
    return True
