"""What a batch writes once at its end (Ledger.with_ledger, lua/lib/05_ledger.lua): the shard counters (each segment's
used bytes and its free-bytes score in P:segs, the shard's used_bytes and objects) that a batched
put_start, a batched remove and an eviction step sum over the call, and the index entries of a
batched put_end. After each, the counters equal what the live replicas occupy and fsck finds
nothing, whatever mix of segments, replica counts, refused keys and evictions on put the call
met."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import WRITER, assert_tiles, examples, free_extents, mount, shard_of_key, slice_of
from mooncake_redis import ErrorCode, MasterError, ReplicateConfig
from mooncake_redis.fsck import fsck
from mooncake_redis.transport import CHUNK_OF

MASTER_CONFIG = {"eviction_high_watermark_ratio": 0.5, "eviction_ratio": 0.25}


def still_stored(m, keys: list[str]) -> dict[str, list]:
    """The keys of `keys` still stored, each with its replicas."""
    out = {}
    for key in keys:
        try:
            out[key] = m.describe(key).replicas
        except MasterError as e:
            assert e.code == ErrorCode.OBJECT_NOT_FOUND
    return out


def assert_counters_true(m, keys: list[str], segments: tuple[str, ...] = ("a", "b")) -> None:
    """fsck finds nothing, and the counters add up to the replicas of the keys still stored."""
    report = fsck(m)
    assert report.ok, report.summary()
    per_segment: dict[str, int] = {}
    stored = still_stored(m, keys)
    objects = len(stored)
    for replicas in stored.values():
        for r in replicas:
            per_segment[r.segment] = per_segment.get(r.segment, 0) + r.size
    usage = m.usage()
    assert usage.objects == objects
    assert usage.used_bytes == sum(per_segment.values())
    for seg in segments:
        used, _ = m.segment_usage(seg)
        assert used == per_segment.get(seg, 0), seg


def fill(m, sizes: list[int], replicas: list[int]) -> list[str]:
    keys = [f"{{t}}k{i}" for i in range(len(sizes))]  # one shard: one call takes them all
    for key, size, n in zip(keys, sizes, replicas):
        m.put_start(WRITER, key, size, ReplicateConfig(replica_num=n))
        m.put_end(WRITER, key)
    return keys


def stored(m, data, slice_bytes: int, count: st.SearchStrategy, size: st.SearchStrategy) -> list[str]:
    """Segments a and b of `slice_bytes` a slice, and a drawn number of objects of drawn sizes and
    1-2 replicas in them, their leases over."""
    mount(m, "a", slice_bytes)
    mount(m, "b", slice_bytes)
    n = data.draw(count)
    keys = fill(m, data.draw(st.lists(size, min_size=n, max_size=n)),
                data.draw(st.lists(st.integers(1, 2), min_size=n, max_size=n)))
    m.advance_clock(10 ** 7)
    return keys


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_batched_remove_leaves_the_counters_true(new_master, data):
    m = new_master()
    keys = stored(m, data, 1 << 20, st.integers(2, 40), st.integers(1, 4096))
    n = len(keys)
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
    keys = stored(m, data, 64 << 10, st.integers(4, 60), st.integers(512, 2048))
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
    ordinary tier in one ZADD (Ledger.defer_zadd, defer_zrem); the objects are then readable and
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


SLICE = 8 << 10  # bytes of each segment's slice on a shard
batch_op = st.tuples(st.just("put"), st.lists(st.sampled_from([256, 256, 512, 1000]), min_size=1, max_size=24),
                     st.integers(1, 2))
remove_op = st.tuples(st.just("remove"), st.lists(st.integers(0, 10 ** 6), min_size=1, max_size=12))
advance_op = st.tuples(st.just("advance"), st.sampled_from([1, 10 ** 7]))
evict_op = st.tuples(st.just("evict"), st.integers(1, 64))


def assert_tiled(m, keys: list[str], segments: tuple[str, ...] = ("a", "b")) -> None:
    """Per shard and segment: the free extents and the live replicas tile the slice exactly."""
    used: dict[tuple[int, str], list[tuple[int, int]]] = {}
    for key, replicas in still_stored(m, keys).items():
        for r in replicas:
            used.setdefault((shard_of_key(m, key), r.segment), []).append((r.offset, r.size))
    for shard in range(m.shards):
        for seg in segments:
            lo, length = slice_of(m, SLICE * m.shards, shard)
            assert_tiles(free_extents(m, shard, seg), used.get((shard, seg), []), lo, length)


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.one_of(batch_op, batch_op, remove_op, advance_op, evict_op), min_size=1, max_size=12))
def test_a_batch_carving_free_extents_leaves_the_free_lists_exact(new_master, ops):
    """Batched puts take their extents from the one a batch carves, best fit, with no extent
    handed out twice, and batched removes and eviction steps grow one free extent: after every
    call the free extents and the live replicas tile each slice (no overlap, no gap, no two free
    extents side by side), through evictions on put too."""
    m = new_master()
    mount(m, "a", SLICE)
    mount(m, "b", SLICE)
    keys: list[str] = []
    for op in ops:
        if op[0] == "put":
            new = [f"k{len(keys) + i}" for i in range(len(op[1]))]
            got = m.batch_put_start(WRITER, new, op[1], ReplicateConfig(replica_num=op[2]))
            keys += new
            started = [k for k, g in zip(new, got) if not isinstance(g, ErrorCode)]
            m.batch_put_end(WRITER, started)
        elif op[0] == "remove" and keys:
            m.batch_remove(sorted({keys[i % len(keys)] for i in op[1]}), force=True)
        elif op[0] == "advance":
            m.advance_clock(op[1])
        elif op[0] == "evict":
            for shard in range(m.shards):
                m.evict_step(shard, op[1])
        assert_tiled(m, keys)
        assert_counters_true(m, keys)


def test_a_batch_takes_the_best_fit_not_its_carving(new_master):
    """A smaller key after a larger one in the same batch goes to the smallest hole that holds it,
    not to the free extent the larger one was carved from."""
    m = new_master()
    mount(m, "a", SLICE)
    first = fill(m, [300, 100], [1, 1])  # then a 300-byte hole before the 100-byte object
    hole = m.describe(first[0]).replicas[0].offset
    m.advance_clock(10 ** 7)
    m.remove(first[0])
    keys = ["{t}big", "{t}small", "{t}small2"]
    got = m.batch_put_start(WRITER, keys, [600, 256, 600])
    assert got[1][0].offset == hole  # best fit: the hole (300 B), not the rest of the tail
    assert got[2][0].offset == got[0][0].offset + 600  # and the tail again for the next 600
    assert_tiled(m, keys + first, ("a",))


def test_batched_removes_in_either_address_order_leave_one_free_extent(new_master):
    """Frees in rising address order grow the batch's free extent at its end, in falling order at
    its front, merging with the free extents beside it: what stays allocated and the free extents
    tile the slice either way, and once all is removed the slice is one free extent again."""
    m = new_master()
    mount(m, "a", SLICE)
    keys = fill(m, [256] * 24, [1] * 24)  # one shard, addresses rising with the index
    m.advance_clock(10 ** 7)
    kept = keys[8], keys[17]
    for batch in (keys[:8], keys[9:17][::-1], keys[18:][::-1]):
        assert m.batch_remove(batch) == [ErrorCode.OK] * len(batch)
        assert_tiled(m, keys, ("a",))
    assert m.batch_remove(list(kept)) == [ErrorCode.OK] * 2
    shard = shard_of_key(m, keys[0])
    assert free_extents(m, shard, "a") == [slice_of(m, SLICE * m.shards, shard)]
    assert_counters_true(m, keys, ("a",))
