"""fsck: audit (and optionally repair) the derived state of a store.

Everything but the object hashes is derived state (DESIGN.md, "Derived state is rebuildable"):
shard counters (used_bytes, capacity_bytes, objects), segment bytes (P:seg:<name>.used and the
P:segs score), the free lists of every segment, the processing index, the candidate tiers with
the soft-pin deadline index, and the group records. `fsck(master)` recomputes all of it from the
object hashes, shard by shard, and reports every difference as a `Finding`
(kind, shard, subject, expected, found); `fsck(master, repair=True)` then fixes what can be fixed
through the mc_fsck_* functions of lua/ops/fsck.lua (and mc_sweep_replicas).

The checks are made by checkers (checkers.CHECKERS, one module each): objects, segments and
their allocator, guarantees, the shard counters, groups, retention, the radix index, the SSD
offload tier and the Mooncake gateway's records. Each declares its kinds, its repair actions
(typed records with their order) and the hooks of a pass it takes part in (base.Checker).

It runs on a live store and never blocks Redis for long: object keys are SCANned, read in bounded
MULTI/EXEC batches (so each object is read together with its index entries in one atomic
snapshot), and no script walks the keyspace. What that buys:

* Per-object, per-unit and per-group findings are exact: each is computed from one atomic
  snapshot (an object with its processing / tier / deadline entries; a group with its member
  set, counters, unit entries and the group/status/pin fields of every candidate member).
  Units and processing entries that no scanned object accounts for are re-read atomically
  before they are reported (the object may have been created after the SCAN passed it).
* Aggregates (shard counters, segment bytes, allocator tiling) cannot be read atomically. fsck
  takes a fingerprint of the shard (counters, mount sequence, index sizes, P:segs, and every
  segment's free lists) before and after the pass; when it moved, the pass is retried
  (`retries`), and a shard that never held still is listed in `report.unverified` instead of
  producing findings that may be races. Overlapping allocations are re-read atomically and
  reported even from a busy shard.
* The fingerprint cannot see a write and its exact undo inside one pass (evict-on-put frees an
  extent and hands the same bytes to a new object in one call). So with repair=True a shard
  with aggregate findings gets a second still pass, and an aggregate repair runs only if both
  passes saw every finding it would fix identically.
* Repairs never trust the scan blindly: counters are compare-and-add (the value fsck read plus
  the delta it computed, refused if the counter moved), free lists are rebuilt only if they
  still hold exactly what fsck read, and index/group repairs re-derive from the hashes inside
  the call. Still: repairs of counters and free lists are safest on a quiet store.

Objects whose replicas are all dead are drift only when no sweep is owed (P:sweep_pending unset:
after an unmount the worker's sweep removes them); fsck then deletes them with mc_sweep_replicas.

A figure stored malformed (not an integer: mooncake_redis.figures) is drift too: a derived one
(the shard counters, a segment's used bytes, guaranteed bytes, a disk's used bytes and counts in
flight) is set to the recomputed value (mc_fsck_figures, compare-and-set on the malformed value);
any other field of P (bad_figure) or of the workers' P:metrics (bad_worker_figure) is reported.

Not repaired (reported only): overlapping allocations (two objects' bytes collide: at least one
holds garbage; remove one or both with remove(force=True), then rerun), replicas outside their
segment, malformed object hashes or segment records (a segment without a valid base, size or
mount: its replicas are not judged and the shard counters are not rewritten without it),
malformed processing entries, malformed figures nothing derives.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .allocator import REBUILD_MAX, WINDOW_EXTENTS, Rebuild
from .audit import _Audit
from .base import (
    CRITICAL,
    ERROR,
    RADIX_MARK,
    SCAN_COUNT,
    WARNING,
    Action,
    Checker,
    Finding,
    FsckReport,
    Kind,
    _Pass,
)
from .checkers import CHECKERS, KINDS
from .counters import Counters
from .groups import GROUP_MAX_MEMBERS, Group
from .objects import Place, Sweep, Unit
from .segments import Forget, SegmentUsed

__all__ = ["CHECKERS", "CRITICAL", "ERROR", "GROUP_MAX_MEMBERS", "KINDS", "RADIX_MARK", "REBUILD_MAX", "SCAN_COUNT",
           "WARNING", "WINDOW_EXTENTS", "Action", "Checker", "Counters", "Finding", "Forget", "FsckReport", "Group",
           "Kind",
           "Place", "Rebuild", "SegmentUsed", "Sweep", "Unit", "_Audit", "_Pass", "fsck"]


def fsck(master: Any, repair: bool = False, progress: Callable[[int], None] | None = None, *,
         batch: int = 128, retries: int = 2) -> FsckReport:
    """Audit every shard of `master`'s store; with repair=True, fix what can be fixed.

    progress(n) is called after each batch with the number of objects read so far (retried and
    confirming passes read objects again, so n can exceed the object count).
    batch: objects per MULTI snapshot (5 commands each; 128 keeps one EXEC around half a
    millisecond). retries: extra passes over a shard that was written during a pass before its
    aggregate checks are given up (see FsckReport.unverified).

    Memory: the audit keeps one shard's object ids and allocated extents in this process."""
    if batch < 1:
        raise ValueError("batch must be >= 1")
    return _Audit(master, batch, retries, progress).run(repair)
