"""Reads (get_replica_list, exist_key and their batch forms) and the leases they grant,
including the shared lease of a group."""
from __future__ import annotations

import random

import pytest

from helpers import (WRITER, all_shard_keys, key_not_on_shard, mount, put, raises_code, shard_of_key,
                     store_snapshot)
from mooncake_redis import ErrorCode, ReplicaListResult, ReplicaStatus, ReplicateConfig
from mooncake_redis.fsck import fsck


@pytest.fixture
def m(master):
    for name in ("s1", "s2"):
        mount(master, name, 1 << 16)
    return master


# ---- what is readable ----------------------------------------------------------------------

def test_in_progress_object_is_not_ready(m):
    m.put_start(WRITER, "k", 100, ReplicateConfig(replica_num=2))
    with raises_code(ErrorCode.REPLICA_IS_NOT_READY):
        m.get_replica_list("k")
    assert m.exist_key("k") is False
    assert m.describe("k").lease_until_ms == 0  # a refused read leases nothing


def test_missing_object_is_not_found(m):
    with raises_code(ErrorCode.OBJECT_NOT_FOUND):
        m.get_replica_list("nope")
    assert m.exist_key("nope") is False


def test_complete_object_reads_its_replicas(m):
    started = m.put_start(WRITER, "k", 100, ReplicateConfig(replica_num=2))
    m.put_end(WRITER, "k")
    got = m.get_replica_list("k")
    assert isinstance(got, ReplicaListResult)
    assert sorted((r.segment, r.offset, r.size) for r in got.replicas) == sorted(
        (r.segment, r.offset, r.size) for r in started)
    assert all(r.status == ReplicaStatus.COMPLETE for r in got.replicas)
    assert m.exist_key("k") is True


# ---- leases --------------------------------------------------------------------------------

def test_read_leases_until_now_plus_default_ttl(new_master):
    master = new_master(default_kv_lease_ttl=2_500)
    mount(master, "seg", 1 << 16)
    put(master, "k", 100)
    t = master.now_ms()
    got = master.get_replica_list("k")
    assert got.lease_ttl_ms == 2_500
    assert master.describe("k").lease_until_ms == t + 2_500
    with raises_code(ErrorCode.OBJECT_HAS_LEASE):
        master.remove("k")
    master.advance_clock(1_000)
    assert master.exist_key("k") is True  # exist_key is a read too: it extends the lease
    assert master.describe("k").lease_until_ms == t + 1_000 + 2_500
    master.advance_clock(2_499)
    with raises_code(ErrorCode.OBJECT_HAS_LEASE):
        master.remove("k")
    master.advance_clock(1)  # lease_until == now: the lease is over
    master.remove("k")
    assert master.usage().used_bytes == 0


def test_read_never_shortens_a_lease(m):
    put(m, "k", 100)
    t = m.now_ms()
    m.get_replica_list("k")
    assert m.describe("k").lease_until_ms == t + 10_000
    # the store-wide lease TTL is lowered (config lives in each shard's config hash)
    for p in all_shard_keys(m):
        m.redis.hset(p.config, "default_kv_lease_ttl", 1_000)
    m.advance_clock(500)
    got = m.get_replica_list("k")
    assert m.describe("k").lease_until_ms == t + 10_000  # max(lease_until, now + ttl)
    # the reply is the lease this read grants at least (the tier's score, which holds the lease
    # of an unprotected object, is not read back)
    assert 1_000 <= got.lease_ttl_ms <= 10_000 - 500


def test_describe_grants_no_lease(m):
    put(m, "k", 100)
    before = m.describe("k")
    m.advance_clock(10)
    after = m.describe("k")
    assert after.lease_until_ms == before.lease_until_ms < m.now_ms()
    m.remove("k")  # not OBJECT_HAS_LEASE


def test_exist_key_and_batch_reads_lease(m):
    for k in ("a", "b", "c"):
        put(m, k, 10)
    t = m.now_ms()
    assert m.exist_key("a")
    m.batch_exist_key(["b"])
    m.batch_get_replica_list(["c"])
    for k in ("a", "b", "c"):
        assert m.describe(k).lease_until_ms == t + 10_000
        with raises_code(ErrorCode.OBJECT_HAS_LEASE):
            m.remove(k)


def renewal(until_ms: int, slack: int) -> int:
    """A renewed lease: until_ms rounded up to a multiple of the slack."""
    return -(-until_ms // slack) * slack


def test_lease_slack_renews_past_the_ttl_and_a_read_within_it_writes_nothing(new_master):
    m = new_master(default_kv_lease_ttl=2_500, kv_lease_slack=500)
    mount(m, "seg", 1 << 16)
    put(m, "k", 100)
    m.advance_clock(1)
    t = m.now_ms()
    lease = renewal(t + 2_500, 500)
    assert t + 2_500 < lease < t + 3_000
    assert m.get_replica_list("k").lease_ttl_ms == lease - t  # renewed: ttl, rounded up to the slack
    assert m.describe("k").lease_until_ms == lease
    for step in (300, lease - t - 2_500 - 300):  # now + ttl still within the lease: nothing is written
        m.advance_clock(step)
        before = store_snapshot(m)
        assert m.exist_key("k") and m.batch_get_replica_list(["k"])[0].lease_ttl_ms == lease - m.now_ms()
        assert store_snapshot(m) == before
    m.advance_clock(1)  # now + ttl passes the lease: renewed again, to the next multiple of the slack
    assert m.get_replica_list("k").lease_ttl_ms == lease + 500 - m.now_ms()
    assert m.describe("k").lease_until_ms == lease + 500
    assert fsck(m).ok  # the eviction tier's score follows the lease


def test_lease_slack_renews_a_group_lease_once_for_its_members(m):
    for p in all_shard_keys(m):
        m.redis.hset(p.config, "kv_lease_slack", 1_000)
    for k in ("{g1}/a", "{g1}/b"):
        put(m, k, 10, config=group_cfg())
    m.advance_clock(1)
    t = m.now_ms()
    lease = renewal(t + 10_000, 1_000)
    m.exist_key("{g1}/a")
    assert m.describe("{g1}/b").lease_until_ms == lease
    m.advance_clock(lease - t - 10_000)
    before = store_snapshot(m)
    assert m.batch_exist_key(["{g1}/a", "{g1}/b"]) == [True, True]
    assert store_snapshot(m) == before
    m.advance_clock(1)
    m.exist_key("{g1}/b")
    assert m.describe("{g1}/a").lease_until_ms == lease + 1_000


def test_a_read_always_leaves_at_least_the_ttl_and_at_most_ttl_plus_slack(new_master):
    """Whatever the order of reads and clock steps, a read at `now` leaves the lease in
    [now + ttl, now + ttl + slack] (a lease is never shortened, so the upper bound holds for one
    granted by reads alone)."""
    rng = random.Random(7)
    ttl, slack = 1_000, 300
    m = new_master(default_kv_lease_ttl=ttl, kv_lease_slack=slack)
    mount(m, "seg", 1 << 16)
    keys = [f"k{i}" for i in range(6)]
    for k in keys:
        put(m, k, 10)
    for _ in range(60):
        m.advance_clock(rng.choice((0, 1, 50, 299, 300, 301, 1_000, 1_301)))
        chosen = rng.sample(keys, rng.randint(1, len(keys)))
        read = rng.choice((m.batch_exist_key, m.batch_get_replica_list))
        read(chosen)
        now = m.now_ms()
        for k in chosen:
            until = m.describe(k).lease_until_ms
            assert now + ttl <= until <= now + ttl + slack, (k, now, until)
    assert fsck(m).ok


# ---- batches -------------------------------------------------------------------------------

def test_batch_reads_return_one_result_per_key_in_order(m):
    complete = [f"done-{i}" for i in range(6)]
    for i, k in enumerate(complete):
        put(m, k, 10 + i)
    m.put_start(WRITER, "busy", 7)
    keys = [complete[0], "missing-1", "busy", complete[1], "", complete[2], "missing-2"] + complete[3:] + ["busy"]
    if m.shards > 1:
        assert len({shard_of_key(m, k) for k in keys}) > 1
    out = m.batch_get_replica_list(keys)
    assert len(out) == len(keys)
    expected_codes = {"missing-1": ErrorCode.OBJECT_NOT_FOUND, "missing-2": ErrorCode.OBJECT_NOT_FOUND,
                      "": ErrorCode.OBJECT_NOT_FOUND, "busy": ErrorCode.REPLICA_IS_NOT_READY}
    for key, result in zip(keys, out):
        if key in expected_codes:
            assert result == expected_codes[key], key
        else:
            assert isinstance(result, ReplicaListResult), key
            assert [r.size for r in result.replicas] == [10 + complete.index(key)], key
    assert m.batch_exist_key(keys) == [k not in expected_codes for k in keys]
    assert m.batch_get_replica_list([]) == [] and m.batch_exist_key([]) == []


def test_a_replica_under_another_mount_id_is_dead_after_reads_of_live_ones_of_its_segment(m):
    """Reads remember the one-replica tails (mount id, segment) they found live; a replica of the
    same segment under another mount id (as an older mount left it) is another tail: dead, and
    its object gone for readers, while the live ones still read."""
    keys = ["live", "stale-1", "stale-2"]
    for k in keys:
        put(m, k, 10, config=ReplicateConfig(preferred_segments=("s1",)))
    put(m, "two", 10, config=ReplicateConfig(replica_num=2))
    assert m.batch_exist_key(keys + ["two"]) == [True] * 4
    assert [r.segment for r in m.get_replica_list("stale-1").replicas] == ["s1"]

    def stale(k: str) -> None:
        okey = next(iter(m.redis.keys(f"*:obj:default:{k}")))
        off, mount_id, rest = m.redis.hget(okey, "reps").decode().split(" ", 2)
        m.redis.hset(okey, "reps", f"{off} {int(mount_id) + 1000} {rest}")

    stale("stale-1")
    assert m.batch_exist_key(keys + ["two"]) == [True, False, True, True]  # in a batch
    stale("stale-2")
    with raises_code(ErrorCode.OBJECT_NOT_FOUND):  # alone
        m.get_replica_list("stale-2")
    assert [r.segment for r in m.get_replica_list("live").replicas] == ["s1"]
    assert sorted(r.segment for r in m.get_replica_list("two").replicas) == ["s1", "s2"]
    assert m.exist_key("stale-1") is False and m.exist_key("live") is True


# ---- groups --------------------------------------------------------------------------------

def group_cfg(group: str = "g1") -> ReplicateConfig:
    return ReplicateConfig(group_id=group)


def test_group_members_share_one_lease(m):
    for k in ("{g1}/a", "{g1}/b", "{g1}/c"):
        put(m, k, 10, config=group_cfg())
    put(m, "{g1}/loner", 10)  # same shard, not a member
    t = m.now_ms()
    m.get_replica_list("{g1}/a")
    for k in ("{g1}/a", "{g1}/b", "{g1}/c"):
        assert m.describe(k).lease_until_ms == t + 10_000, k
    with raises_code(ErrorCode.OBJECT_HAS_LEASE):
        m.remove("{g1}/b")
    m.remove("{g1}/loner")  # the group lease is not the loner's
    m.remove("{g1}/c", force=True)
    m.advance_clock(10_000)
    m.remove("{g1}/b")
    m.remove("{g1}/a")
    assert m.usage().objects == 0 and m.usage().used_bytes == 0


def test_a_batch_leases_each_group_of_its_keys_as_single_reads_do(m):
    """A batch whose keys of one group come one after another reads the group's record once and
    renews its lease once: every group a batch touches, in any order and beside keys of other
    groups, ends with the lease single reads would give it, and fsck agrees."""
    for g in ("g1", "g2"):
        for k in ("a", "b"):
            put(m, f"{{{g}}}/{k}", 10, config=group_cfg(g))
    put(m, "{g1}/plain", 10)
    m.advance_clock(1_000)
    t = m.now_ms()
    keys = ["{g1}/a", "{g1}/b", "{g2}/a", "{g1}/plain", "{g2}/b", "{g1}/a", "missing"]
    assert m.batch_exist_key(keys) == [True, True, True, True, True, True, False]
    for k in ("{g1}/a", "{g1}/b", "{g2}/a", "{g2}/b", "{g1}/plain"):
        assert m.describe(k).lease_until_ms == t + 10_000, k
    m.advance_clock(500)
    assert [r.replicas != [] for r in m.batch_get_replica_list(["{g2}/a", "{g2}/b"])] == [True, True]
    assert m.describe("{g2}/b").lease_until_ms == t + 10_500 and m.describe("{g1}/b").lease_until_ms == t + 10_000
    assert fsck(m).ok


def test_group_lease_is_per_group_and_tenant(m):
    put(m, "{g1}/a", 10, config=group_cfg("g1"))
    put(m, "{g1}/b", 10, config=group_cfg("g1"))
    put(m, "{g1}/x", 10, config=group_cfg("g1"), tenant_id="other")
    put(m, "{g2}/y", 10, config=group_cfg("g2"))
    m.exist_key("{g1}/a")
    with raises_code(ErrorCode.OBJECT_HAS_LEASE):
        m.remove("{g1}/b")
    m.remove("{g1}/x", tenant_id="other")  # same group name, other tenant: another group
    m.remove("{g2}/y")  # another group


def test_group_member_on_another_shard_is_invalid_params(m):
    if m.shards == 1:
        pytest.skip("one shard: every key shares the group's shard")
    group = "g1"
    wrong = key_not_on_shard(m, shard_of_key(m, group))
    with raises_code(ErrorCode.INVALID_PARAMS):
        m.put_start(WRITER, wrong, 10, group_cfg(group))
    out = m.batch_put_start(WRITER, ["{g1}/ok", wrong, "{g1}/ok2"], [10, 10, 10], group_cfg(group))
    assert out[1] == ErrorCode.INVALID_PARAMS
    assert [r.size for r in out[0]] == [10] and [r.size for r in out[2]] == [10]
    assert m.usage().objects == 2 and m.usage().used_bytes == 20
    with raises_code(ErrorCode.OBJECT_NOT_FOUND):
        m.describe(wrong)
    assert m.describe("{g1}/ok").group_id == group
