"""The SSD offload tier, master side: priorities under a full queue, FIFO inside a priority,
task references, redelivery after a timeout, disk replicas (reads, eviction, removal,
unmount, client expiry) and the queue's accounting under random operations."""
from __future__ import annotations

import random

import pytest

from mooncake_redis import ErrorCode, MasterError, ReplicateConfig
from mooncake_redis.config import SoftPinAction
from mooncake_redis.fsck import fsck
from mooncake_redis.keys import shard_of
from mooncake_redis.worker import Worker

from helpers import keys_on_shard, raises_code, shard_keys, watched_silence

DISK = "agent"  # owns the memory segment and the local disk
WRITER = "writer"
HIGH = ReplicateConfig(guaranteed_ttl_ms=3_600_000)
NORMAL = ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=3_600_000)
LOW = None


pytestmark = pytest.mark.cluster  # these API tests run on the test cluster too (conftest)

def offload_master(new_master, per_shard=1 << 20, **config):
    config.setdefault("offload_on_put", True)
    m = new_master(**config)
    m.mount_segment("mem", per_shard * m.shards, DISK)
    m.mount_local_disk_segment(DISK)
    return m


def put(m, key, size=1000, config=None):
    m.put_start(WRITER, key, size, config)
    m.put_end(WRITER, key)


def heartbeat_keys(m, n=256):
    return [(t.key.decode(), t.priority) for t in m.offload_object_heartbeat(DISK, n)]


def refs(m, key):
    return m.task_refs(key)


def test_priorities_under_a_full_queue(new_master, shards):
    m = offload_master(new_master, offload_queue_limit=2 * shards)  # a share of 2 per shard
    a, b, c, g1, g2, g3, g4, g5 = keys_on_shard(m, 0, 8)
    put(m, a)
    put(m, b)                # the queue is full of LOW entries
    put(m, c, config=NORMAL)  # NORMAL into a full queue: dropped and counted
    put(m, g1, config=HIGH)  # HIGH displaces the newest LOW (b), then the next (a)
    put(m, g2, config=HIGH)
    put(m, g3, config=HIGH)  # nothing left to displace: the overflow (share 2)
    put(m, g4, config=HIGH)
    put(m, g5, config=HIGH)  # the overflow is full too: dropped, and counted loudly
    counters = m.offload_counters()
    assert (counters["dropped_low"], counters["dropped_normal"], counters["dropped_high"]) == (2, 1, 1)
    (stats,) = m.offload_clients()
    assert stats.queued == {"high": 4, "normal": 0, "low": 0} and stats.overflow == 2
    # HIGH in arrival order across the queue and its overflow; in-flight bounded by the share
    assert heartbeat_keys(m) == [(g1, "high"), (g2, "high")]
    m.notify_offload_success(DISK, [g1, g2], ["/d/g1", "/d/g2"])
    assert heartbeat_keys(m) == [(g3, "high"), (g4, "high")]
    assert fsck(m).ok


def test_fifo_inside_a_priority_and_high_first(new_master):
    m = offload_master(new_master)
    keys = keys_on_shard(m, 0, 9)
    configs = [LOW, NORMAL, HIGH] * 3
    for key, config in zip(keys, configs):
        put(m, key, config=config)
    got = heartbeat_keys(m, 9)
    rank = {"high": 0, "normal": 1, "low": 2}
    want = sorted(zip(keys, configs), key=lambda kc: (rank[_prio(kc[1])], keys.index(kc[0])))
    assert got == [(k, _prio(c)) for k, c in want]


@pytest.mark.parametrize("many", [False, True], ids=["fixture-shards", "shards16"])
def test_priority_order_holds_across_shards(new_master, many):
    # with 16 shards a round asks fewer shards than there are: the others are asked next round
    m = offload_master(new_master, **({"shards": 16} if many else {}))
    rnd = random.Random(7)
    configs = {f"x{i}": rnd.choice([LOW, NORMAL, HIGH]) for i in range(40)}
    for key, config in configs.items():
        put(m, key, config=config)
    got = heartbeat_keys(m, 16)
    assert len(got) == 16
    ranks = [{"high": 0, "normal": 1, "low": 2}[p] for _, p in got]
    assert ranks == sorted(ranks)
    n_high = sum(1 for c in configs.values() if c is HIGH)
    assert ranks.count(0) == min(16, n_high)  # every HIGH went out before any lower priority
    assert len(got) + len(heartbeat_keys(m, 1024)) == 40  # nothing handed out twice, nothing lost


def _prio(config):
    return "high" if config is HIGH else "normal" if config is NORMAL else "low"


def test_no_queue_without_offload_on_put_or_an_enabled_disk(new_master):
    m = offload_master(new_master, offload_on_put=False)
    put(m, "k")
    assert heartbeat_keys(m) == []
    m = offload_master(new_master)
    m.mount_local_disk_segment(DISK, enable_offloading=False)
    put(m, "k")
    assert m.offload_clients()[0].queued["low"] == 0
    with raises_code(ErrorCode.SEGMENT_NOT_FOUND):
        m.offload_object_heartbeat("nobody")


def test_a_task_reference_protects_until_acknowledged(new_master):
    m = offload_master(new_master)
    put(m, "k")
    (task,) = m.offload_object_heartbeat(DISK)
    assert (task.key, task.segment, task.size, task.attempt) == (b"k", "mem", 1000, 1)
    assert refs(m, "k") == 1
    with raises_code(ErrorCode.OBJECT_HAS_REPLICATION_TASK):
        m.remove("k")
    assert m.notify_offload_success(DISK, ["k"], ["/d/k"]) == [ErrorCode.OK]
    assert refs(m, "k") == 0
    assert m.offload_counters()["done"] == 1
    assert fsck(m).ok


def test_removing_an_object_in_flight_ends_its_task(new_master):
    m = offload_master(new_master)
    put(m, "k")
    heartbeat_keys(m)
    m.remove("k", force=True)
    (stats,) = m.offload_clients()
    assert stats.inflight == 0
    assert m.redeliver_offload_tasks()["timed_out"] == 0  # nothing left in flight
    assert fsck(m).ok


def test_redelivery_after_timeout(new_master):
    m = offload_master(new_master, offload_task_timeout=5_000)
    put(m, "k", config=HIGH)
    assert heartbeat_keys(m) == [("k", "high")]
    m.advance_clock(4_999)
    assert m.redeliver_offload_tasks()["timed_out"] == 0
    m.advance_clock(1)
    assert m.redeliver_offload_tasks() == {"timed_out": 1, "requeued": 1, "dropped": 0}
    assert refs(m, "k") == 0  # the timed-out task released its reference
    (task,) = m.offload_object_heartbeat(DISK)
    assert task.attempt == 2 and refs(m, "k") == 1
    # the first agent's late success still counts, once: one disk replica, the task ends
    assert m.notify_offload_success(DISK, ["k", "k"], ["/d/k", "/d/k"]) == [ErrorCode.OK] * 2
    disks = [r for r in m.get_replica_list("k").replicas if r.kind == "disk"]
    assert [(r.client, r.location) for r in disks] == [(DISK, "/d/k")]
    assert refs(m, "k") == 0 and heartbeat_keys(m) == []
    assert fsck(m).ok


def test_the_worker_redelivers(new_master):
    m = offload_master(new_master, offload_task_timeout=1_000)
    put(m, "k")
    heartbeat_keys(m)
    m.advance_clock(1_000)
    assert Worker(m).run_once().offload_timed_out == 1
    assert heartbeat_keys(m) == [("k", "low")]


def test_high_is_retried_until_it_succeeds_lower_ones_a_bounded_number_of_times(new_master):
    m = offload_master(new_master, offload_max_attempts=2)
    put(m, "g", config=HIGH)
    put(m, "l")
    for attempt in (1, 2):
        assert sorted(heartbeat_keys(m)) == [("g", "high"), ("l", "low")]
        assert m.notify_offload_failure(DISK, ["g", "l"]) == [ErrorCode.OK] * 2
    for attempt in range(3, 6):
        assert heartbeat_keys(m) == [("g", "high")]
        m.notify_offload_failure(DISK, ["g"])
    assert m.offload_counters()["dropped_low"] == 1
    assert refs(m, "g") == 0 and refs(m, "l") == 0
    assert fsck(m).ok


def test_reads_list_memory_then_disk_and_disk_only_objects_stay_readable(new_master):
    m = offload_master(new_master, per_shard=4000)
    put(m, "k")
    heartbeat_keys(m)
    m.notify_offload_success(DISK, ["k"], ["/d/k"])
    kinds = [r.kind for r in m.get_replica_list("k").replicas]
    assert kinds == ["memory", "disk"]
    used = m.usage().used_bytes
    # fill the shard of k past the watermark: eviction frees k's memory and keeps k
    shard = shard_of(b"k", m.shards)
    m.advance_clock(60_000)
    for key in keys_on_shard(m, shard, 3, stem="fill"):
        put(m, key)
    m.advance_clock(60_000)
    step = m.evict_step(shard)
    assert step.objects >= 1
    got = m.get_replica_list("k")
    assert [(r.kind, r.client, r.location) for r in got.replicas] == [("disk", DISK, "/d/k")]
    assert m.usage().used_bytes <= used + 2000  # k's 1000 bytes are free
    assert m.exist_key("k")
    assert fsck(m).ok
    # a disk-only object is not an eviction candidate: nothing to free
    for _ in range(3):
        m.advance_clock(60_000)
        m.evict_step(shard)
    assert m.exist_key("k")
    m.advance_clock(60_000)  # past the read's lease
    m.remove("k")
    assert not m.exist_key("k")
    assert fsck(m).ok


def test_unmounting_the_disk_drops_disk_replicas(new_master):
    m = offload_master(new_master)
    m.mount_segment("mem2", (1 << 20) * m.shards, DISK)
    put(m, "both", config=ReplicateConfig(preferred_segments=("mem",)))
    put(m, "disk_only", config=ReplicateConfig(preferred_segments=("mem2",)))
    heartbeat_keys(m)
    m.notify_offload_success(DISK, ["both", "disk_only"], ["/d/1", "/d/2"])
    # its memory segment goes: the object stays, readable from disk
    assert m.unmount_segment("mem2", DISK) == 0
    assert [r.kind for r in m.get_replica_list("disk_only").replicas] == ["disk"]
    assert fsck(m).ok
    m.advance_clock(60_000)
    assert m.unmount_local_disk_segment(DISK) == 1  # the disk-only one is deleted
    assert not m.exist_key("disk_only")
    assert [r.kind for r in m.get_replica_list("both").replicas] == ["memory"]
    with raises_code(ErrorCode.SEGMENT_NOT_FOUND):
        m.offload_object_heartbeat(DISK)
    assert fsck(m).ok


def test_client_expiry_drops_its_disk(new_master):
    m = offload_master(new_master)
    put(m, "k")
    heartbeat_keys(m)
    m.notify_offload_success(DISK, ["k"], ["/d/k"])
    watched_silence(m, m.config.client_ttl + 1)
    Worker(m).run_once()
    assert not m.exist_key("k")  # its memory segment and its disk went with the client
    assert m.offload_clients() == []
    assert fsck(m).ok


def test_a_guaranteed_object_written_under_a_full_queue_reaches_disk(new_master, shards):
    m = offload_master(new_master, offload_queue_limit=shards)  # a share of 1 per shard
    low, g = keys_on_shard(m, 0, 2)
    put(m, low)
    put(m, g, config=HIGH)
    tasks = m.offload_object_heartbeat(DISK)
    assert [t.key for t in tasks] == [g.encode()]
    m.notify_offload_success(DISK, [g], ["/d/g"])
    assert [r.kind for r in m.get_replica_list(g).replicas] == ["memory", "disk"]


def test_bad_arguments_are_refused(new_master):
    m = offload_master(new_master)
    put(m, "k")
    with raises_code(ErrorCode.INVALID_PARAMS):
        m.offload_object_heartbeat(DISK, 0)
    with raises_code(ErrorCode.INVALID_PARAMS):
        m.notify_offload_success(DISK, ["k"], [""])
    with raises_code(ErrorCode.INVALID_PARAMS):
        m.report_ssd_capacity(DISK, -1)
    assert m.notify_offload_success(DISK, ["missing"], ["/d"]) == [ErrorCode.OBJECT_NOT_FOUND]
    assert m.notify_offload_success("stranger", ["k"], ["/d"]) == [ErrorCode.SEGMENT_NOT_FOUND]
    m.report_ssd_capacity(DISK, 1 << 40)
    assert m.offload_clients()[0].capacity_bytes == 1 << 40


@pytest.mark.parametrize("seed", [0, *(pytest.param(s, marks=pytest.mark.slow) for s in (1, 2))])  # more: the full run
def test_accounting_holds_under_random_operations(new_master, shards, seed):
    """Queues within their shares, one task per object holding exactly one reference, in-flight
    counts and the in-flight index agree, and fsck finds nothing, whatever the order of puts,
    heartbeats, acknowledgements, failures, timeouts, evictions and removals."""
    m = offload_master(new_master, per_shard=20_000, offload_queue_limit=3 * shards,
                       offload_task_timeout=3_000, offload_max_attempts=2)
    rnd = random.Random(seed)
    share = 3
    handed: dict[str, int] = {}
    for step in range(120):
        op = rnd.random()
        if op < 0.4:
            key = f"r{rnd.randrange(60)}"
            if not m.exist_key(key):
                try:
                    put(m, key, rnd.choice([500, 1000, 2000]), rnd.choice([LOW, NORMAL, HIGH]))
                except Exception:
                    pass
        elif op < 0.6:
            for t in m.offload_object_heartbeat(DISK, rnd.randrange(1, 5)):
                handed[t.key.decode()] = t.attempt
        elif op < 0.72 and handed:
            key = rnd.choice(sorted(handed))
            m.notify_offload_success(DISK, [key], [f"/d/{key}"])
            handed.pop(key)
        elif op < 0.82 and handed:
            key = rnd.choice(sorted(handed))
            m.notify_offload_failure(DISK, [key])
            handed.pop(key)
        elif op < 0.9:
            m.advance_clock(rnd.choice([1_000, 3_000]))
            m.redeliver_offload_tasks()
        elif op < 0.96:
            for shard in range(m.shards):
                m.evict_step(shard)
        else:
            key = f"r{rnd.randrange(60)}"
            try:
                m.remove(key, force=rnd.random() < 0.5)
            except Exception:
                pass
        _check_offload_books(m, share)
    assert fsck(m).ok


def _check_offload_books(m, share):
    for k in m.transport.keys:
        queue, overflow = k.offload_queue(DISK), k.offload_overflow(DISK)
        assert m.redis.zcard(queue) <= share and m.redis.zcard(overflow) <= share
        inflight = {x.decode() for x in m.redis.zrange(k.offload_inflight, 0, -1)}
        assert len(inflight) <= share
        assert int(m.redis.hget(k.disk(DISK), "inflight") or 0) == len(inflight)
        holders = [okey for okey in m.redis.scan_iter(match=k.prefix("object") + b"*")
                   if m.redis.hget(okey, "offload_client") is not None]
        assert len(holders) == len(inflight)
        for id_ in inflight:
            tenant, _, key = id_.partition(":")
            fields = m.redis.hgetall(k.object(tenant, key))
            if fields:
                assert fields.get(b"offload_client") == DISK.encode()
                assert int(fields.get(b"task_refs", 0)) == 1
        for okey in m.redis.scan_iter(match=k.prefix("object") + b"*"):
            fields = m.redis.hgetall(okey)
            tenant, _, key = okey[len(k.prefix("object")):].decode().partition(":")
            if b"offload_client" in fields:
                assert f"{tenant}:{key}" in inflight
            else:
                assert int(fields.get(b"task_refs", 0)) == 0


def test_fsck_audits_tasks_in_flight_and_repairs_them(new_master):
    m = offload_master(new_master)
    put(m, "a")
    put(m, "b")
    heartbeat_keys(m)
    k = shard_keys(m, shard_of(b"a", m.shards))
    kb = shard_keys(m, shard_of(b"b", m.shards))
    m.redis.zrem(k.offload_inflight, "default:a")  # a task whose index entry was lost
    m.redis.hset(kb.disk(DISK), "inflight", 7)        # a drifted in-flight count
    report = fsck(m)
    kinds = sorted(f.kind for f in report.findings)
    assert kinds == ["offload_inflight_count", "offload_task_unindexed"]
    repaired = fsck(m, repair=True).repaired
    assert sorted(f.kind for f in repaired) == ["offload_inflight_count", "offload_task_unindexed"]
    assert fsck(m).ok
    # the re-indexed task ends at the next sweep and releases its reference
    m.redeliver_offload_tasks()
    assert refs(m, "a") == 0
    m.redis.hdel(kb.object("default", "b"), "task_refs")  # a task without its reference: reported only
    assert "offload_task_ref" in [f.kind for f in fsck(m).findings]


def test_only_the_task_releases_its_own_reference(new_master):
    """A caller's release_task_ref cannot take the reference an offload task in flight holds:
    the object stays protected until the task ends."""
    m = offload_master(new_master)
    k = keys_on_shard(m, 0, 1)[0]
    put(m, k)
    assert heartbeat_keys(m) == [(k, "low")] and refs(m, k) == 1  # handed out: the task's reference
    with raises_code(ErrorCode.INVALID_PARAMS):
        m.release_task_ref(k)
    assert refs(m, k) == 1
    assert m.add_task_ref(k) == 2 and m.release_task_ref(k) == 1  # a caller's own reference comes and goes
    with pytest.raises(MasterError) as removed:
        m.remove(k)
    assert removed.value.code == ErrorCode.OBJECT_HAS_REPLICATION_TASK
    m.notify_offload_success(DISK, [k], ["/disk/k"])  # the task ends: its reference goes with it
    assert refs(m, k) == 0


def test_a_high_task_back_from_flight_is_never_dropped(new_master, shards):
    """At the boundary: the queue and its overflow are full of HIGH entries when a HIGH task
    times out. It waits in the overflow past its share (it adds no entry: it left the in-flight
    index) and is handed out again; fsck counts only entries never handed out against the share."""
    m = offload_master(new_master, offload_queue_limit=2 * shards, offload_task_timeout=5_000)  # share 2
    first, *rest = keys_on_shard(m, 0, 5)
    put(m, first, config=HIGH)
    assert heartbeat_keys(m, 1) == [(first, "high")]  # in flight
    for key in rest[:4]:
        put(m, key, config=HIGH)  # 2 in the queue, 2 in the overflow: both full
    assert m.offload_counters()["dropped_high"] == 0
    m.advance_clock(5_000)
    assert m.redeliver_offload_tasks() == {"timed_out": 1, "requeued": 1, "dropped": 0}
    assert m.offload_counters()["dropped_high"] == 0
    assert fsck(m).ok
    handed: list = []
    while batch := heartbeat_keys(m):  # at most a share in flight at a time
        handed += batch
        m.notify_offload_success(DISK, [k for k, _ in batch], [f"/disk/{k}" for k, _ in batch])
    assert sorted(handed) == sorted((k, "high") for k in [first, *rest[:4]])  # nothing lost
    assert fsck(m).ok
