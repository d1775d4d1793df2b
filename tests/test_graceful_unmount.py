"""Graceful unmount: a draining segment takes no new extent at once, its objects stay readable
until it drains or its grace period ends, then the worker unmounts it on every shard."""
from __future__ import annotations

import pytest
from helpers import OWNER, WRITER, mount, put, raises_code, store_snapshot

from mooncake_redis import ErrorCode, ReplicateConfig
from mooncake_redis.fsck import fsck
from mooncake_redis.worker import Worker

PER_SHARD = 1 << 14


def on(segment: str) -> ReplicateConfig:
    return ReplicateConfig(preferred_segments=(segment,))


def segments_of(m, key) -> list[str]:
    return [r.segment for r in m.get_replica_list(key).replicas]


def test_a_draining_segment_takes_no_new_extent_and_keeps_serving_its_objects(master):
    mount(master, "old", PER_SHARD)
    mount(master, "new", PER_SHARD)
    keys = [f"k{i}" for i in range(8)]
    for key in keys:
        put(master, key, 100, config=on("old"))
    master.graceful_unmount_segment("old", OWNER, 60_000)
    assert master.segment_status("old") == "GRACEFULLY_UNMOUNTING"
    assert master.segment_status("new") == "OK"
    for i in range(16):  # even when asked for by name, new puts go elsewhere
        put(master, f"after{i}", 100, config=on("old"))
        assert segments_of(master, f"after{i}") == ["new"]
    assert all(segments_of(master, key) == ["old"] for key in keys)
    assert master.usage().capacity_bytes == 2 * PER_SHARD * master.shards
    assert fsck(master).ok


def test_with_only_draining_segments_a_put_finds_no_space(master):
    mount(master, "old", PER_SHARD)
    master.graceful_unmount_segment("old", OWNER, 60_000)
    assert master.batch_put_start(WRITER, ["a", "b"], [100, 100]) == [ErrorCode.NO_AVAILABLE_HANDLE] * 2


def test_a_put_in_progress_on_a_draining_segment_completes(master):
    mount(master, "old", PER_SHARD)
    master.put_start(WRITER, "k", 100)
    master.graceful_unmount_segment("old", OWNER, 60_000)
    master.put_end(WRITER, "k")
    assert segments_of(master, "k") == ["old"]


def test_the_segment_goes_once_it_drains_before_its_grace_period_ends(master):
    mount(master, "old", PER_SHARD)
    mount(master, "new", PER_SHARD)
    put(master, "k", 100, config=on("old"))
    master.graceful_unmount_segment("old", OWNER, 60_000)
    assert master.finish_drains() == 0  # k still holds bytes of it
    assert master.segment_status("old") == "GRACEFULLY_UNMOUNTING"
    master.advance_clock(20_000)  # past k's lease
    master.remove("k")
    assert master.finish_drains() == 1
    assert master.segment_status("old") is None
    assert [s["name"] for s in master.segments()] == ["new"]
    assert master.usage().capacity_bytes == PER_SHARD * master.shards
    assert master.finish_drains() == 0  # idempotent: nothing left to finish
    assert fsck(master).ok


def test_the_grace_period_ends_it_with_its_objects(master):
    mount(master, "old", PER_SHARD)
    mount(master, "new", PER_SHARD)
    put(master, "gone", 100, config=on("old"))
    put(master, "kept", 100, config=on("new"))
    master.graceful_unmount_segment("old", OWNER, 5_000)
    master.advance_clock(4_999)
    assert master.finish_drains() == 0
    assert segments_of(master, "gone") == ["old"]
    master.advance_clock(1)
    assert master.finish_drains() == 1
    assert not master.exist_key("gone") and master.exist_key("kept")
    for shard in range(master.shards):
        master.sweep_shard(shard)
    assert fsck(master).ok


def test_a_second_call_keeps_the_earlier_deadline(master):
    mount(master, "old", PER_SHARD)
    put(master, "k", 100)
    master.graceful_unmount_segment("old", OWNER, 10_000)
    master.graceful_unmount_segment("old", OWNER, 50_000)  # later: ignored
    master.advance_clock(10_000)
    assert master.finish_drains() == 1
    mount(master, "again", PER_SHARD)
    put(master, "k2", 100)
    master.graceful_unmount_segment("again", OWNER, 50_000)
    master.graceful_unmount_segment("again", OWNER, 1_000)  # earlier: taken
    master.advance_clock(1_000)
    assert master.finish_drains() == 1


def test_a_grace_period_of_0_ends_at_the_next_worker_pass(master):
    mount(master, "old", PER_SHARD)
    put(master, "k", 100)
    master.graceful_unmount_segment("old", OWNER, 0)
    worker = Worker(master)
    first = worker.run_once()
    assert first.segments_drained == 1
    assert first.swept_objects + worker.run_once().swept_objects == 1  # another shard's sweep: its next pass
    assert master.segment_status("old") is None and not master.exist_key("k")
    assert fsck(master).ok


def test_a_plain_unmount_of_a_draining_segment_leaves_no_drain_behind(master):
    mount(master, "old", PER_SHARD)
    master.graceful_unmount_segment("old", OWNER, 60_000)
    master.unmount_segment("old", OWNER)
    assert all(master.redis.zcard(k.segments_draining) == 0 for k in master.transport.keys)
    mount(master, "old", PER_SHARD)  # mounted again: allocatable, not draining
    put(master, "k", 100)
    assert master.segment_status("old") == "OK" and master.finish_drains() == 0
    assert fsck(master).ok


@pytest.mark.parametrize("name, client, grace, code", [
    ("nope", OWNER, 1000, ErrorCode.SEGMENT_NOT_FOUND),
    ("old", "intruder", 1000, ErrorCode.ILLEGAL_CLIENT),
    ("old", OWNER, -1, ErrorCode.INVALID_PARAMS),
    ("old", OWNER, 10**15 + 1, ErrorCode.INVALID_PARAMS),
    ("", OWNER, 1000, ErrorCode.INVALID_PARAMS),
])
def test_refusals_write_nothing(master, name, client, grace, code):
    mount(master, "old", PER_SHARD)
    before = store_snapshot(master)
    with raises_code(code):
        master.graceful_unmount_segment(name, client, grace)
    assert store_snapshot(master) == before


def test_the_functions_check_their_arguments(master):
    mount(master, "old", PER_SHARD)
    t = master.transport
    for argv in ((3, "name", "old", "client_id", OWNER, "grace_ms", "1.5"),
                 (2, "name", "old", "client_id", OWNER),
                 (3, "name", "old", "client_id", OWNER, "grace_ms", "-1")):
        with raises_code(ErrorCode.INVALID_PARAMS):
            t.call("mc_graceful_unmount_segment", 0, *argv)
    for argv in ((2, "name", "old", "op", "2"), (1, "name", ""), (0,)):
        with raises_code(ErrorCode.INVALID_PARAMS):
            t.call("mc_finish_drain", 0, *argv)
    assert t.call("mc_finish_drain", 0, 1, "name", "old") == b"mounted"
    assert t.call("mc_finish_drain", 0, 1, "name", "nope") == b"gone"
    assert t.call("mc_finish_drain", 0, 2, "name", "old", "op", "drop") == 0  # not draining: left alone
    assert t.call("mc_finish_drain", 0, 2, "name", "old", "op", "relist") == 0
    assert master.segment_status("old") == "OK"


def test_fsck_finds_and_repairs_a_drain_the_worker_would_miss(master):
    mount(master, "old", PER_SHARD)
    mount(master, "other", PER_SHARD)
    master.graceful_unmount_segment("old", OWNER, 60_000)
    k = master.transport.keys[0]
    master.redis.zrem(k.segments_draining, "old")
    master.redis.zadd(k.segments_draining, {"other": 5})
    report = fsck(master)
    assert sorted((f.kind, f.subject) for f in report.findings) == [
        ("drain_stale", "segment other"), ("drain_unlisted", "segment old")]
    assert all(f.repaired for f in fsck(master, repair=True).findings) and fsck(master).ok
    assert master.redis.zscore(k.segments_draining, "old") == int(master.redis.hget(k.segment("old"), "draining_until"))
    master.redis.hset(k.segment("old"), "draining_until", "soon")
    assert [f.kind for f in fsck(master).findings] == ["drain_bad_deadline"]
