"""fsck: audit (and optionally repair) the derived state of a store.

Everything but the object hashes is derived state (DESIGN.md, "Derived state is rebuildable"):
shard counters (used_bytes, capacity_bytes, objects), segment bytes (P:seg:<name>.used and the
P:segs score), the free lists of every segment, the processing index, the candidate tiers with
the soft-pin deadline index, and the group records. `fsck(master)` recomputes all of it from the
object hashes, shard by shard, and reports every difference as a `Finding`
(kind, shard, subject, expected, found); `fsck(master, repair=True)` then fixes what can be fixed
through the mc_fsck_* functions of lua/ops/fsck.lua (and mc_sweep_replicas).

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

Not repaired (reported only): overlapping allocations (two objects' bytes collide: at least one
holds garbage; remove one or both with remove(force=True), then rerun), replicas outside their
segment, malformed object hashes or segment records, malformed processing entries.
"""
from __future__ import annotations

import bisect
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import redis

from . import wire
from .errors import MasterError
from .fsck_radix import radix_findings, repair_radix
from .fsck_retention import repair_counts, retention_count_findings
from . import fsck_offload
from .keys import K, ShardKeys
from .transport import Shards

CRITICAL, ERROR, WARNING = "critical", "error", "warning"

# kind -> (severity, repairable, what it means)
KINDS: dict[str, tuple[str, bool, str]] = {
    # shard counters (hash P)
    "shard_used_bytes": (ERROR, True, "P.used_bytes differs from the sum of the segments' recomputed used bytes"),
    "shard_capacity_bytes": (ERROR, True, "P.capacity_bytes differs from the sum of the mounted segments' sizes"),
    "shard_objects": (ERROR, True, "P.objects differs from the number of object hashes"),
    # segments
    "segment_used": (ERROR, True, "P:seg:<name>.used differs from live replicas + held extents"),
    "segment_free": (ERROR, True, "the P:segs score differs from size - recomputed used"),
    "segment_not_indexed": (ERROR, True, "a mounted segment is missing from P:segs"),
    "segment_stale_index": (ERROR, True, "P:segs names a segment that is not mounted"),
    "orphan_free_list": (WARNING, True, "free lists of a segment that is not mounted"),
    "bad_segment": (ERROR, False, "a segment hash without a valid base, size or mount"),
    # allocator
    "overlap": (CRITICAL, False, "two allocated extents (replicas / held extents) share bytes"),
    "replica_out_of_bounds": (CRITICAL, False, "an allocated extent reaches outside its segment slice"),
    "free_overlaps_allocated": (CRITICAL, True, "a free extent covers allocated bytes: they can be handed out twice"),
    "free_overlap": (ERROR, True, "two free extents overlap"),
    "free_out_of_bounds": (ERROR, True, "a free extent reaches outside its segment slice"),
    "gap": (ERROR, True, "bytes neither free nor allocated (leaked)"),
    "uncoalesced": (WARNING, True, "two adjacent free extents were not merged"),
    "free_list_mismatch": (ERROR, True, "by_off and by_size do not hold the same members"),
    "free_bad_entry": (ERROR, True, "a free-list member that is not its offset, or a bad length"),
    # objects and their indexes
    "bad_object": (ERROR, False, "an object hash with missing or malformed fields"),
    "bad_held": (ERROR, False, "a P:held entry that is not '<mount> <offset> <size> <segment>'"),
    "no_live_replica": (WARNING, True, "an object whose replicas are all on unmounted segments, and no sweep "
                                       "is owed (P:sweep_pending unset)"),
    "processing_missing": (ERROR, True, "a processing object is not in P:processing"),
    "processing_score": (ERROR, True, "the P:processing score differs from put_started"),
    "processing_stale": (ERROR, True, "P:processing holds an object that is complete or missing"),
    "unit_missing": (ERROR, True, "an evictable unit is in no candidate tier"),
    "unit_wrong_tier": (ERROR, True, "a unit sits in the wrong tier for its soft pin"),
    "unit_in_both_tiers": (ERROR, True, "a unit sits in both candidate tiers"),
    "unit_score": (ERROR, True, "a unit's tier score differs from its lease_until"),
    "soft_deadline": (ERROR, True, "a soft-tier unit without the right P:deadline:soft_pin entry"),
    "stray_deadline": (WARNING, True, "a P:deadline:soft_pin entry for a unit not in the soft tier"),
    "stray_unit": (ERROR, True, "a unit in the tiers that must not be there (missing, protected or grouped object)"),
    # groups
    "group_member_missing": (ERROR, True, "an object names a group but is not in its member set"),
    "group_member_stray": (ERROR, True, "a group member set holds a key whose object is missing or elsewhere"),
    "group_counters": (ERROR, True, "members / processing / hard_pinned / task_refs differ from the members' objects"),
    "group_soft_pin": (ERROR, True, "the group's member soft pins (P:agg:soft_pin:<unit>) differ from its complete members'"),
    "group_guarantee": (ERROR, True, "the group's member guarantees (P:agg:guarantee:<unit>) differ from its members'"),
    # guarantees (explicit context caching)
    "shard_guaranteed_bytes": (ERROR, True, "P.guaranteed_bytes differs from the live replicas of guaranteed objects"),
    "tenant_guaranteed_bytes": (ERROR, True, "a tenant's P:gtenants entry differs from its guaranteed objects' live replicas"),
    "segment_guaranteed_bytes": (ERROR, True, "a segment's g:<tenant> field differs from the tenant's guaranteed replicas on it"),
    "guarantee_index": (ERROR, True, "an object's P:guaranteed entry differs from its guaranteed_until"),
    "guarantee_prefix_missing": (ERROR, True, "a guaranteed object is missing from its prefix's P:gpfx set"),
    "guarantee_prefix_stray": (WARNING, True, "a P:gpfx set holds a key that is not a guaranteed object of that prefix"),
    # group retention
    "retention_deadline": (ERROR, True, "a P:deadline:retention entry differs from its group's retained_until record"),
    "retention_counts": (ERROR, True, "P:retained_tenants differs from the tenant's P:deadline:retention entries"),
    # the radix index (fsck_radix.py)
    "radix_index": (ERROR, True, "P:rnodes differs from the shard's node records"),
    "radix_child_unlisted": (CRITICAL, True, "a node's parent does not list it (and no link is pending): the parent could be evicted under it"),
    "radix_phantom_child": (WARNING, True, "a node lists a child that is gone or has another parent (protected too long)"),
    "radix_empty_node": (WARNING, True, "a node with neither keys nor children past the grace period"),
    "radix_outbox": (ERROR, True, "a malformed outbox entry"),
}
# the SSD offload tier (fsck_offload.py)
KINDS.update(fsck_offload.KINDS)

SCAN_COUNT = 1000
GROUP_MAX_MEMBERS = 4096    # members one group snapshot / mc_fsck_group call may cover (Lua cap: 10000)
WINDOW_EXTENTS = 256        # allocated extents per mc_fsck_rebuild_free call
REBUILD_MAX = 4096          # entries per mc_fsck_rebuild_free call (Lua cap: 8192)

_HELD_RE = re.compile(rb"^(\d+) (\d+) (\d+) (.*)$", re.S)
_REP_RE = re.compile(rb"^(\d+) (\d+)$")
_UNIT_RE = re.compile(rb"^([ogr]):([A-Za-z0-9_.\-]{1,64}):(.+)$", re.S)
RADIX_MARK = b"\0r:"  # a radix node's keys are audited as the group RADIX_MARK + <hash> (lua/lib/20_object.lua)
_ID_RE = re.compile(rb"^([A-Za-z0-9_.\-]{1,64}):(.+)$", re.S)


def _d(b: Any) -> str:
    return b.decode("utf-8", "backslashreplace") if isinstance(b, (bytes, bytearray)) else str(b)


def _int(b: Any) -> int | None:
    if b is None:
        return None
    try:
        return int(b)
    except (TypeError, ValueError):
        try:
            f = float(b)
        except (TypeError, ValueError):
            return None
        return int(f) if f.is_integer() else None


def _score(s: float | None) -> int | None:
    return None if s is None else int(s)


@dataclass
class Finding:
    kind: str
    shard: int
    subject: str
    expected: str
    found: str
    severity: str = ERROR
    repairable: bool = True
    repaired: bool = False
    note: str = ""
    action: tuple | None = field(default=None, repr=False, compare=False)

    def __str__(self) -> str:
        state = "repaired" if self.repaired else ("" if self.repairable else "not auto-repairable")
        tail = "; ".join(x for x in (state, self.note) if x)
        return (f"[{self.severity}] {self.kind} shard {self.shard} {self.subject}: expected {self.expected}, "
                f"found {self.found}" + (f" ({tail})" if tail else ""))


@dataclass
class FsckReport:
    """findings: every drift found (repaired or not); repaired: the findings a repair fixed;
    unverified: shard -> why its aggregate checks did not run; ok: no findings and every shard
    verified."""
    findings: list[Finding] = field(default_factory=list)
    objects_checked: int = 0
    repaired: list[Finding] = field(default_factory=list)
    unverified: dict[int, str] = field(default_factory=dict)
    shards: int = 0

    @property
    def ok(self) -> bool:
        return not self.findings and not self.unverified

    @property
    def unrepaired(self) -> list[Finding]:
        return [f for f in self.findings if not f.repaired]

    def kinds(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for f in self.findings:
            out[f.kind] += 1
        return dict(out)

    def summary(self) -> str:
        lines = [f"fsck: {self.shards} shard(s), {self.objects_checked} objects checked, "
                 f"{len(self.findings)} finding(s), {len(self.repaired)} repaired"]
        lines += [f"  {f}" for f in self.findings]
        lines += [f"  shard {s} unverified: {why}" for s, why in sorted(self.unverified.items())]
        return "\n".join(lines)


@dataclass
class _Seg:
    name: bytes
    base: int
    size: int
    used: int
    mount: bytes
    guaranteed: dict = field(default_factory=dict)  # tenant -> its g:<tenant> field


@dataclass
class _Pass:
    """What one pass over a shard saw."""
    exact: list[Finding] = field(default_factory=list)        # from atomic snapshots
    aggregate: list[Finding] = field(default_factory=list)    # need a still shard
    overlaps: list[tuple[Finding, tuple, tuple]] = field(default_factory=list)
    objects: int = 0
    ids: set = field(default_factory=set)                      # tenant:key of every object read
    groups: dict = field(default_factory=lambda: defaultdict(set))  # (tenant, group) -> {key}
    units: set = field(default_factory=set)                    # every unit found in a tier/deadline
    processing: set = field(default_factory=set)
    rebuild: dict = field(default_factory=dict)                # seg -> (mount, windows)
    segs_index: dict = field(default_factory=dict)             # P:segs as read
    free_before: dict = field(default_factory=dict)            # seg -> (by_off, by_size) before the scan
    moved: bool = False                                        # a free list changed during the pass
    stable: bool = False
    guaranteed: dict = field(default_factory=lambda: defaultdict(int))      # (segment | b"", tenant) -> bytes
    guarantee_prefix: dict = field(default_factory=lambda: defaultdict(set))  # (tenant, prefix) -> {key}
    offload_tasks: set = field(default_factory=set)  # tenant:key of objects with an offload task in flight
    disk_bytes: dict = field(default_factory=lambda: defaultdict(int))  # client -> sizes of its live disk replicas


class _Audit:
    def __init__(self, master: Any, batch: int, retries: int, progress: Callable[[int], None] | None):
        self.t: Shards = master.transport
        self.master = master
        self.r: redis.Redis = self.t.redis  # plain reads; pipelines and SCANs go through self.t
        self.batch = batch
        self.retries = retries
        self.progress = progress
        self.report = FsckReport(shards=master.shards)
        self.checked = 0          # objects read so far (progress), across passes
        self.rebuild_plans: dict[tuple[int, bytes], tuple] = {}

    # ---- helpers -----------------------------------------------------------------------
    def keys(self, shard: int) -> ShardKeys:
        return self.t.keys[shard]

    def radix_present(self, shard: int) -> bool:
        """Is there a radix index to audit on this shard? (Its SCANs are skipped otherwise.)"""
        k = self.keys(shard)
        return bool(self.master.config.enable_radix_tree or self.r.exists(k.radix_nodes, k.radix_outbox))

    def finding(self, kind: str, shard: int, subject: str, expected: Any, found: Any,
                action: tuple | None = None, note: str = "") -> Finding:
        severity, repairable, _ = KINDS[kind]
        return Finding(kind, shard, subject, str(expected), str(found), severity,
                       repairable and action is not None, False, note, action if repairable else None)

    def scan(self, shard: int, match: bytes) -> Iterator[bytes]:
        seen: set[bytes] = set()
        for keys in self.t.scan(shard, match, SCAN_COUNT):
            for k in keys:
                if k not in seen:
                    seen.add(k)
                    yield k

    def zall(self, key: bytes) -> dict[bytes, float]:
        return {m: s for m, s in self.r.zscan_iter(key, count=SCAN_COUNT)}

    @staticmethod
    def clock(pipe_results: list) -> int:
        frozen, (sec, usec) = pipe_results[0], pipe_results[1]
        return int(frozen) if frozen is not None else int(sec) * 1000 + int(usec) // 1000

    def fingerprint(self, k: ShardKeys) -> tuple:
        pipe = self.t.pipeline(k.shard)
        pipe.hmget(k.P, "used_bytes", "capacity_bytes", "objects", "guaranteed_bytes")
        pipe.get(k.mount_seq)
        for index in (k.held, k.processing, k.segments, k.guaranteed):
            pipe.zcard(index)
        pipe.zrange(k.disks, 0, -1, withscores=True)
        res = pipe.execute()
        return tuple(res[0]) + tuple(res[1:]) + fsck_offload.disk_fingerprint(self, k, res[-1])

    # ---- placement of one unit ---------------------------------------------------------
    def compare_unit(self, shard: int, unit: bytes, st: list, now: int, action: tuple) -> list[Finding]:
        """Compare a unit's index entries with what the evictability rule says they should be.
        `st` is mc_unit_state's reply ({why, expected, actual, deadline indexes}): the rule
        itself lives in Lua only. A due deadline entry means the sweep has not re-placed the unit
        yet: its tier may lag behind the rule, and that is not drift."""
        why, exp_flat, act_flat, dl, sweep_due = st
        expected = {exp_flat[i]: exp_flat[i + 1] for i in range(0, len(exp_flat), 2)}
        actual = {act_flat[i]: _score(act_flat[i + 1]) for i in range(0, len(act_flat), 2)}
        deadlines = set(dl)
        u, why = _d(unit), _d(why) or "evictable"
        exp_t = {i: v for i, v in expected.items() if i not in deadlines}
        act_t = {i: v for i, v in actual.items() if i not in deadlines}
        due = sweep_due == 1 or any(actual[i] <= now for i in deadlines if i in actual)
        show = lambda d: ", ".join(f"{_d(i)}@{v}" for i, v in sorted(d.items())) or "absent"  # noqa: E731
        if not expected and actual:
            return [self.finding("stray_unit", shard, u, f"absent ({why})", show(actual), action)]
        out = []
        if exp_t and not act_t:
            if not due:
                out.append(self.finding("unit_missing", shard, u, show(exp_t), "in no tier", action))
        elif len(act_t) > 1:
            out.append(self.finding("unit_in_both_tiers", shard, u, show(exp_t), show(act_t), action))
        elif set(act_t) != set(exp_t):
            if not due:
                out.append(self.finding("unit_wrong_tier", shard, u, show(exp_t), show(act_t), action))
        else:
            for i, v in exp_t.items():
                if v != b"" and _score(v) != act_t[i]:
                    out.append(self.finding("unit_score", shard, u, f"score {_d(v)}", f"score {act_t[i]}", action))
        for i in sorted(deadlines):
            want, have = expected.get(i), actual.get(i)
            if i == K["deadline_retention"].encode():  # a record's deadline: any drift is drift
                if _int(want) != have:
                    out.append(self.finding("retention_deadline", shard, u,
                                            f"{_d(i)} entry {_d(want) if want else 'none'}",
                                            "none" if have is None else have, action))
                continue
            if want is not None and (have is None or _score(want) != have):
                out.append(self.finding("soft_deadline", shard, u, f"{_d(i)} entry {_d(want)}",
                                        "none" if have is None else have, action))
            elif want is None and have is not None and have > now:
                out.append(self.finding("stray_deadline", shard, u, f"no {_d(i)} entry ({why})", have, action))
        return out

    # ---- one object --------------------------------------------------------------------
    def snapshot_objects(self, shard: int, ids: list[tuple[bytes, bytes]]) -> tuple[int, list]:
        """One MULTI: the clock, then per object its hash and its index entries (processing,
        unit state, guarantee)."""
        k = self.keys(shard)
        pipe = self.t.pipeline(shard)
        pipe.get(k.clock)
        pipe.time()
        for tenant, key in ids:
            oid = tenant + b":" + key
            unit = b"o:" + oid
            pipe.hgetall(k.object(tenant, key))
            pipe.zscore(k.processing, oid)
            pipe.execute_command("FCALL_RO", "mc_unit_state", 1, k.P, unit)
            pipe.zscore(k.guaranteed, oid)
        res = pipe.execute(raise_on_error=False)
        for i, x in enumerate(res):
            if isinstance(x, Exception) and (i < 2 or (i - 2) % 4 in (1, 3)):
                raise x  # only an object key of the wrong type is tolerated (reported as bad_object)
        now = self.clock(res)
        return now, [res[2 + 4 * i: 6 + 4 * i] for i in range(len(ids))]

    def check_object(self, shard: int, tenant: bytes, key: bytes, snap: list, now: int) -> list[Finding]:
        h, s_proc, st, s_guarantee = snap
        oid = tenant + b":" + key
        subject = _d(oid)
        if isinstance(h, Exception):
            return [self.finding("bad_object", shard, subject, "a hash", f"{h}")]
        unit = b"o:" + oid
        place = ("place", shard, tenant, key)
        out: list[Finding] = []
        if not h:
            if s_proc is not None:
                out.append(self.finding("processing_stale", shard, subject, "no entry (object missing)",
                                        f"score {_score(s_proc)}", place))
            if s_guarantee is not None:
                out.append(self.finding("guarantee_index", shard, subject, "no P:guaranteed entry (object missing)",
                                        f"score {_score(s_guarantee)}", place))
            return out + self.compare_unit(shard, unit, st, now, place)
        status = h.get(b"status")
        complete = status == b"complete"
        bad = []
        size = _int(h.get(b"size"))
        if size is None or size <= 0:
            bad.append(f"size={_d(h.get(b'size'))}")
        if status not in (b"processing", b"complete"):
            bad.append(f"status={_d(status)}")
        started = _int(h.get(b"put_started"))
        if started is None:
            bad.append(f"put_started={_d(h.get(b'put_started'))}")
        for f, v in h.items():
            if f.startswith(b"rep:") and not _REP_RE.match(v):
                bad.append(f"{_d(f)}={_d(v)}")
        if bad:
            out.append(self.finding("bad_object", shard, subject, "well-formed fields", ", ".join(bad)))
        if not complete:
            if s_proc is None:
                out.append(self.finding("processing_missing", shard, subject,
                                        f"in P:processing, score {started}", "absent", place))
            elif started is not None and _score(s_proc) != started:
                out.append(self.finding("processing_score", shard, subject, f"score {started} (put_started)",
                                        f"score {_score(s_proc)}", place))
        elif s_proc is not None:
            out.append(self.finding("processing_stale", shard, subject, "no entry (object complete)",
                                    f"score {_score(s_proc)}", place))
        want = _int(h.get(b"guaranteed_until")) if b"guaranteed_until" in h else None
        if (want is None) != (s_guarantee is None) or (want is not None and _score(s_guarantee) != want):
            out.append(self.finding("guarantee_index", shard, subject,
                                    "no entry" if want is None else f"score {want} (guaranteed_until)",
                                    "absent" if s_guarantee is None else f"score {_score(s_guarantee)}", place))
        if not isinstance(st, Exception):
            out += self.compare_unit(shard, unit, st, now, place)
        return out

    # ---- one pass over a shard ---------------------------------------------------------
    def read_segments(self, shard: int, ps: _Pass) -> dict[bytes, _Seg]:
        k = self.keys(shard)
        index = self.zall(k.segments)
        prefix = k.prefix("segment")
        names = set(index) | {key[len(prefix):] for key in self.scan(shard, prefix + b"*")}
        names = sorted(names)
        pipe = self.t.pipeline(shard, transaction=False)
        for n in names:
            pipe.hgetall(k.segment(n))
        segs: dict[bytes, _Seg] = {}
        for n, row in zip(names, pipe.execute()):
            if not row:
                ps.aggregate.append(self.finding("segment_stale_index", shard, f"segment {_d(n)}",
                                                 "no P:segs entry (not mounted)",
                                                 f"P:segs score {_score(index.get(n))}", ("forget", shard, n)))
                continue
            base, size, used, mount = (_int(row.get(b"base")), _int(row.get(b"size")), _int(row.get(b"used")),
                                       row.get(b"mount"))
            if base is None or size is None or size <= 0 or mount is None or used is None:
                ps.aggregate.append(self.finding("bad_segment", shard, f"segment {_d(n)}",
                                                 "base, size, used, mount", {_d(k): _d(v) for k, v in row.items()}))
                continue
            segs[n] = _Seg(n, base, size, used, mount,
                           {f[2:]: _int(v) for f, v in row.items() if f.startswith(b"g:")})
            if n not in index:
                ps.aggregate.append(self.finding("segment_not_indexed", shard, f"segment {_d(n)}",
                                                 "in P:segs", "absent", None))  # action set with segment_used
        # free lists of segments that are not mounted
        orphans = set()
        for key in self.scan(shard, k.prefix("free") + b"*"):
            seg = k.free_segment(key)
            if seg is not None and seg not in segs and seg not in index:
                orphans.add(seg)
        for n in sorted(orphans):
            ps.aggregate.append(self.finding("orphan_free_list", shard, f"segment {_d(n)}",
                                             "no free lists (not mounted)", "free lists present", ("forget", shard, n)))
        ps.segs_index = index
        for n in segs:
            by_off, by_size = k.free(n)
            ps.free_before[n] = (self.zall(by_off), self.zall(by_size))
        return segs

    def one_pass(self, shard: int) -> _Pass:
        k = self.keys(shard)
        ps = _Pass()
        fp0 = self.fingerprint(k)
        sweep_owed = self.r.exists(k.sweep_pending) > 0  # a worker will drop dead replicas
        segs = self.read_segments(shard, ps)
        extents: dict[bytes, list[tuple[int, int, tuple]]] = defaultdict(list)
        # held extents (preempted puts) stay allocated until released
        for entry, _ in sorted(self.zall(k.held).items()):
            m = _HELD_RE.match(entry)
            if not m:
                ps.aggregate.append(self.finding("bad_held", shard, _d(entry), "'<mount> <offset> <size> <segment>'",
                                                 "malformed"))
                continue
            mount, off, size, seg = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
            if seg in segs and segs[seg].mount == mount:
                extents[seg].append((off, size, ("held", entry)))
        # objects, in atomic batches
        prefix = k.prefix("object")
        chunk: list[tuple[bytes, bytes]] = []
        # local disk segments: client -> mount id (a disk replica "<mount> <location>" is live on a match)
        disk_mounts = {c: int(score) for c, score in self.zall(k.disks).items()}

        def flush() -> None:
            if not chunk:
                return
            now, snaps = self.snapshot_objects(shard, chunk)
            for (tenant, key), snap in zip(chunk, snaps):
                h = snap[0]
                if isinstance(h, Exception):
                    ps.exact += self.check_object(shard, tenant, key, snap, now)
                    continue
                if not h:
                    continue  # deleted since the SCAN returned it
                ps.objects += 1
                ps.ids.add(tenant + b":" + key)
                ps.exact += self.check_object(shard, tenant, key, snap, now)
                size = _int(h.get(b"size")) or 0
                group = h.get(b"group")
                if group is None and h.get(b"node") is not None:
                    group = RADIX_MARK + h[b"node"]
                if group is not None:
                    ps.groups[(tenant, group)].add(key)
                guaranteed = b"guaranteed_until" in h
                if guaranteed:
                    ps.guarantee_prefix[(tenant, h.get(b"prefix", key))].add(key)
                if b"offload_client" in h:
                    ps.offload_tasks.add(tenant + b":" + key)
                n_reps = live = 0
                for f, v in h.items():
                    if not f.startswith(b"rep:"):
                        continue
                    n_reps += 1
                    m = _REP_RE.match(v)
                    seg = f[4:]
                    if m and seg in segs and segs[seg].mount == m.group(2):
                        live += 1
                        extents[seg].append((int(m.group(1)), size, ("rep", tenant, key, seg)))
                        if guaranteed:
                            ps.guaranteed[(seg, tenant)] += size
                            ps.guaranteed[(b"", tenant)] += size
                for f, v in h.items():  # a live disk replica keeps the object readable
                    if f.startswith(b"disk:") and disk_mounts.get(f[5:]) == _int(v.split(b" ", 1)[0]):
                        live += 1
                        ps.disk_bytes[f[5:]] += size
                if live == 0 and not sweep_owed:
                    ps.aggregate.append(self.finding(
                        "no_live_replica", shard, _d(tenant + b":" + key), "at least one replica on a mounted segment",
                        f"{n_reps} replica(s), none live", ("sweep", shard, tenant, key),
                        note="run the unmount sweep (mc_sweep_replicas)"))
            self.checked += sum(1 for s in snaps if s[0] and not isinstance(s[0], Exception))
            chunk.clear()
            if self.progress:
                self.progress(self.checked)

        for okey in self.scan(shard, prefix + b"*"):
            tenant, _, key = okey[len(prefix):].partition(b":")
            chunk.append((tenant, key))
            if len(chunk) >= self.batch:
                flush()
        flush()
        # tiers, deadline index, processing index: what no scanned object accounts for
        for index in k.unit_indexes + (k.deadline_retention,):
            ps.units |= set(self.zall(index))
        ps.processing = set(self.zall(k.processing))
        # segments: bytes and allocator
        used_total = cap_total = 0
        for name, seg in segs.items():
            ext = extents.get(name, [])
            used = sum(e[1] for e in ext)
            used_total += used
            cap_total += seg.size
            self.check_segment(shard, seg, ext, used, ps)
        self.check_guarantee_books(shard, segs, ps)
        fp1 = self.fingerprint(k)
        ps.stable = fp0 == fp1 and not ps.moved and self.zall(k.segments) == ps.segs_index
        # shard counters (fp1 holds the values read at the end of the pass)
        triples = []
        guaranteed_total = sum(v for (seg, _), v in ps.guaranteed.items() if seg == b"")
        for i, (fname, want) in enumerate((("used_bytes", used_total), ("capacity_bytes", cap_total),
                                           ("objects", ps.objects), ("guaranteed_bytes", guaranteed_total))):
            have = _int(fp1[i]) or 0
            if have != want:
                triples.append((fname, have, want - have))
        action = ("counters", shard, tuple(triples)) if triples else None
        for fname, have, delta in triples:
            ps.aggregate.append(self.finding(f"shard_{fname}", shard, f"P.{fname}", have + delta, have, action))
        ps.aggregate += fsck_offload.disk_used_findings(self, shard, fp1, ps.disk_bytes)
        return ps

    # ---- guarantees: per-tenant bytes (shard and segment) and the prefix sets -------------
    def check_guarantee_books(self, shard: int, segs: dict, ps: _Pass) -> None:
        k = self.keys(shard)
        have: dict[tuple[bytes, bytes], int] = {(b"", t): _int(v) or 0 for t, v in self.r.hgetall(k.guaranteed_tenants).items()}
        for name, seg in segs.items():
            have.update({(name, t): v or 0 for t, v in seg.guaranteed.items()})
        quads = []
        for where in sorted(set(have) | set(ps.guaranteed)):
            want, found = ps.guaranteed.get(where, 0), have.get(where, 0)
            if want != found:
                quads.append((where[0], where[1], found, want - found))
        action = ("guaranteed", shard, tuple(quads)) if quads else None
        for seg, tenant, found, delta in quads:
            kind, subject = (("tenant_guaranteed_bytes", f"P:gtenants {_d(tenant)}") if seg == b"" else
                             ("segment_guaranteed_bytes", f"segment {_d(seg)} g:{_d(tenant)}"))
            ps.aggregate.append(self.finding(kind, shard, subject, found + delta, found, action))
        prefix = k.prefix("guarantee_prefix")
        seen: dict[tuple[bytes, bytes], set] = {}
        for set_key in self.scan(shard, prefix + b"*"):
            tenant, _, pfx = set_key[len(prefix):].partition(b":")
            seen[(tenant, pfx)] = set(self.r.smembers(set_key))
        for (tenant, pfx) in sorted(set(seen) | set(ps.guarantee_prefix)):
            want, found = ps.guarantee_prefix.get((tenant, pfx), set()), seen.get((tenant, pfx), set())
            for key in sorted(want - found):
                ps.aggregate.append(self.finding("guarantee_prefix_missing", shard, _d(tenant + b":" + key),
                                                 f"in P:gpfx {_d(pfx)}", "absent", ("place", shard, tenant, key)))
            for key in sorted(found - want):
                ps.aggregate.append(self.finding("guarantee_prefix_stray", shard, _d(tenant + b":" + key),
                                                 f"not in P:gpfx {_d(pfx)}", "present", ("place", shard, tenant, key, pfx)))

    # ---- one segment -------------------------------------------------------------------
    def check_segment(self, shard: int, seg: _Seg, ext: list, used: int, ps: _Pass) -> None:
        sname = _d(seg.name)
        index = ps.segs_index
        action = ("segment", shard, seg.name, seg.used, used - seg.used)
        seg_findings = []
        if seg.used != used:
            seg_findings.append(self.finding("segment_used", shard, f"segment {sname}", used, seg.used, action))
        score = index.get(seg.name)
        if score is not None and _score(score) != seg.size - used:
            seg_findings.append(self.finding("segment_free", shard, f"segment {sname}", f"P:segs score {seg.size - used}",
                                             f"P:segs score {_score(score)}", action))
        if seg_findings or score is None:
            for f in ps.aggregate:
                if f.kind == "segment_not_indexed" and f.subject == f"segment {sname}":
                    f.action, f.repairable = action, True
        ps.aggregate += seg_findings

        # allocator: free extents + allocated extents must tile [base, base + size)
        by_off, by_size = (self.zall(key) for key in self.keys(shard).free(seg.name))
        if ps.free_before.get(seg.name) != (by_off, by_size):
            ps.moved = True  # an allocation or a free landed during the pass
        rebuild = ("rebuild", shard, seg.name)
        found: list[Finding] = []
        free: list[tuple[int, int, tuple]] = []
        for member in sorted(set(by_off) | set(by_size)):
            so, ss = by_off.get(member), by_size.get(member)
            where = f"segment {sname} free extent {_d(member)}"
            if so is None or ss is None:
                found.append(self.finding("free_list_mismatch", shard, where, "in by_off and by_size",
                                          "only in " + ("by_off" if ss is None else "by_size"), rebuild))
            off = _int(member)
            if off is None or (so is not None and _score(so) != off) or (ss is not None and ss <= 0):
                found.append(self.finding("free_bad_entry", shard, where, "by_off score = member = offset, length > 0",
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
                found.append(self.finding(kind, shard, f"segment {sname} {self.owner(own)}", f"inside [{lo}, {hi})",
                                          f"[{off}, {end})", rebuild if is_free else None))
            if off > cursor:
                found.append(self.finding("gap", shard, f"segment {sname} [{cursor}, {off})",
                                          "free or allocated", f"{off - cursor} bytes neither", rebuild))
            elif off < cursor and last is not None:
                l_off, l_n, l_own = last
                l_free = l_own[0] == "free"
                both = f"{self.owner(l_own)} [{l_off}, {l_off + l_n}) and {self.owner(own)} [{off}, {end})"
                span = f"{min(end, cursor) - off} bytes shared at [{off}, {min(end, cursor)})"
                if not l_free and not is_free:
                    critical = True
                    f = self.finding("overlap", shard, f"segment {sname}: {both}", "disjoint extents", span,
                                     note="not auto-repaired: at least one object holds garbage; "
                                          "remove one or both (remove force=True), then rerun fsck")
                    ps.overlaps.append((f, l_own + (l_off, l_n), own + (off, n)))
                    found.append(f)
                elif l_free and is_free:
                    found.append(self.finding("free_overlap", shard, f"segment {sname}: {both}",
                                              "disjoint free extents", span, rebuild))
                else:
                    found.append(self.finding("free_overlaps_allocated", shard, f"segment {sname}: {both}",
                                              "free extents disjoint from allocated ones", span, rebuild))
            elif off == cursor and last is not None and last[2][0] == "free" and is_free:
                found.append(self.finding("uncoalesced", shard,
                                          f"segment {sname} free [{last[0]}, {cursor}) + [{off}, {end})",
                                          "one merged free extent", "two adjacent free extents", rebuild))
            if end > cursor:
                cursor, last = end, it
        if cursor < hi:
            found.append(self.finding("gap", shard, f"segment {sname} [{cursor}, {hi})",
                                      "free or allocated", f"{hi - cursor} bytes neither", rebuild))
        if critical:
            for f in found:
                if f.action == rebuild:
                    f.action, f.repairable = None, False
                    f.note = "not repaired while the segment has overlapping or out-of-bounds allocations"
        elif any(f.action == rebuild for f in found):
            plan = self.plan_rebuild(seg, ext, by_off, by_size)
            ps.rebuild[seg.name] = (seg.mount, plan)
            if len(plan) > 1:  # a windowed rebuild cannot prove its allocation list complete
                for f in found:
                    if f.kind == "gap" and f.action == rebuild:
                        f.action, f.repairable = None, False
                        f.note = (f"leaked bytes are only reclaimed in a segment with at most {REBUILD_MAX} "
                                  "extents; remount the segment to reclaim them")
        # overlaps are kept apart: they are re-read atomically and reported even from a busy shard
        ps.aggregate += [f for f in found if f.kind != "overlap"]

    @staticmethod
    def owner(own: tuple) -> str:
        if own[0] == "rep":
            return f"replica of {_d(own[1] + b':' + own[2])}"
        if own[0] == "held":
            return f"held extent '{_d(own[1])}'"
        return f"free extent {_d(own[1])}"

    @staticmethod
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
            entry = (member, _score(so), None if ss is None else _score(ss))
            if _int(member) != _score(so):
                windows[0][2].append(entry)  # the first call removes misfiled members
            else:
                windows[_window_of(edges, _score(so))][2].append(entry)
        for member in by_size:
            if member not in by_off:
                windows[0][4].append(member)
        return [tuple(w) for w in windows]

    # ---- groups ------------------------------------------------------------------------
    def check_group(self, shard: int, tenant: bytes, group: bytes, keys: set) -> list[Finding]:
        sk = self.keys(shard)
        gkey, mkey = sk.group(tenant, group), sk.group_members(tenant, group)
        unit = b"g:" + tenant + b":" + group
        member_field, member_value = "group", group
        if group.startswith(RADIX_MARK):  # a radix node's keys: the same composite unit
            node = group[len(RADIX_MARK):]
            gkey, mkey, unit = sk.radix_node(tenant, node), sk.radix_keys(tenant, node), b"r:" + tenant + b":" + node
            member_field, member_value = "node", node
        subject = _d(tenant + b":" + group)
        if self.r.scard(mkey) + len(keys) > GROUP_MAX_MEMBERS:
            self.unverify(shard, f"group {subject} has more than {GROUP_MAX_MEMBERS} candidate members: not checked")
            return []
        cand = set(keys) | set(self.r.smembers(mkey))
        for _ in range(4):
            order = sorted(cand)
            pipe = self.t.pipeline(shard)
            pipe.get(sk.clock)
            pipe.time()
            pipe.hgetall(gkey)
            pipe.smembers(mkey)
            pipe.execute_command("FCALL_RO", "mc_unit_state", 1, sk.P, unit)
            pipe.zrange(sk.aggregate(b"soft_pin", unit), 0, -1, withscores=True)
            pipe.zrange(sk.aggregate(b"guarantee", unit), 0, -1, withscores=True)
            for key in order:
                pipe.hmget(sk.object(tenant, key), member_field, "status", "hard_pin", "soft_pin_until", "task_refs",
                           "guaranteed_until")
            res = pipe.execute()
            if set(res[3]) <= cand:
                break
            cand |= set(res[3])
        now, g, mset, st, agg, g_agg, rows = self.clock(res), res[2], set(res[3]), res[4], res[5], res[6], res[7:]
        members = {k: row for k, row in zip(order, rows) if row[0] == member_value}
        action = ("group", shard, tenant, group, tuple(sorted(members)))
        out: list[Finding] = []
        for k in sorted(set(members) - mset):
            out.append(self.finding("group_member_missing", shard, f"group {subject} member {_d(k)}",
                                    "in the member set", "absent", action))
        row_of = dict(zip(order, rows))
        for k in sorted(mset - set(members)):
            row = row_of.get(k, [None] * 6)
            why = ("object missing" if row[0] is None and row[1] is None else
                   "object has no group" if row[0] is None else f"object in group {_d(row[0])}")
            out.append(self.finding("group_member_stray", shard, f"group {subject} member {_d(k)}",
                                    "not in the member set", f"in it ({why})", action))
        n = len(members)
        proc = sum(1 for r in members.values() if r[1] != b"complete")
        hard = sum(1 for r in members.values() if r[2] == b"1")
        refs = sum(_int(r[4]) or 0 for r in members.values())
        have = tuple(_int(g.get(f)) or 0 for f in (b"members", b"processing", b"hard_pinned", b"task_refs"))
        if have != (n, proc, hard, refs):
            out.append(self.finding("group_counters", shard, f"group {subject}",
                                    f"members={n} processing={proc} hard_pinned={hard} task_refs={refs}",
                                    "members={} processing={} hard_pinned={} task_refs={}".format(*have), action))
        pins = {k: _int(r[3]) for k, r in members.items() if r[1] == b"complete" and (_int(r[3]) or 0) > 0}
        stored = {k: int(v) for k, v in agg}
        if pins != stored and g.get(b"draining") != b"1":  # a draining group's zset goes with it
            out.append(self.finding("group_soft_pin", shard, f"group {subject}", f"{len(pins)} member soft pins",
                                    f"{len(stored)} entries" if len(stored) != len(pins) else "other values", action))
        guarantees = {k: _int(r[5]) for k, r in members.items() if r[5] is not None}
        if guarantees != {k: int(v) for k, v in g_agg} and g.get(b"draining") != b"1":
            out.append(self.finding("group_guarantee", shard, f"group {subject}", f"{len(guarantees)} member guarantees",
                                    f"{len(g_agg)} entries" if len(g_agg) != len(guarantees) else "other values", action))
        return out + self.compare_unit(shard, unit, st, now, action)

    def group_keys(self, shard: int) -> set[tuple[bytes, bytes]]:
        k = self.keys(shard)
        out = set()
        families = [(k.prefix("group"), b""), (k.prefix("group_members"), b"")]
        if self.radix_present(shard):
            families += [(k.prefix("radix_node"), RADIX_MARK), (k.prefix("radix_keys"), RADIX_MARK)]
        for prefix, mark in families:
            for key in self.scan(shard, prefix + b"*"):
                tenant, _, group = key[len(prefix):].partition(b":")
                if group:
                    out.add((tenant, mark + group))
        return out

    # ---- overlaps, re-read atomically --------------------------------------------------
    def confirm_overlap(self, shard: int, a: tuple, b: tuple) -> bool:
        k = self.keys(shard)
        pipe = self.t.pipeline(shard)
        for own in (a, b):
            if own[0] == "rep":
                _, tenant, key, seg, off, n = own
                pipe.hmget(k.object(tenant, key), b"rep:" + seg, "size")
                pipe.hget(k.segment(seg), "mount")
            else:
                pipe.zscore(k.held, own[1])
                pipe.hget(k.segment(own[1].split(b" ", 3)[3]), "mount")
        res = pipe.execute()
        for i, own in enumerate((a, b)):
            got, mount = res[2 * i], res[2 * i + 1]
            if own[0] == "rep":
                rep, size = got
                m = _REP_RE.match(rep or b"")
                if not m or int(m.group(1)) != own[4] or _int(size) != own[5] or m.group(2) != mount:
                    return False
            elif got is None or own[1].split(b" ", 1)[0] != mount:
                return False
        return True

    # ---- the whole audit ---------------------------------------------------------------
    def still_pass(self, shard: int) -> _Pass:
        """A pass over the shard, retried while the shard moved under it."""
        for _ in range(self.retries + 1):
            ps = self.one_pass(shard)
            if ps.stable:
                break
        return ps

    @staticmethod
    def confirm(first: _Pass, second: _Pass) -> None:
        """Keep the aggregate findings of `second` that `first` saw identically. A repair action
        runs only if every finding it would fix was seen by both passes: a write and its undo
        during one pass (invisible to the fingerprint) does not repeat the same way in the next."""
        key = lambda f: (f.kind, f.subject, f.expected, f.found)  # noqa: E731
        seen = {key(f) for f in first.aggregate}
        keep = [f for f in second.aggregate if key(f) in seen]
        unconfirmed = {f.action for f in second.aggregate if key(f) not in seen and f.action is not None}
        for f in keep:
            if f.action in unconfirmed:
                f.action, f.repairable = None, False
                f.note = "; ".join(x for x in (f.note, "not repaired: a related finding was not confirmed "
                                                          "by a second pass; rerun fsck") if x)
        second.aggregate = keep
        second.rebuild = {seg: plan for seg, plan in second.rebuild.items()
                          if ("rebuild", seg) not in {(a[0], a[2]) for a in unconfirmed if a[0] == "rebuild"}}

    def run_shard(self, shard: int, repair: bool) -> None:
        ps = self.still_pass(shard)
        if repair and ps.stable and ps.aggregate:
            # repairs of aggregates act on what two still passes agree on
            second = self.still_pass(shard)
            if second.stable:
                self.confirm(ps, second)
                ps = second
            else:
                for f in ps.aggregate:
                    if f.action is not None:
                        f.action, f.repairable = None, False
                        f.note = "; ".join(x for x in (f.note, "not repaired: no still second pass to confirm it; "
                                                                  "rerun fsck") if x)
        self.report.objects_checked += ps.objects
        findings = list(ps.exact)
        # groups: every group an object, a group key or a unit names
        groups = dict(ps.groups)
        for tg in self.group_keys(shard):
            groups.setdefault(tg, set())
        for unit in ps.units:
            m = _UNIT_RE.match(unit)
            if m and m.group(1) == b"g":
                groups.setdefault((m.group(2), m.group(3)), set())
            elif m and m.group(1) == b"r":
                groups.setdefault((m.group(2), RADIX_MARK + m.group(3)), set())
        for (tenant, group), keys in sorted(groups.items()):
            findings += self.check_group(shard, tenant, group, keys)
        findings += retention_count_findings(self, shard)
        if self.radix_present(shard):
            findings += radix_findings(self, shard)
        findings += fsck_offload.offload_findings(self, shard, ps.offload_tasks)
        # units and processing entries no scanned object accounts for: re-read, then judge
        recheck: set[tuple[bytes, bytes]] = set()
        for unit in sorted(ps.units):
            m = _UNIT_RE.match(unit)
            if not m:
                findings.append(self.finding("stray_unit", shard, _d(unit), "absent (not a unit)", "present",
                                             ("unit", shard, unit)))
            elif m.group(1) == b"o" and m.group(2) + b":" + m.group(3) not in ps.ids:
                recheck.add((m.group(2), m.group(3)))
        for oid in sorted(ps.processing - ps.ids):
            m = _ID_RE.match(oid)
            if not m:
                findings.append(self.finding("processing_stale", shard, _d(oid), "no entry (not an object id)",
                                             "present", None))
            else:
                recheck.add((m.group(1), m.group(2)))
        todo = sorted(recheck)
        for i in range(0, len(todo), self.batch):
            part = todo[i:i + self.batch]
            now, snaps = self.snapshot_objects(shard, part)
            for (tenant, key), snap in zip(part, snaps):
                findings += self.check_object(shard, tenant, key, snap, now)
        # allocation overlaps: confirmed one by one
        for f, a, b in ps.overlaps:
            if self.confirm_overlap(shard, a, b):
                findings.append(f)
        if ps.stable:
            findings += ps.aggregate
            self.rebuild_plans.update({(shard, seg): plan for seg, plan in ps.rebuild.items()})
        else:
            self.unverify(shard, f"the shard was written during each of {self.retries + 1} pass(es): counters, "
                                 "segment bytes and free lists not checked (rerun on a quieter store)")
        self.report.findings += findings

    def unverify(self, shard: int, why: str) -> None:
        old = self.report.unverified.get(shard)
        self.report.unverified[shard] = f"{old}; {why}" if old else why

    def run(self, repair: bool) -> FsckReport:
        for shard in range(self.t.count):
            self.run_shard(shard, repair)
        if repair:
            self.repair()
        return self.report

    # ---- repairs -----------------------------------------------------------------------
    # segment used bytes before free lists: a rebuild reclaims leaked bytes only when the
    # allocations it is given add up to the (repaired) used bytes
    ORDER = {"place": 0, "unit": 0, "group": 1, "segment": 2, "forget": 2, "rebuild": 3, "counters": 4,
             "guaranteed": 4, "sweep": 5}
    ORDER["retention_counts"] = 2
    ORDER.update({"radix_index": 1, "radix_link": 6, "radix_unlink": 6, "radix_outbox": 6, "radix_empty": 7})
    ORDER["offload_task"] = 0
    ORDER["offload_inflight"] = 4
    ORDER["disk_used"] = 4

    def repair(self) -> None:
        by_action: dict[tuple, list[Finding]] = defaultdict(list)
        for f in self.report.findings:
            if f.repairable and f.action is not None:
                by_action[f.action].append(f)
        for action in sorted(by_action, key=lambda a: (self.ORDER[a[0]], a[1])):
            try:
                ok, note = self.apply(action)
            except MasterError as exc:
                ok, note = False, f"repair failed: {exc}"
            for f in by_action[action]:
                f.repaired = ok
                if note:
                    f.note = "; ".join(x for x in (f.note, note) if x)
                if ok:
                    self.report.repaired.append(f)

    def fcall(self, fn: str, shard: int, *args: Any) -> Any:
        return self.t.call(fn, shard, *args)  # reloads the library if it is gone

    def apply(self, action: tuple) -> tuple[bool, str]:
        kind, shard = action[0], action[1]
        if kind == "place":
            self.fcall("mc_fsck_place", shard, *action[2:])
        elif kind == "unit":
            self.fcall("mc_fsck_unit", shard, action[2])
        elif kind == "group":
            self.fcall("mc_fsck_group", shard, action[2], action[3], GROUP_MAX_MEMBERS, *action[4])
            if not action[3].startswith(RADIX_MARK):
                self.fcall("mc_fsck_retention", shard, action[2], action[3])  # the group's retention index entry
        elif kind.startswith("radix"):
            return repair_radix(self, action)
        elif kind == "retention_counts":
            return repair_counts(self, action)
        elif kind in ("offload_task", "offload_inflight", "disk_used"):
            return fsck_offload.repair(self, action)
        elif kind == "forget":
            self.fcall("mc_fsck_forget_segment", shard, action[2])
        elif kind == "sweep":
            self.fcall("mc_sweep_replicas", shard, *wire.head(wire.KEY, tenant=action[2]), action[3])
        elif kind == "segment":
            applied, used, _ = self.fcall("mc_fsck_segment_used", shard, action[2], action[3], action[4])
            if not applied:
                return False, f"not repaired: used moved to {used} since fsck read it; rerun fsck"
        elif kind == "guaranteed":
            replies = self.fcall("mc_fsck_guaranteed", shard, *(x for q in action[2] for x in q))
            if not all(r[0] for r in replies):
                return False, "not repaired: a guaranteed-bytes count moved since fsck read it; rerun fsck"
        elif kind == "counters":
            args = [x for t in action[2] for x in t]
            replies = self.fcall("mc_fsck_counters", shard, *args)
            if not all(r[0] for r in replies):
                return False, "not repaired: a counter moved since fsck read it; rerun fsck"
        elif kind == "rebuild":
            mount, windows = self.rebuild_plans[(shard, action[2])]
            for lo, hi, seen, alloc, drop in windows:
                if len(seen) + len(alloc) + len(drop) > REBUILD_MAX:
                    return False, "not repaired: too many free-list entries in one window"
                args: list[Any] = [action[2], mount, lo, hi, len(seen)]
                for member, so, ss in seen:
                    args += [member, "" if so is None else so, "" if ss is None else ss]
                args.append(len(alloc))
                for a in alloc:
                    args += list(a)
                args.append(len(drop))
                args += drop
                applied, detail = self.fcall("mc_fsck_rebuild_free", shard, *args)
                if not applied:
                    return False, f"not repaired: {_d(detail)}; rerun fsck"
        return True, ""


def _window_of(edges: list[int], x: int) -> int:
    """Index of the window [edges[i], edges[i+1]) holding x; values outside go to the end windows."""
    i = bisect.bisect_right(edges, x) - 1
    return min(max(i, 0), len(edges) - 2)


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
