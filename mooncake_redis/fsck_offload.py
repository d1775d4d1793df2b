"""fsck of the SSD offload tier, from one atomic snapshot of a shard's offload state: the tasks
in flight (P:offload_inflight) against the objects that hold them, each task's task reference,
each client's in-flight count (P:disk:<client>.inflight), and each queue and overflow against
the shard's share of offload_queue_limit.

The object pass (fsck._Audit) hands over the ids of the objects it saw with a task in flight;
the snapshot re-reads those and every indexed one inside MULTI, so the checks compare values of
one moment. Repairs: mc_fsck_offload_task (index an unindexed task with deadline now, so the
next sweep ends it and releases its reference) and mc_fsck_offload_inflight (compare-and-set)."""
from __future__ import annotations

from collections import Counter
from typing import Any

SNAPSHOT_OBJECTS = 4096  # objects re-read per MULTI (larger sets: several, each exact for its objects)

KINDS = {
    "offload_task_unindexed": ("error", True, "an object with an offload task in flight has no P:offload_inflight entry"),
    "offload_task_ref": ("error", False, "an object with an offload task in flight holds no task reference"),
    "offload_index_stale": ("warning", False, "a P:offload_inflight entry whose object has no task in flight "
                            "(the next mc_offload_sweep after its deadline drops it)"),
    "offload_inflight_count": ("error", True, "a client's P:disk:<client>.inflight differs from its tasks in flight"),
    "offload_queue_over_share": ("error", False, "a client's offload queue or overflow holds more than the shard's share"),
}


def _share(limit: int, shards: int, shard: int) -> int:
    return limit // shards + (1 if shard < limit % shards else 0)


def offload_findings(audit: Any, shard: int, seen_in_flight: set[bytes]) -> list:
    k = audit.keys(shard)
    pipe = audit.t.pipeline(shard)
    pipe.zrange(k.offload_inflight, 0, -1)
    pipe.zrange(k.disks, 0, -1)
    pipe.hget(k.config, "offload_queue_limit")
    index, clients, limit = pipe.execute()
    share = _share(int(limit or 0), audit.t.count, shard)
    out = []
    pipe = audit.t.pipeline(shard)
    for c in clients:
        pipe.hmget(k.disk(c), "mount", "inflight")
        pipe.zcard(k.offload_queue(c))
        pipe.zcard(k.offload_overflow(c))
    ids = sorted(set(index) | set(seen_in_flight))
    pipe.zrange(k.offload_inflight, 0, -1)
    for oid in ids[:SNAPSHOT_OBJECTS]:
        tenant, _, key = oid.partition(b":")
        pipe.hmget(k.object(tenant, key), "offload_client", "offload_mount", "task_refs")
    res = pipe.execute()
    disks, at = {}, 0
    for c in clients:
        (mount, inflight), queued, overflow = res[at], res[at + 1], res[at + 2]
        at += 3
        disks[c] = (mount, int(inflight or 0))
        for what, n in (("queue", queued), ("overflow", overflow)):
            if n > share:
                out.append(audit.finding("offload_queue_over_share", shard, f"{c.decode(errors='replace')} {what}",
                                         f"at most {share}", n))
    indexed = set(res[at])
    counted: Counter = Counter()
    for oid, (client, mount, refs) in zip(ids[:SNAPSHOT_OBJECTS], res[at + 1:]):
        subject = oid.decode(errors="replace")
        if client is None:
            if oid in indexed:
                out.append(audit.finding("offload_index_stale", shard, subject, "no entry", "an entry"))
            continue
        if client in disks and mount == disks[client][0]:
            counted[client] += 1
        if oid not in indexed:
            tenant, _, key = oid.partition(b":")
            out.append(audit.finding("offload_task_unindexed", shard, subject, "an entry", "no entry",
                                     ("offload_task", shard, tenant, key)))
        if int(refs or 0) < 1:
            out.append(audit.finding("offload_task_ref", shard, subject, "task_refs >= 1", refs or 0))
    if len(ids) <= SNAPSHOT_OBJECTS:  # the counts are exact only over every task in flight
        for c, (mount, inflight) in disks.items():
            if inflight != counted[c]:
                out.append(audit.finding("offload_inflight_count", shard, f"P:disk:{c.decode(errors='replace')}",
                                         counted[c], inflight, ("offload_inflight", shard, c, inflight, counted[c])))
    return out


def repair(audit: Any, action: tuple) -> tuple[bool, str]:
    if action[0] == "offload_task":
        audit.fcall("mc_fsck_offload_task", action[1], action[2], action[3])
        return True, ""
    applied = audit.fcall("mc_fsck_offload_inflight", action[1], action[2], action[3], action[4])
    return (True, "") if applied == 1 else (False, "not repaired: the count moved since fsck read it; rerun fsck")
