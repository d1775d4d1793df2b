"""Placement: the host index (mount_segment's host, P:hsegs:<host>), put_start's prefer_same_host
(Mooncake's prefer_alloc_in_same_node / host_id) and the store's allocation_strategy."""
from __future__ import annotations

import pytest

from helpers import OWNER, WRITER, code_of, put, raises_code, shard_keys, watched_silence
from mooncake_redis import ErrorCode, MasterConfig, MasterError, ReplicateConfig
from mooncake_redis.fsck import fsck


def host_members(m, host: str) -> list[set[bytes]]:
    return [m.redis.smembers(shard_keys(m, shard).host_segments(host)) for shard in range(m.shards)]


def mount_on(m, name: str, per_shard: int, host: str | None, client: str = OWNER) -> None:
    m.mount_segment(name, per_shard * m.shards, client, host=host)


def local(host: str, replica_num: int = 1, **kw) -> ReplicateConfig:
    return ReplicateConfig(replica_num=replica_num, host=host, prefer_same_host=True, **kw)


# ---- the host index ------------------------------------------------------------------------

def test_mount_with_a_host_indexes_the_segment_on_every_shard_until_unmount(master):
    mount_on(master, "a", 1000, "node-1")
    mount_on(master, "b", 1000, "node-1")
    mount_on(master, "c", 1000, None)
    assert host_members(master, "node-1") == [{b"a", b"b"}] * master.shards
    master.mount_segment("a", 1000 * master.shards, OWNER, host="node-1")  # idempotent
    assert host_members(master, "node-1") == [{b"a", b"b"}] * master.shards
    master.unmount_segment("a", OWNER)
    assert host_members(master, "node-1") == [{b"b"}] * master.shards
    master.unmount_segment("b", OWNER)
    assert all(not master.redis.exists(shard_keys(master, s).host_segments("node-1")) for s in range(master.shards))
    assert fsck(master).ok


def test_a_remount_with_another_host_moves_the_segment(master):
    mount_on(master, "a", 1000, None)
    mount_on(master, "a", 1000, "node-1")  # a segment mounted before hosts were known gets one
    assert host_members(master, "node-1") == [{b"a"}] * master.shards
    mount_on(master, "a", 1000, "node-2")
    assert host_members(master, "node-1") == [set()] * master.shards
    assert host_members(master, "node-2") == [{b"a"}] * master.shards
    mount_on(master, "a", 1000, None)  # no host given: the recorded one stays
    assert host_members(master, "node-2") == [{b"a"}] * master.shards
    assert fsck(master).ok


def test_expiry_and_a_finished_drain_leave_the_host_index(new_master):
    m = new_master(client_ttl=1000)
    mount_on(m, "gone", 1000, "node-1", client="dead")
    mount_on(m, "drained", 1000, "node-1")
    watched_silence(m, 3000, ping=(OWNER,))
    assert host_members(m, "node-1") == [{b"drained"}] * m.shards
    m.graceful_unmount_segment("drained", OWNER, 0)
    assert m.finish_drains() == 1
    assert host_members(m, "node-1") == [set()] * m.shards
    assert fsck(m).ok


def test_a_host_holds_at_most_64_segments(new_master):
    m = new_master(shards=1)
    for i in range(64):
        mount_on(m, f"s{i}", 100, "node-1")
    before = m.usage().capacity_bytes
    with raises_code(ErrorCode.HOST_SEGMENTS_EXCEEDED):
        mount_on(m, "s64", 100, "node-1")
    assert m.usage().capacity_bytes == before and m.segment_status("s64") is None
    mount_on(m, "s0", 100, "node-1")  # a member mounting again is not a 65th
    mount_on(m, "other", 100, "node-2")
    mount_on(m, "later", 100, None)
    with raises_code(ErrorCode.HOST_SEGMENTS_EXCEEDED):
        mount_on(m, "later", 100, "node-1")  # nor may a remount move a segment onto a full host
    m.unmount_segment("s0", OWNER)
    mount_on(m, "s64", 100, "node-1")


def test_bad_hosts_are_invalid_params(master):
    for bad in ("", "x" * 257):
        with raises_code(ErrorCode.INVALID_PARAMS):
            master.mount_segment("a", 1000 * master.shards, OWNER, host=bad)
    with raises_code(ErrorCode.INVALID_PARAMS):
        master.put_start(WRITER, "k", 10, ReplicateConfig(prefer_same_host=True))
    t = master.transport
    with pytest.raises(MasterError, match="prefer_same_host needs"):
        t.call("mc_put_start", 0, 2, "client_id", WRITER, "prefer_same_host", "1", 2, "key", "size", "k", "10")
    with pytest.raises(MasterError, match="prefer_same_host must be 0 or 1"):
        t.call("mc_put_start", 0, 3, "client_id", WRITER, "host", "h", "prefer_same_host", "yes", 2,
               "key", "size", "k", "10")
    with pytest.raises(MasterError, match="host must be"):
        t.call("mc_put_start", 0, 3, "client_id", WRITER, "host", "x" * 257, "prefer_same_host", "1", 2,
               "key", "size", "k", "10")


# ---- prefer_same_host ----------------------------------------------------------------------

def test_prefer_same_host_places_on_the_writers_host(master):
    mount_on(master, "big", 10_000, "node-2")
    mount_on(master, "h1", 1000, "node-1")
    mount_on(master, "h2", 2000, "node-1")
    assert put(master, "plain", 10)[0].segment == "big"  # most_free
    assert put(master, "local", 10, config=local("node-1"))[0].segment == "h2"  # the host's most free
    assert put(master, "elsewhere", 10, config=local("node-9"))[0].segment == "big"  # no segment there
    # a host without room: the normal strategy
    assert put(master, "large", 5000, config=local("node-1"))[0].segment == "big"
    # preferred segments come first, then the host
    assert put(master, "pref", 10, config=local("node-1", preferred_segments=("big",)))[0].segment == "big"
    # a host alone (no prefer_same_host) changes nothing
    assert put(master, "host-only", 10, config=ReplicateConfig(host="node-1"))[0].segment == "big"


def test_prefer_same_host_takes_one_replica_there_and_the_others_elsewhere(master):
    mount_on(master, "h1", 3000, "node-1")
    mount_on(master, "h2", 2000, "node-1")
    mount_on(master, "o1", 1000, "node-2")
    mount_on(master, "o2", 1000, "node-3")
    segs = [r.segment for r in put(master, "k", 10, config=local("node-1", replica_num=3))]
    assert segs[0] == "h1" and len(set(segs)) == 3
    # the strategy may still choose the host's other segments (here the most free)
    assert set(segs[1:]) == {"h2", "o1"} or set(segs[1:]) == {"h2", "o2"}


def test_prefer_same_host_skips_draining_and_full_host_segments(master):
    mount_on(master, "h1", 1000, "node-1")
    mount_on(master, "h2", 500, "node-1")
    mount_on(master, "o", 4000, "node-2")
    master.graceful_unmount_segment("h1", OWNER, 60_000)
    assert put(master, "a", 400, config=local("node-1"))[0].segment == "h2"
    assert put(master, "b", 400, config=local("node-1"))[0].segment == "o"  # h2 has 100 bytes left
    assert put(master, "c", 100, config=local("node-1"))[0].segment == "h2"


def test_a_batch_prefers_the_host_while_it_has_room(master):
    mount_on(master, "h", 300, "node-1")
    mount_on(master, "o", 10_000, "node-2")
    keys = [f"{{t}}k{i}" for i in range(5)]  # one shard
    replicas = master.batch_put_start(WRITER, keys, [100] * 5, local("node-1"))
    assert [r[0].segment for r in replicas] == ["h", "h", "h", "o", "o"]


def test_prefer_same_host_with_evict_on_put_evicts_then_uses_the_host(new_master):
    m = new_master(shards=1)
    mount_on(m, "h", 1000, "node-1")
    put(m, "old", 1000)
    assert put(m, "new", 500, config=local("node-1"))[0].segment == "h"
    assert code_of(m.describe, "old") == ErrorCode.OBJECT_NOT_FOUND


def test_fsck_finds_and_repairs_the_host_index(master):
    mount_on(master, "a", 1000, "node-1")
    mount_on(master, "b", 1000, "node-1")
    k = shard_keys(master, 0)
    master.redis.srem(k.host_segments("node-1"), "a")
    master.redis.sadd(k.host_segments("node-1"), "ghost")
    master.redis.sadd(k.host_segments("node-2"), "b")
    report = fsck(master)
    assert report.kinds() == {"host_index_missing": 1, "host_index_stale": 2}
    report = fsck(master, repair=True)
    assert fsck(master).ok
    assert host_members(master, "node-1")[0] == {b"a", b"b"}
    assert host_members(master, "node-2")[0] == set()
    assert master.transport.call("mc_fsck_host_index", 0, "a", "node-1") == 1
    assert master.transport.call("mc_fsck_host_index", 0, "nope", "node-1") == 0
    with raises_code(ErrorCode.INVALID_PARAMS):
        master.transport.call("mc_fsck_host_index", 0, "a")


# ---- allocation_strategy -------------------------------------------------------------------

def test_the_strategy_is_checked_and_stored():
    with raises_code(ErrorCode.INVALID_PARAMS):
        MasterConfig(allocation_strategy="local_first")
    stored = MasterConfig(allocation_strategy="random").to_redis()
    assert stored["allocation_strategy"] == "random"
    assert MasterConfig.from_redis("mc", {b"allocation_strategy": b"free_ratio_first"}).allocation_strategy == \
        "free_ratio_first"


def test_free_ratio_first_picks_the_emptiest_segment_most_free_the_largest(new_master):
    for strategy, want in (("most_free", "big"), ("free_ratio_first", "small")):
        m = new_master(allocation_strategy=strategy, shards=1)
        mount_on(m, "big", 1000, None)
        mount_on(m, "small", 200, None)
        put(m, "fill", 600, config=ReplicateConfig(preferred_segments=("big",)))  # big: 400 free (0.4)
        assert put(m, "k", 10)[0].segment == want, strategy


def test_random_spreads_over_the_segments_with_room(new_master):
    m = new_master(allocation_strategy="random", shards=1)
    for name in ("a", "b", "c"):
        mount_on(m, name, 100_000, None)
    mount_on(m, "full", 50, None)
    put(m, "fill", 50, config=ReplicateConfig(preferred_segments=("full",)))
    used = {put(m, f"k{i}", 10)[0].segment for i in range(60)}
    assert used == {"a", "b", "c"}


@pytest.mark.parametrize("strategy", ["random", "free_ratio_first"])
def test_a_sampling_strategy_still_finds_the_one_segment_with_room(new_master, strategy):
    m = new_master(allocation_strategy=strategy, shards=1)
    for i in range(40):  # more segments than one search samples
        mount_on(m, f"s{i:02}", 10, None)
    mount_on(m, "roomy", 1000, None)
    assert put(m, "k", 500)[0].segment == "roomy"
    assert put(m, "k2", 400, config=ReplicateConfig(replica_num=3))[0].segment == "roomy"  # the only one


def test_a_store_without_the_field_allocates_most_free_and_a_bad_one_is_refused(master):
    mount_on(master, "a", 1000, None)
    for shard in range(master.shards):
        master.redis.hdel(shard_keys(master, shard).config, "allocation_strategy")
    assert put(master, "k", 10)[0].segment == "a"
    master.redis.hset(shard_keys(master, 0).config, "allocation_strategy", "bogus")
    with pytest.raises(MasterError, match="allocation_strategy = bogus") as info:
        master.transport.call("mc_put_start", 0, 1, "client_id", WRITER, 2, "key", "size", "k2", "10")
    assert info.value.code == ErrorCode.INTERNAL_ERROR
