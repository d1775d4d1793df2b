"""Offload on evict (MasterConfig.offload_on_evict): eviction queues an object without a disk copy
for offload instead of dropping it; the memory goes when the copy is recorded, and the object is
evicted when the offload is refused or its wait ends. Accounting (used bytes = live replicas,
P.offload_evict_bytes = the sizes of the objects waiting), fsck, and no queued object lost."""
from __future__ import annotations

import random

import pytest
from helpers import keys_on_shard

from mooncake_redis import ErrorCode, MasterError, ReplicateConfig
from mooncake_redis.config import SoftPinAction
from mooncake_redis.fsck import fsck
from mooncake_redis.keys import shard_of

DISK = "agent"    # owns the memory segment and the local disk
WRITER = "writer"
SIZE = 1000
PER_SHARD = 10 * SIZE  # ten objects fill a shard
NORMAL = ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=3_600_000)

pytestmark = pytest.mark.cluster


def evict_master(new_master, disk=True, per_shard=PER_SHARD, **config):
    config.setdefault("offload_on_evict", True)
    config.setdefault("eviction_high_watermark_ratio", 0.9)
    config.setdefault("eviction_ratio", 0.2)  # a step frees down to 70 %: three objects of ten
    config.setdefault("offload_max_attempts", 1)
    m = new_master(**config)
    m.mount_segment("mem", per_shard * m.shards, DISK)
    if disk:
        m.mount_local_disk_segment(DISK)
    return m


def put(m, key, size=SIZE, config=None):
    m.put_start(WRITER, key, size, config)
    m.put_end(WRITER, key)


def fill(m, shard=0, n=10, stem="k"):
    """n objects on `shard`, put 1 ms apart (so eviction takes them in this order)."""
    keys = keys_on_shard(m, shard, n, stem)
    for key in keys:
        put(m, key)
        m.advance_clock(1)
    return keys


def why(m, key):
    k = m.transport.keys[shard_of(key.encode(), m.shards)]
    return m.redis.execute_command("FCALL_RO", "mc_unit_state", 1, k.P, b"o:default:" + key.encode())[0].decode()


def books(m, shard=0):
    """(P.used_bytes, P.offload_evict_bytes, the keys in P:offload_evict) of a shard."""
    k = m.transport.keys[shard]
    used, waiting = m.redis.hmget(k.P, "used_bytes", "offload_evict_bytes")
    index = sorted(x.decode().partition(":")[2] for x in m.redis.zrange(k.offload_evict, 0, -1))
    return int(used or 0), int(waiting or 0), index


def kinds(m, key):
    return [r.kind for r in m.get_replica_list(key).replicas]


def test_eviction_queues_what_its_target_needs_and_the_copy_frees_it(new_master):
    m = evict_master(new_master)
    keys = fill(m)
    step = m.evict_step(0)
    assert (step.state, step.units, step.objects, step.bytes, step.queued) == ("target", 0, 0, 0, 3)
    assert books(m) == (10 * SIZE, 3 * SIZE, sorted(keys[:3]))  # the three least recently used
    assert [why(m, key) for key in keys[:4]] == ["offload_pending"] * 3 + [""]
    # the queued bytes count as freed: the next step has nothing to do, and queues nothing again
    assert m.evict_step(0).state == "idle"
    assert all(m.describe(key).replicas for key in keys)  # still in memory (describe grants no lease)
    tasks = m.offload_object_heartbeat(DISK)
    assert [(t.key.decode(), t.priority) for t in tasks] == [(key, "low") for key in keys[:3]]
    assert m.notify_offload_success(DISK, keys[:2], ["/d/0", "/d/1"]) == [ErrorCode.OK] * 2
    # the copy is recorded: the memory replica goes, the object stays readable from disk
    assert books(m) == (8 * SIZE, SIZE, [keys[2]])
    assert kinds(m, keys[0]) == ["disk"] and why(m, keys[0]) == "disk_only"
    # the offload is refused (its one attempt spent): evicted as it would have been
    assert m.notify_offload_failure(DISK, [keys[2]]) == [ErrorCode.OK]
    assert not m.exist_key(keys[2])
    assert books(m) == (7 * SIZE, 0, [])
    counters = m.offload_counters()
    assert (counters["evict_queued"], counters["evict_refused"], counters["done"]) == (3, 1, 2)
    assert fsck(m).ok


def test_without_a_disk_or_with_the_option_off_eviction_drops(new_master):
    for config in ({"offload_on_evict": False}, {"disk": False}):
        m = evict_master(new_master, **config)
        keys = fill(m)
        step = m.evict_step(0)
        assert (step.objects, step.queued) == (3, 0)
        assert not any(m.exist_key(key) for key in keys[:3])
        assert books(m) == (7 * SIZE, 0, [])
        assert fsck(m).ok


def test_a_full_queue_refuses_and_the_object_is_dropped(new_master, shards):
    m = evict_master(new_master, offload_queue_limit=shards)  # a share of one entry per shard
    keys = fill(m)
    step = m.evict_step(0)
    assert (step.objects, step.queued) == (2, 1)  # one queued, two dropped for a full queue
    assert books(m) == (8 * SIZE, SIZE, [keys[0]])
    assert not m.exist_key(keys[1]) and not m.exist_key(keys[2])
    assert m.offload_counters()["dropped_low"] == 2
    assert fsck(m).ok


def test_eviction_on_put_still_evicts_outright(new_master):
    m = evict_master(new_master)
    keys = fill(m)
    (extra,) = keys_on_shard(m, 0, 1, "extra")
    put(m, extra)  # no room: the put evicts the oldest inside its own call
    assert not m.exist_key(keys[0]) and m.exist_key(extra)
    assert books(m) == (10 * SIZE, 0, [])
    assert fsck(m).ok


def test_a_wait_not_handed_out_ends_at_the_task_timeout(new_master):
    m = evict_master(new_master, offload_task_timeout=10_000, offload_max_attempts=3)
    keys = fill(m)
    assert m.evict_step(0).queued == 3
    m.advance_clock(9_000)
    (task,) = m.offload_object_heartbeat(DISK, 1)  # handed out: it waits for its task's deadline
    m.advance_clock(1_000)
    step = m.evict_step(0)  # two waits ended: evicted (counted as such)
    assert (step.units, step.objects, step.bytes) == (2, 2, 2 * SIZE)
    assert [m.exist_key(key) for key in keys[:3]] == [True, False, False]
    assert books(m) == (8 * SIZE, SIZE, [keys[0]])
    # its task times out and is queued again (attempts left): it waits again
    m.advance_clock(10_000)
    assert m.redeliver_offload_tasks()["requeued"] == 1
    assert why(m, keys[0]) == "offload_pending"
    assert m.evict_step(0).objects == 0
    m.advance_clock(10_000)  # not handed out again in time: evicted
    assert m.evict_step(0).objects == 1
    assert not m.exist_key(keys[0]) and books(m) == (7 * SIZE, 0, [])
    assert m.offload_counters()["evict_refused"] == 3
    assert fsck(m).ok


def test_a_lease_taken_while_waiting_keeps_the_memory(new_master):
    m = evict_master(new_master)
    keys = fill(m)
    m.evict_step(0)
    m.get_replica_list(keys[0])  # a reader leases it meanwhile
    m.offload_object_heartbeat(DISK)
    m.notify_offload_success(DISK, keys[:1], ["/d/0"])
    assert kinds(m, keys[0]) == ["memory", "disk"] and why(m, keys[0]) == ""  # back among the candidates
    m.notify_offload_failure(DISK, keys[1:3])  # refused, no lease: dropped
    assert books(m) == (8 * SIZE, 0, [])
    m.advance_clock(20_000)  # its lease ends; the others are read now: it is the oldest candidate
    for key in keys[3:]:
        m.get_replica_list(key)
    for key in keys_on_shard(m, 0, 2, "more"):
        put(m, key)
    step = m.evict_step(0)  # frees its memory (kept on disk), queues two more
    assert (step.objects, step.bytes, step.queued) == (1, SIZE, 2)
    assert [r.kind for r in m.describe(keys[0]).replicas] == [] and why(m, keys[0]) == "disk_only"
    assert fsck(m).ok


def test_a_soft_pinned_object_is_queued_normal(new_master):
    m = evict_master(new_master)
    keys = keys_on_shard(m, 0, 10)
    for key in keys:
        put(m, key, config=NORMAL)
        m.advance_clock(1)
    assert m.evict_step(0).queued == 3
    assert {t.priority for t in m.offload_object_heartbeat(DISK)} == {"normal"}
    assert fsck(m).ok


def test_remove_and_upsert_of_a_waiting_object_clear_its_books(new_master):
    m = evict_master(new_master)
    keys = fill(m)
    m.evict_step(0)
    m.remove(keys[0])
    m.upsert_start(WRITER, keys[1], SIZE)  # replaced, never rewritten in place
    assert why(m, keys[1]) == "processing"
    m.upsert_end(WRITER, keys[1])
    assert why(m, keys[1]) == ""
    assert books(m) == (9 * SIZE, SIZE, [keys[2]])
    assert fsck(m).ok


def test_fsck_repairs_the_index_and_the_counter(new_master):
    m = evict_master(new_master)
    keys = fill(m)
    m.evict_step(0)
    k = m.transport.keys[0]
    m.redis.zrem(k.offload_evict, f"default:{keys[0]}")
    m.redis.zadd(k.offload_evict, {"default:gone": 1})
    m.redis.hincrby(k.P, "offload_evict_bytes", 5)
    report = fsck(m)
    assert sorted(report.kinds()) == ["offload_evict_stale", "offload_evict_unindexed", "shard_offload_evict_bytes"]
    assert fsck(m, repair=True).unrepaired == []
    assert fsck(m).ok
    assert books(m) == (10 * SIZE, 3 * SIZE, sorted(keys[:3]))
    # the re-indexed wait is due now: the next step ends it
    assert m.evict_step(0).objects == 1 and not m.exist_key(keys[0])


@pytest.mark.parametrize("seed", [1, 2])
def test_random_operations_keep_the_books(new_master, shards, seed):
    """Random puts, reads, eviction steps, hand-outs, successes, failures, timeouts, removals:
    after each step used bytes equal the live memory replicas, the bytes waiting equal the
    marked objects, every marked object is indexed, and no object whose copy was recorded (or
    that still waits) is lost; fsck is clean at the end."""
    m = evict_master(new_master, per_shard=(3 if shards > 4 else 6) * SIZE, offload_task_timeout=5_000,
                     offload_max_attempts=2, offload_queue_limit=6 * shards)  # full shards even with 16
    rnd = random.Random(seed)
    names = [f"r{i}" for i in range(40)]
    handed: set[str] = set()
    on_disk: set[str] = set()
    for _ in range(200):
        op = rnd.random()
        key = rnd.choice(names)
        if op < 0.35:
            if not m.exist_key(key):
                try:
                    m.put_start(WRITER, key, rnd.choice([500, SIZE, 2 * SIZE]), rnd.choice([None, NORMAL]))
                except MasterError as exc:  # no room: what is left waits for its offload
                    assert exc.code == ErrorCode.NO_AVAILABLE_HANDLE
                    continue
                m.put_end(WRITER, key)
        elif op < 0.45:
            if m.exist_key(key):
                m.get_replica_list(key)
        elif op < 0.6:
            for shard in range(m.shards):
                m.evict_step(shard)
        elif op < 0.7:
            handed |= {t.key.decode() for t in m.offload_object_heartbeat(DISK, rnd.randrange(1, 4))}
        elif op < 0.8 and handed:
            done = rnd.choice(sorted(handed))
            handed.discard(done)
            if m.notify_offload_success(DISK, [done], [f"/d/{done}"]) == [ErrorCode.OK]:
                on_disk.add(done)
        elif op < 0.85 and handed:
            done = rnd.choice(sorted(handed))
            handed.discard(done)
            m.notify_offload_failure(DISK, [done])
        elif op < 0.95:
            m.advance_clock(rnd.choice([500, 2_000, 6_000]))
            m.redeliver_offload_tasks()
        elif m.exist_key(key):
            m.remove(key, force=True)
            on_disk.discard(key)
            handed.discard(key)
        check_books(m, on_disk)
    counters = m.offload_counters()
    assert counters["evict_queued"] > 0 and counters["evict_refused"] + counters["done"] > 0  # it was exercised
    assert fsck(m).ok


def check_books(m, on_disk):
    for k in m.transport.keys:
        prefix = k.prefix("object")
        live_bytes = waiting = 0
        marked = set()
        for okey in m.redis.scan_iter(match=prefix + b"*"):
            h = m.redis.hgetall(okey)
            key = okey[len(prefix):].decode().partition(":")[2]
            if b"offload_evict" in h:
                marked.add(key)
                waiting += int(h[b"size"])
                assert b"reps" in h, key  # a waiting object keeps its memory replica
            if b"reps" in h:
                live_bytes += int(h[b"size"]) * len(m.describe(key).replicas)
        used, stored_waiting, index = books(m, k.shard)
        assert used == live_bytes
        assert stored_waiting == waiting and set(index) == marked
    for key in on_disk:  # a recorded copy keeps the object: nothing evicts it from disk
        assert m.exist_key(key), key
