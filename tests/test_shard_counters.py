"""What a batch writes once at its end (Alloc.with_ledger): the shard counters (each segment's
used bytes and its free-bytes score in P:segs, the shard's used_bytes and objects) that a batched
put_start, a batched remove and an eviction step sum over the call, and the index entries of a
batched put_end. After each, the counters equal what the live replicas occupy and fsck finds
nothing, whatever mix of segments, replica counts, refused keys and evictions on put the call
met."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import WRITER, examples, mount, shard_of_key
from mooncake_redis import ErrorCode, MasterError, ReplicateConfig
from mooncake_redis.fsck import fsck
from mooncake_redis.transport import CHUNK_OF

MASTER_CONFIG = {"eviction_high_watermark_ratio": 0.5, "eviction_ratio": 0.25}


def assert_counters_true(m, keys: list[str]) -> None:
    """fsck finds nothing, and the counters add up to the replicas of the keys still stored."""
    report = fsck(m)
    assert report.ok, report.summary()
    per_segment: dict[str, int] = {}
    objects = 0
    for key in keys:
        try:
            d = m.describe(key)
        except MasterError as e:
            assert e.code == ErrorCode.OBJECT_NOT_FOUND
            continue
        objects += 1
        for r in d.replicas:
            per_segment[r.segment] = per_segment.get(r.segment, 0) + r.size
    usage = m.usage()
    assert usage.objects == objects
    assert usage.used_bytes == sum(per_segment.values())
    for seg in ("a", "b"):
        used, _ = m.segment_usage(seg)
        assert used == per_segment.get(seg, 0), seg


def fill(m, sizes: list[int], replicas: list[int]) -> list[str]:
    keys = [f"{{t}}k{i}" for i in range(len(sizes))]  # one shard: one call takes them all
    for key, size, n in zip(keys, sizes, replicas):
        m.put_start(WRITER, key, size, ReplicateConfig(replica_num=n))
        m.put_end(WRITER, key)
    return keys


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_batched_remove_leaves_the_counters_true(new_master, data):
    m = new_master()
    mount(m, "a", 1 << 20)
    mount(m, "b", 1 << 20)
    n = data.draw(st.integers(2, 40))
    sizes = data.draw(st.lists(st.integers(1, 4096), min_size=n, max_size=n))
    replicas = data.draw(st.lists(st.integers(1, 2), min_size=n, max_size=n))
    keys = fill(m, sizes, replicas)
    m.advance_clock(10 ** 7)  # every lease over
    leased = data.draw(st.sets(st.sampled_from(keys), max_size=n // 2))
    for key in leased:
        m.get_replica_list(key)  # leased again: refused below, in the same call as the others
    gone = data.draw(st.lists(st.sampled_from(keys), min_size=1, unique=True))
    codes = m.batch_remove(gone)
    assert codes == [ErrorCode.OBJECT_HAS_LEASE if k in leased else ErrorCode.OK for k in gone]
    assert_counters_true(m, keys)


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_an_eviction_step_leaves_the_counters_true(new_master, data):
    m = new_master()
    mount(m, "a", 64 << 10)
    mount(m, "b", 64 << 10)
    n = data.draw(st.integers(4, 60))
    sizes = data.draw(st.lists(st.integers(512, 2048), min_size=n, max_size=n))
    replicas = data.draw(st.lists(st.integers(1, 2), min_size=n, max_size=n))
    keys = fill(m, sizes, replicas)
    m.advance_clock(10 ** 7)
    step = m.evict_step(shard_of_key(m, keys[0]), data.draw(st.integers(1, 64)))
    assert step.used_bytes == m.usage().used_bytes
    assert_counters_true(m, keys)


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_batched_put_start_leaves_the_counters_true(new_master, data):
    m = new_master()
    mount(m, "a", 16 << 10)
    mount(m, "b", 16 << 10)
    old = fill(m, data.draw(st.lists(st.integers(512, 4096), max_size=12)), [1] * 12)
    m.advance_clock(10 ** 7)  # the objects already there are evictable: a put may evict them
    n = data.draw(st.integers(2, 40))
    keys = [f"{{t}}new{i}" for i in range(n)]
    sizes = data.draw(st.lists(st.integers(1, 6000), min_size=n, max_size=n))
    n_rep = data.draw(st.integers(1, 2))
    got = m.batch_put_start(WRITER, keys, sizes, ReplicateConfig(replica_num=n_rep))
    assert_counters_true(m, old + keys)
    started = [k for k, g in zip(keys, got) if not isinstance(g, ErrorCode)]
    assert m.batch_put_end(WRITER, started) == [ErrorCode.OK] * len(started)
    assert_counters_true(m, old + keys)


def test_a_batched_remove_writes_each_counter_once(valkey_master):
    """On a real server: removing a call's worth of objects of two segments writes each
    segment's two counters and the shard's two once (INFO commandstats), not once an object."""
    m = valkey_master(shards=1)
    mount(m, "a", 1 << 20)
    mount(m, "b", 1 << 20)
    n = CHUNK_OF["mc_remove"]  # the keys of one call
    keys = fill(m, [100] * n, [2] * n)
    m.advance_clock(10 ** 7)
    m.redis.config_resetstat()
    assert m.batch_remove(keys) == [ErrorCode.OK] * n
    stats = m.redis.info("commandstats")
    assert stats["cmdstat_hincrby"]["calls"] == 2 + 2  # each segment's used; used_bytes and objects
    assert stats["cmdstat_zincrby"]["calls"] == 2  # each segment's score in P:segs
    assert m.usage().used_bytes == 0 and m.usage().objects == 0


def test_a_batched_put_end_drops_and_places_its_objects_in_one_command_each(valkey_master):
    """On a real server: a call's worth of put_ends leaves `processing` in one ZREM and enters the
    ordinary tier in one ZADD (Alloc.defer_zadd, defer_zrem); the objects are then readable and
    fsck finds every index entry right."""
    m = valkey_master(shards=1)
    mount(m, "a", 1 << 20)
    n = CHUNK_OF["mc_put_end"]
    keys = [f"{{t}}p{i}" for i in range(n)]
    assert all(not isinstance(g, ErrorCode) for g in m.batch_put_start(WRITER, keys, [100] * n))
    m.redis.config_resetstat()
    assert m.batch_put_end(WRITER, keys) == [ErrorCode.OK] * n
    stats = m.redis.info("commandstats")
    assert stats["cmdstat_zrem"]["calls"] == 1 and stats["cmdstat_zadd"]["calls"] == 1, stats
    assert m.batch_exist_key(keys) == [True] * n
    assert fsck(m).ok
