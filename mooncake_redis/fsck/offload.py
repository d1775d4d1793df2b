"""fsck of the SSD offload tier, from one atomic snapshot of a shard's offload state: the tasks
in flight (P:offload_inflight) against the objects that hold them, each task's task reference,
each client's in-flight count and bytes (P:disk:<client>.inflight, inflight_bytes), each queue,
overflow and removal queue against the shard's share of its limit, and malformed removals.

The object pass hands over the ids of the objects it saw with a task in flight;
the snapshot re-reads those and every indexed one inside MULTI, so the checks compare values of
one moment. It also sums each client's live disk replicas, which disk_used_findings compares
with P:disk:<client>.used_bytes as an aggregate (the shard's fingerprint covers the disks'
mounts and used_bytes, so a pass that saw them move is retried). Repairs: mc_fsck_offload_task
(index an unindexed task with deadline now, so the next sweep ends it and releases its
reference), mc_fsck_offload_inflight (compare-and-set) and mc_fsck_disk_used (compare-and-add).

Offload on evict: the objects eviction queued for offload (field offload_evict) against their
index P:offload_evict, re-read in one MULTI with the index (the objects the pass saw marked and
every indexed one); a marked object without an entry, or an entry without a marked object, is
re-placed (mc_fsck_place re-derives the entry: a missing one is due now, so the next mc_evict
ends that wait). The bytes they hold (P.offload_evict_bytes) are a shard counter (counters.py)."""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ..figures import parse
from .base import ERROR, WARNING, Action, Checker, Finding, Kind, ObjectRead, SetFigures, _malformed, _Pass
from .objects import Place

SNAPSHOT_OBJECTS = 4096  # objects re-read per MULTI (larger sets: several, each exact for its objects)

@dataclass(frozen=True)
class OffloadTask(Action):
    """Index an unindexed task with deadline now (mc_fsck_offload_task): the next sweep ends it."""
    tenant: bytes
    key: bytes
    order = 0

    def apply(self, audit: Any) -> tuple[bool, str]:
        audit.fcall("mc_fsck_offload_task", self.shard, self.tenant, self.key)
        return True, ""


@dataclass(frozen=True)
class OffloadInflight(Action):
    """Compare-and-set of a client's in-flight count and bytes (mc_fsck_offload_inflight)."""
    client: bytes
    inflight: int
    counted: int
    inflight_bytes: int
    counted_bytes: int
    order = 4

    def apply(self, audit: Any) -> tuple[bool, str]:
        applied = audit.fcall("mc_fsck_offload_inflight", self.shard, self.client, self.inflight, self.counted,
                              self.inflight_bytes, self.counted_bytes)
        return (True, "") if applied == 1 else (False, "not repaired: the count moved since fsck read it; rerun fsck")


@dataclass(frozen=True)
class DiskUsed(Action):
    """Compare-and-add of a client's disk used_bytes, for the mount fsck saw (mc_fsck_disk_used)."""
    client: bytes
    mount: int
    used: int
    delta: int
    order = 4

    def apply(self, audit: Any) -> tuple[bool, str]:
        applied, value = audit.fcall("mc_fsck_disk_used", self.shard, self.client, self.mount, self.used, self.delta)
        return (True, "") if applied == 1 else (False, f"not repaired: used_bytes moved to {value} (or the disk "
                                                       "was remounted) since fsck read it; rerun fsck")


KINDS: dict[str, Kind] = {
    "offload_task_unindexed": Kind(ERROR, True,
                                   "an object with an offload task in flight has no P:offload_inflight entry"),
    "offload_task_ref": Kind(ERROR, False, "an object with an offload task in flight holds no task reference"),
    "offload_index_stale": Kind(WARNING, False, "a P:offload_inflight entry whose object has no task in flight "
                            "(the next mc_offload_sweep after its deadline drops it)"),
    "offload_inflight_count": Kind(ERROR, True, "a client's P:disk:<client>.inflight or inflight_bytes differs from "
                               "its tasks in flight"),
    "offload_queue_over_share": Kind(ERROR, False, "a client's offload queue, overflow (its entries never handed "
                                 "out) or removal queue holds more than the shard's share"),
    "disk_used_bytes": Kind(ERROR, True, "a client's P:disk:<client>.used_bytes differs from its live disk replicas"),
    "offload_evict_unindexed": Kind(ERROR, True, "an object eviction queued for offload (offload_evict) has no "
                                    "P:offload_evict entry: its wait would never end"),
    "offload_evict_stale": Kind(ERROR, True, "a P:offload_evict entry whose object is gone or not queued by "
                                "eviction"),
    "disk_removal_malformed": Kind(WARNING, False, "a P:diskrm:<client> entry that is not '<tenant> <#key> <key> "
                               "<location>' (the next mc_disk_removal_heartbeat drops it)"),
}
REMOVAL_RE = re.compile(rb"([A-Za-z0-9_.\-]{1,64}) ([0-9]{1,7}) ", re.S)


def _share(limit: int, shards: int, shard: int) -> int:
    return limit // shards + (1 if shard < limit % shards else 0)


def parse_removal(entry: bytes) -> tuple[bytes, bytes, bytes] | None:
    """tenant, key, location of a P:diskrm entry (lua/lib/27_disk.lua), or None when malformed."""
    m = REMOVAL_RE.match(entry)
    if not m:
        return None
    start, n = m.end(), int(m.group(2))
    if entry[start + n:start + n + 1] != b" " or len(entry) <= start + n + 1:
        return None
    return m.group(1), entry[start:start + n], entry[start + n + 1:]


def disk_fingerprint(audit: Any, k: Any) -> tuple:
    """The shard's local disks (client, mount score) and (client, mount, used_bytes) of each, for
    fsck's fingerprint."""
    disks = audit.r.zrange(k.disks, 0, -1, withscores=True)
    pipe = audit.t.pipeline(k.shard, transaction=False)
    for c, _ in disks:
        pipe.hmget(k.disk(c), "mount", "used_bytes")
    return (tuple(disks), tuple((c, mount, used) for (c, _), (mount, used) in zip(disks, pipe.execute())))


def disk_used_findings(audit: Any, shard: int, fingerprint: tuple, disk_bytes: dict) -> list[Finding]:
    """Each disk's used_bytes (as read at the end of the pass) against its live disk replicas."""
    out = []
    for client, mount, used in fingerprint[-1]:
        have, want = parse(used), disk_bytes.get(client, 0)
        subject = f"P:disk:{client.decode(errors='replace')}.used_bytes"
        if mount is None or parse(mount) is None:
            continue
        if have is None:  # malformed: set to the recomputed value
            put = SetFigures(shard, ((b"disk:" + client, b"used_bytes", used, want),))
            out.append(audit.finding("disk_used_bytes", shard, subject, want, _malformed(used), put))
        elif have != want:
            action = DiskUsed(shard, client, int(mount), have, want - have)
            out.append(audit.finding("disk_used_bytes", shard, subject, want, have, action))
    return out


def offload_findings(audit: Any, shard: int, seen_in_flight: set[bytes]) -> list[Finding]:
    k = audit.keys(shard)
    pipe = audit.t.pipeline(shard)
    pipe.zrange(k.offload_inflight, 0, -1)
    pipe.zrange(k.disks, 0, -1)
    pipe.hmget(k.config, "offload_queue_limit", "disk_removal_queue_limit")
    index, clients, (limit, removal_limit) = pipe.execute()
    share = _share(int(limit or 0), audit.t.count, shard)
    removal_share = _share(int(removal_limit or 0), audit.t.count, shard)
    out = []
    pipe = audit.t.pipeline(shard)
    for c in clients:
        pipe.hmget(k.disk(c), "mount", "inflight", "inflight_bytes")
        pipe.zcard(k.offload_queue(c))
        pipe.zrange(k.offload_overflow(c), 0, -1)
        pipe.zrange(k.disk_removals(c), 0, removal_share)  # a share's worth: enough to see it overflow
    ids = sorted(set(index) | set(seen_in_flight))
    pipe.zrange(k.offload_inflight, 0, -1)
    for oid in ids[:SNAPSHOT_OBJECTS]:
        tenant, _, key = oid.partition(b":")
        pipe.hmget(k.object(tenant, key), "offload_client", "offload_mount", "task_refs", "size")
    res = pipe.execute()
    # HIGH tasks back from flight may wait in the overflow past its share (lua/lib/45_offload.lua,
    # offload_push): only entries never handed out count against it
    overflows = [res[4 * i + 2] for i in range(len(clients))]
    pipe = audit.t.pipeline(shard)
    for oid in (oid for entries in overflows for oid in entries):
        tenant, _, key = oid.partition(b":")
        pipe.hget(k.object(tenant, key), "offload_attempts")
    attempts = iter(pipe.execute())
    disks, at = {}, 0
    for c, entries in zip(clients, overflows):
        (mount, inflight, inflight_bytes), queued, _, removals = res[at:at + 4]
        overflow = sum(1 for _ in entries if next(attempts) is None)
        at += 4
        disks[c] = (mount, inflight, inflight_bytes)  # as stored: parsed below (malformed: None)
        name = c.decode(errors="replace")
        for what, n, limit_share in (("queue", queued, share), ("overflow", overflow, share),
                                     ("removal queue", len(removals), removal_share)):
            if n > limit_share:
                out.append(audit.finding("offload_queue_over_share", shard, f"{name} {what}",
                                         f"at most {limit_share}", n))
        for entry in removals:
            if parse_removal(entry) is None:
                out.append(audit.finding("disk_removal_malformed", shard, f"{name} {entry!r}", "a removal entry",
                                         "malformed"))
    indexed = set(res[at])
    counted: Counter = Counter()
    counted_bytes: Counter = Counter()
    for oid, (client, mount, refs, size) in zip(ids[:SNAPSHOT_OBJECTS], res[at + 1:]):
        subject = oid.decode(errors="replace")
        if client is None:
            if oid in indexed:
                out.append(audit.finding("offload_index_stale", shard, subject, "no entry", "an entry"))
            continue
        if client in disks and mount == disks[client][0]:
            counted[client] += 1
            counted_bytes[client] += int(size or 0)
        if oid not in indexed:
            tenant, _, key = oid.partition(b":")
            out.append(audit.finding("offload_task_unindexed", shard, subject, "an entry", "no entry",
                                     OffloadTask(shard, tenant, key)))
        if int(refs or 0) < 1:
            out.append(audit.finding("offload_task_ref", shard, subject, "task_refs >= 1", refs or 0))
    if len(ids) <= SNAPSHOT_OBJECTS:  # the counts are exact only over every task in flight
        for c, (mount, raw_n, raw_bytes) in disks.items():
            inflight, inflight_bytes = parse(raw_n), parse(raw_bytes)
            if (inflight, inflight_bytes) == (counted[c], counted_bytes[c]):
                continue
            action: Action
            if inflight is None or inflight_bytes is None:  # malformed: set to the counts (then rerun fsck)
                action = SetFigures(shard, tuple((b"disk:" + c, f, raw, want) for f, raw, have, want in
                                                 ((b"inflight", raw_n, inflight, counted[c]),
                                                  (b"inflight_bytes", raw_bytes, inflight_bytes, counted_bytes[c]))
                                                 if have is None))
            else:
                action = OffloadInflight(shard, c, inflight, counted[c], inflight_bytes, counted_bytes[c])
            out.append(audit.finding("offload_inflight_count", shard, f"P:disk:{c.decode(errors='replace')}",
                                     f"inflight {counted[c]}, inflight_bytes {counted_bytes[c]}",
                                     "inflight {}, inflight_bytes {}".format(
                                         _malformed(raw_n) if inflight is None else inflight,
                                         _malformed(raw_bytes) if inflight_bytes is None else inflight_bytes),
                                     action))
    return out



def offload_evict_findings(audit: Any, shard: int, seen: set[bytes]) -> list[Finding]:
    """Each object eviction queued for offload against P:offload_evict, in one MULTI."""
    k = audit.keys(shard)
    index = audit.r.zrange(k.offload_evict, 0, -1)
    ids = sorted(set(index) | seen)[:SNAPSHOT_OBJECTS]
    if not ids:
        return []
    pipe = audit.t.pipeline(shard)
    pipe.zrange(k.offload_evict, 0, -1)
    for oid in ids:
        tenant, _, key = oid.partition(b":")
        pipe.hget(k.object(tenant, key), "offload_evict")
    res = pipe.execute()
    indexed, out = set(res[0]), []
    for oid, mark in zip(ids, res[1:]):
        tenant, _, key = oid.partition(b":")
        if mark is not None and oid not in indexed:
            out.append(audit.finding("offload_evict_unindexed", shard, oid.decode(errors="replace"), "an entry",
                                     "no entry", Place(shard, tenant, key)))
        elif mark is None and oid in indexed:
            out.append(audit.finding("offload_evict_stale", shard, oid.decode(errors="replace"), "no entry",
                                     "an entry", Place(shard, tenant, key)))
    return out


class Offload(Checker):
    name = "offload"
    kinds = KINDS
    actions = (OffloadTask, OffloadInflight, DiskUsed, SetFigures, Place)

    def fingerprint(self, audit: Any, k: Any) -> tuple:
        return disk_fingerprint(audit, k)

    def see_object(self, audit: Any, ps: _Pass, obj: ObjectRead) -> None:
        if not isinstance(obj.h, Exception) and b"offload_client" in obj.h:
            ps.offload_tasks.add(obj.tenant + b":" + obj.key)
        if not isinstance(obj.h, Exception) and b"offload_evict" in obj.h:
            ps.offload_evict.add(obj.tenant + b":" + obj.key)
            ps.offload_evict_bytes += parse(obj.h.get(b"size")) or 0

    def settle(self, audit: Any, ps: _Pass, fp: tuple) -> None:
        ps.aggregate += disk_used_findings(audit, ps.shard, fp, ps.disk_bytes)

    def shard(self, audit: Any, shard: int, ps: _Pass) -> list[Finding]:
        return offload_findings(audit, shard, ps.offload_tasks) + offload_evict_findings(audit, shard, ps.offload_evict)
