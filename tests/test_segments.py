"""Segments: mount, unmount (replicas hide at once, metadata freed) and client ping."""
from __future__ import annotations

from helpers import (OWNER, WRITER, all_shard_keys, free_extents, mount, present, put, raises_code, shard_of_key,
                     slice_of)
from mooncake_redis import ErrorCode, ReplicateConfig


def test_mount_is_idempotent(master):
    size = mount(master, "seg", 1 << 12)
    master.mount_segment("seg", size, OWNER)
    assert master.usage().capacity_bytes == size
    assert [(s["name"], s["size"], s["client"]) for s in master.segments()] == [("seg", size, OWNER)]
    put(master, "k", 100)
    master.mount_segment("seg", size, OWNER)  # a remount with the same parameters keeps the data
    assert master.usage().capacity_bytes == size and master.usage().used_bytes == 100
    assert master.get_replica_list("k").replicas[0].segment == "seg"


def test_mount_same_name_with_other_parameters_is_segment_already_exists(master):
    size = mount(master, "seg", 1 << 12)
    with raises_code(ErrorCode.SEGMENT_ALREADY_EXISTS):
        master.mount_segment("seg", size * 2, OWNER)
    with raises_code(ErrorCode.SEGMENT_ALREADY_EXISTS):
        master.mount_segment("seg", size, "another-client")
    with raises_code(ErrorCode.SEGMENT_ALREADY_EXISTS):
        master.mount_segment("seg", size, OWNER, base=1 << 20)
    assert master.usage().capacity_bytes == size
    assert [(s["name"], s["size"], s["client"]) for s in master.segments()] == [("seg", size, OWNER)]


def test_mount_adds_capacity_and_offsets_start_at_base(master):
    base = 1 << 40
    size = mount(master, "seg", 1 << 12, base=base)
    assert master.usage().capacity_bytes == size
    r = master.put_start(WRITER, "k", 100)[0]
    lo, length = slice_of(master, size, shard_of_key(master, "k"), base=base)
    assert lo <= r.offset and r.offset + 100 <= lo + length


def test_unmount_by_another_client_is_illegal_client(master):
    size = mount(master, "seg", 1 << 12)
    put(master, "k", 100)
    with raises_code(ErrorCode.ILLEGAL_CLIENT):
        master.unmount_segment("seg", "intruder")
    assert master.usage().capacity_bytes == size and master.usage().used_bytes == 100
    assert master.get_replica_list("k").replicas[0].segment == "seg"


def test_unmount_unknown_segment_is_segment_not_found(master):
    with raises_code(ErrorCode.SEGMENT_NOT_FOUND):
        master.unmount_segment("nope", OWNER)
    mount(master, "seg", 1 << 12)
    master.unmount_segment("seg", OWNER)
    with raises_code(ErrorCode.SEGMENT_NOT_FOUND):
        master.unmount_segment("seg", OWNER)  # a second unmount


def test_unmount_drops_its_replicas_and_metadata(master):
    size_a = mount(master, "a", 1 << 12)
    size_b = mount(master, "b", 1 << 12)
    put(master, "only-a", 100, config=ReplicateConfig(preferred_segments=("a",)))
    put(master, "both", 200, config=ReplicateConfig(replica_num=2))
    put(master, "only-b", 300, config=ReplicateConfig(preferred_segments=("b",)))
    master.put_start(WRITER, "busy-a", 50, ReplicateConfig(preferred_segments=("a",)))
    assert master.usage().used_bytes == 100 + 400 + 300 + 50
    deleted = master.unmount_segment("a", OWNER)
    assert deleted == 2  # only-a and busy-a had no other replica
    usage = master.usage()
    assert usage.capacity_bytes == size_b
    assert usage.used_bytes == 200 + 300 and usage.objects == 2
    assert present(master, ["only-a", "busy-a", "both", "only-b"]) == [False, False, True, True]
    with raises_code(ErrorCode.OBJECT_NOT_FOUND):
        master.get_replica_list("only-a")
    assert [r.segment for r in master.describe("both").replicas] == ["b"]
    assert [r.segment for r in master.get_replica_list("both").replicas] == ["b"]
    assert [s["name"] for s in master.segments()] == ["b"]
    for shard in range(master.shards):
        assert free_extents(master, shard, "a") == []
    assert size_a == size_b


def test_unmount_hides_replicas_at_once(master):
    """The unmount function alone (before any sweep) already hides the segment's replicas."""
    mount(master, "a", 1 << 12)
    size_b = mount(master, "b", 1 << 12)
    put(master, "only-a", 100, config=ReplicateConfig(preferred_segments=("a",)))
    put(master, "both", 200, config=ReplicateConfig(replica_num=2))
    for p in all_shard_keys(master):  # the raw per-shard step, without the client's sweep
        master.redis.execute_command("FCALL", "mc_unmount_segment", 1, p.P, 2, "name", "a", "client_id", OWNER)
    assert master.usage().capacity_bytes == size_b and master.usage().used_bytes == 200
    with raises_code(ErrorCode.OBJECT_NOT_FOUND):
        master.get_replica_list("only-a")
    assert master.exist_key("only-a") is False
    assert [r.segment for r in master.get_replica_list("both").replicas] == ["b"]
    assert [r.segment for r in master.describe("both").replicas] == ["b"]
    assert master.batch_exist_key(["only-a", "both"]) == [False, True]


def test_remount_after_unmount_starts_empty(master):
    size = mount(master, "seg", 1 << 12)
    put(master, "k", 100)
    master.unmount_segment("seg", OWNER)
    mount(master, "seg", 1 << 12)
    assert master.usage().capacity_bytes == size and master.usage().used_bytes == 0
    assert present(master, ["k"]) == [False]
    for shard in range(master.shards):
        assert free_extents(master, shard, "seg") == [slice_of(master, size, shard)]


def test_ping_wants_a_remount_until_the_client_mounted(master):
    assert master.ping("client-x") == "NEED_REMOUNT"
    mount(master, "seg", 1 << 12, client="client-x")
    assert master.ping("client-x") == "OK"
    assert master.ping("client-y") == "NEED_REMOUNT"


def test_ping_alone_does_not_make_a_client_known(master):
    """A client that never mounted stays unknown however often it pings."""
    assert master.ping("client-x") == "NEED_REMOUNT"
    assert master.ping("client-x") == "NEED_REMOUNT"
