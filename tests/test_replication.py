"""Replica copy and move (mc_replica_start / mc_replica_end / mc_replica_revoke): the targets stay
invisible until end, the object is protected while a replication runs, an abandoned one gives
its bytes back, and the allocation books stay exact at every step (fsck)."""
import random

import pytest

from mooncake_redis import ErrorCode, MasterError, ReplicateConfig
from mooncake_redis.fsck import fsck

from helpers import WATERMARKS

MASTER_CONFIG = WATERMARKS
KIB = 1024


def setup(new_master, segs=("seg-a", "seg-b", "seg-c"), **config):
    m = new_master(evict_on_put=False, **config)
    for i, s in enumerate(segs):
        m.mount_segment(s, 64 * KIB * m.shards, "client-1", base=i << 30)
    return m


def put(m, key, seg="seg-a", size=KIB):
    m.put_start("client-1", key, size, ReplicateConfig(preferred_segments=(seg,)))
    m.put_end("client-1", key)


def segments_of(m, key):
    return sorted(r.segment for r in m.get_replica_list(key).replicas)


def code_of(fn, *args, **kw):
    with pytest.raises(MasterError) as e:
        fn(*args, **kw)
    return e.value.code


def test_copy_adds_replicas_only_at_end(new_master):
    m = setup(new_master)
    put(m, "k")
    started = m.replica_copy_start("client-1", "k", "seg-a", ["seg-b", "seg-c", "seg-a"])
    assert started.source.segment == "seg-a" and started.source.size == KIB
    assert sorted(t.segment for t in started.targets) == ["seg-b", "seg-c"]  # seg-a has one already
    assert segments_of(m, "k") == ["seg-a"]  # readers never see a target before end
    assert m.usage().used_bytes == 3 * KIB and fsck(m).ok  # the targets' extents are allocated
    m.replica_end("client-1", "k", "copy")
    assert segments_of(m, "k") == ["seg-a", "seg-b", "seg-c"]
    assert m.usage().used_bytes == 3 * KIB and m.task_refs("k") == 0 and fsck(m).ok


def test_move_drops_its_source_at_end(new_master):
    m = setup(new_master)
    put(m, "k")
    started = m.replica_move_start("client-1", "k", "seg-a", "seg-b")
    assert [t.segment for t in started.targets] == ["seg-b"]
    assert segments_of(m, "k") == ["seg-a"]  # a read: its lease keeps the source's bytes
    m.replica_end("client-1", "k", "move")
    assert segments_of(m, "k") == ["seg-b"]
    assert m.usage().used_bytes == 2 * KIB and fsck(m).ok  # the source is held while the lease runs
    m.advance_clock(m.config.default_kv_lease_ttl + 1)
    m.transport.call("mc_discard_puts", m.transport.shard_of(b"k"), 16)  # the worker's release of held extents
    assert m.usage().used_bytes == KIB and fsck(m).ok


def test_a_guaranteed_objects_new_replicas_count_as_guaranteed(new_master):
    m = setup(new_master)
    m.put_start("client-1", "g", KIB, ReplicateConfig(preferred_segments=("seg-a",), guaranteed_ttl_ms=60_000))
    m.put_end("client-1", "g")
    m.replica_copy_start("client-1", "g", "seg-a", ["seg-b"])
    m.replica_end("client-1", "g", "copy")
    assert m.usage().guaranteed_bytes == 2 * KIB and fsck(m).ok
    m.replica_move_start("client-1", "g", "seg-a", "seg-c")
    m.replica_end("client-1", "g", "move")
    assert segments_of(m, "g") == ["seg-b", "seg-c"]
    assert m.usage().guaranteed_bytes == 2 * KIB and fsck(m).ok
    m.unmount_segment("seg-b", "client-1")
    assert m.usage().guaranteed_bytes == KIB and fsck(m).ok


def test_a_replication_protects_its_object(new_master):
    m = setup(new_master)
    put(m, "k")
    m.replica_copy_start("client-1", "k", "seg-a", ["seg-b"])
    assert code_of(m.remove, "k") == ErrorCode.OBJECT_HAS_REPLICATION_TASK
    assert code_of(m.replica_copy_start, "client-1", "k", "seg-a", ["seg-c"]) == ErrorCode.OBJECT_HAS_REPLICATION_TASK
    assert code_of(m.replica_end, "client-2", "k", "copy") == ErrorCode.ILLEGAL_CLIENT
    assert code_of(m.replica_end, "client-1", "k", "move") == ErrorCode.INVALID_PARAMS
    m.advance_clock(m.config.default_kv_lease_ttl + 1)
    m.run_eviction()
    assert segments_of(m, "k") == ["seg-a"]
    m.replica_revoke("client-1", "k", "copy")
    assert segments_of(m, "k") == ["seg-a"] and m.usage().used_bytes == KIB and m.task_refs("k") == 0
    assert code_of(m.replica_end, "client-1", "k", "copy") == ErrorCode.OBJECT_NO_REPLICATION_TASK
    assert fsck(m).ok


def test_start_refusals(new_master):
    m = setup(new_master)
    put(m, "k")
    assert code_of(m.replica_copy_start, "client-1", "nope", "seg-a", ["seg-b"]) == ErrorCode.OBJECT_NOT_FOUND
    assert code_of(m.replica_copy_start, "client-1", "k", "seg-a", ["seg-x"]) == ErrorCode.SEGMENT_NOT_FOUND
    assert code_of(m.replica_copy_start, "client-1", "k", "seg-b", ["seg-c"]) == ErrorCode.REPLICA_NOT_FOUND
    assert code_of(m.replica_move_start, "client-1", "k", "seg-a", "seg-a") == ErrorCode.INVALID_PARAMS
    assert code_of(m.replica_copy_start, "client-1", "k", "seg-a", []) == ErrorCode.INVALID_PARAMS
    m.graceful_unmount_segment("seg-c", "client-1", 60_000)
    assert code_of(m.replica_copy_start, "client-1", "k", "seg-a", ["seg-c"]) == ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS
    put(m, "{b}big", "seg-a", 60 * KIB)
    put(m, "{b}filler", "seg-b", 60 * KIB)  # the same shard as {b}big
    assert code_of(m.replica_copy_start, "client-1", "{b}big", "seg-a", ["seg-b"]) == ErrorCode.NO_AVAILABLE_HANDLE
    assert m.task_refs("{b}big") == 0 and fsck(m).ok  # nothing allocated, nothing held


def test_an_abandoned_replication_is_revoked_by_the_worker(new_master):
    m = setup(new_master)
    put(m, "k")
    m.replica_copy_start("client-1", "k", "seg-a", ["seg-b", "seg-c"])
    m.advance_clock(m.config.put_start_discard_timeout)
    shard = m.transport.shard_of(b"k")
    assert m.transport.call("mc_discard_puts", shard, 16)[2] == 1
    assert m.task_refs("k") == 0 and m.usage().used_bytes == KIB and fsck(m).ok
    assert code_of(m.replica_end, "client-1", "k", "copy") == ErrorCode.OBJECT_NO_REPLICATION_TASK


def test_a_target_unmounted_meanwhile_is_gone_at_end(new_master):
    m = setup(new_master)
    put(m, "k")
    m.replica_copy_start("client-1", "k", "seg-a", ["seg-b", "seg-c"])
    m.unmount_segment("seg-c", "client-1")
    assert code_of(m.replica_end, "client-1", "k", "copy") == ErrorCode.REPLICA_IS_GONE
    assert segments_of(m, "k") == ["seg-a", "seg-b"] and fsck(m).ok  # the live target is kept
    m.replica_move_start("client-1", "k", "seg-b", "seg-a")  # seg-a has a replica: nothing to allocate
    m.replica_end("client-1", "k", "move")
    assert segments_of(m, "k") == ["seg-a"] and fsck(m).ok


def test_random_replications_keep_the_books(new_master):
    """Copies, moves, ends, revokes, upserts, forced removes, unmounts, evictions and deadlines in
    a random order: fsck finds nothing at every step, and no object is left with a task reference once
    nothing runs."""
    m = setup(new_master, segs=("s0", "s1", "s2", "s3"))
    rng = random.Random(7)
    segs, keys = ["s0", "s1", "s2", "s3"], [f"k{i}" for i in range(6)]
    for k in keys:
        put(m, k, rng.choice(segs[:3]), rng.choice([KIB, 3 * KIB]))
    counts: dict[str, int] = {}
    started: dict[str, str] = {}  # the kind last started per key
    for step in range(80):
        k = rng.choice(keys)
        op = rng.choice(["copy", "move", "end", "revoke", "upsert", "remove", "evict", "clock", "unmount"])
        try:
            if op == "copy":
                src = rng.choice(segments_of(m, k))
                m.replica_copy_start("client-1", k, src, rng.sample(segs, 2))
                started[k] = "copy"
            elif op == "move":
                src = rng.choice(segments_of(m, k))
                m.replica_move_start("client-1", k, src, rng.choice([s for s in segs if s != src]))
                started[k] = "move"
            elif op in ("end", "revoke"):
                kind = started.get(k, "copy") if rng.random() < 0.8 else rng.choice(["copy", "move"])
                (m.replica_end if op == "end" else m.replica_revoke)("client-1", k, kind)
            elif op == "upsert":  # refused while a replication runs (a task reference)
                m.upsert_start("client-1", k, rng.choice([KIB, 2 * KIB]))
                m.upsert_end("client-1", k)
            elif op == "remove":
                m.remove(k, force=True)
                put(m, k, rng.choice(segs))
            elif op == "evict":
                m.run_eviction()
            elif op == "clock":
                m.advance_clock(rng.choice([1000, m.config.put_start_discard_timeout]))
                for shard in range(m.shards):
                    m.transport.call("mc_discard_puts", shard, 64)
            elif op == "unmount" and step % 20 == 19:
                seg = rng.choice(segs)
                m.unmount_segment(seg, "client-1")
                m.sweep_replicas() if hasattr(m, "sweep_replicas") else None
                m.mount_segment(seg, 64 * KIB * m.shards, "client-1", base=(segs.index(seg)) << 30)
            counts[op] = counts.get(op, 0) + 1
        except MasterError:
            pass  # refusals are part of the run: the books must hold whatever happened
        report = fsck(m)
        assert report.ok, (step, op, k, report)
    assert all(counts.get(op, 0) > 0 for op in ("copy", "move", "end", "revoke", "upsert")), counts
    m.advance_clock(m.config.put_start_discard_timeout)
    for shard in range(m.shards):
        m.transport.call("mc_discard_puts", shard, 64)
    for k in keys:
        try:
            assert m.task_refs(k) == 0
        except MasterError as e:
            assert e.code == ErrorCode.OBJECT_NOT_FOUND
    assert fsck(m).ok


def test_fsck_revokes_a_replication_the_worker_cannot_see(new_master):
    m = setup(new_master)
    put(m, "k")
    m.replica_copy_start("client-1", "k", "seg-a", ["seg-b"])
    shard = m.transport.shard_of(b"k")
    m.transport.run([("ZREM", m.transport.keys[shard].repl_due, b"default:k")])  # drift
    report = fsck(m)
    assert [f.kind for f in report.findings] == ["repl_unlisted"]
    fsck(m, repair=True)
    assert m.task_refs("k") == 0 and m.usage().used_bytes == KIB and fsck(m).ok
    assert code_of(m.replica_end, "client-1", "k", "copy") == ErrorCode.OBJECT_NO_REPLICATION_TASK
