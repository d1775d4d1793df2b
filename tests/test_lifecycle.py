"""The put lifecycle: put_start validation, existence / preemption, replica placement,
put_end, put_revoke, tenants, batch puts and the raw FCALL contract."""
from __future__ import annotations

import pytest

from helpers import WRITER, keys_of, keys_on_shard, mount, put, raises_code, shard_keys, shard_of_key
from mooncake_redis import ErrorCode, ReplicaStatus, ReplicateConfig
from mooncake_redis.keys import shard_of

pytestmark = pytest.mark.cluster  # these API tests run on the test cluster too (conftest)


# ---- put_start: parameters ---------------------------------------------------------------

def test_put_start_rejects_empty_and_overlong_keys(new_master):
    m = new_master(max_key_length=16)
    mount(m, "seg", 1 << 16)
    with raises_code(ErrorCode.INVALID_PARAMS):
        m.put_start(WRITER, "", 100)
    with raises_code(ErrorCode.INVALID_PARAMS):
        m.put_start(WRITER, "k" * 17, 100)
    assert m.usage().used_bytes == 0 and m.usage().objects == 0
    m.put_start(WRITER, "k" * 16, 100)  # exactly the limit is fine
    assert m.usage().used_bytes == 100 and m.usage().objects == 1
    assert not m.exist_key("k" * 17)


def test_put_start_default_max_key_length_is_4096(master):
    mount(master, "seg", 1 << 16)
    master.put_start(WRITER, "k" * 4096, 10)
    with raises_code(ErrorCode.INVALID_PARAMS):
        master.put_start(WRITER, "k" * 4097, 10)
    assert master.usage().used_bytes == 10


@pytest.mark.parametrize("size", [0, -1, -4096])
def test_put_start_rejects_non_positive_size(master, size):
    mount(master, "seg", 1 << 16)
    with raises_code(ErrorCode.INVALID_PARAMS):
        master.put_start(WRITER, "k", size)
    assert master.usage().used_bytes == 0
    with raises_code(ErrorCode.OBJECT_NOT_FOUND):
        master.describe("k")


@pytest.mark.parametrize("replica_num", [0, -1])
def test_put_start_rejects_replica_num_below_one(master, replica_num):
    mount(master, "seg", 1 << 16)
    with raises_code(ErrorCode.INVALID_PARAMS):
        master.put_start(WRITER, "k", 10, ReplicateConfig(replica_num=replica_num))
    assert master.usage().used_bytes == 0 and master.usage().objects == 0


# ---- put_start: an existing key ------------------------------------------------------------

def test_put_start_on_complete_object_is_already_exists(master):
    mount(master, "seg", 1 << 16)
    put(master, "k", 100)
    master.advance_clock(master.config.put_start_release_timeout * 2)  # age does not matter
    for client in (WRITER, "someone-else"):
        with raises_code(ErrorCode.OBJECT_ALREADY_EXISTS):
            master.put_start(client, "k", 100)
    assert master.usage().used_bytes == 100
    assert master.describe("k").status == ReplicaStatus.COMPLETE


def test_put_start_on_recent_unfinished_put_is_already_exists(new_master):
    m = new_master(put_start_discard_timeout=1_000)
    mount(m, "seg", 1 << 16)
    t0 = m.now_ms()
    m.put_start("c1", "k", 100)
    m.advance_clock(999)
    with raises_code(ErrorCode.OBJECT_ALREADY_EXISTS):
        m.put_start("c2", "k", 100)
    info = m.describe("k")
    assert info.writer == "c1" and info.put_started_ms == t0 and info.status == ReplicaStatus.PROCESSING
    assert m.usage().used_bytes == 100


def test_abandoned_put_is_preempted_and_its_space_held_until_release(new_master):
    m = new_master(put_start_discard_timeout=1_000, put_start_release_timeout=5_000)
    mount(m, "seg", 200)  # every shard slice holds exactly two 100-byte objects
    t0 = m.now_ms()
    old = m.put_start("c1", "{t}a", 100)
    m.advance_clock(1_000)  # the discard timeout has passed: the put is abandoned
    new = m.put_start("c2", "{t}a", 100)
    assert new[0].offset != old[0].offset  # the old extent is still held
    info = m.describe("{t}a")
    assert info.writer == "c2" and info.put_started_ms == t0 + 1_000 and info.status == ReplicaStatus.PROCESSING
    assert [r.offset for r in info.replicas] == [new[0].offset]
    usage = m.usage()
    assert usage.used_bytes == 200 and usage.objects == 1  # old space held, counted as used
    with raises_code(ErrorCode.ILLEGAL_CLIENT):
        m.put_end("c1", "{t}a")  # the old writer lost the object

    m.advance_clock(3_999)  # t0 + 4999: one ms before the release deadline
    with raises_code(ErrorCode.NO_AVAILABLE_HANDLE):
        m.put_start("c3", "{t}b", 100)  # same shard as {t}a; the held extent is not free
    assert m.usage().used_bytes == 200

    m.advance_clock(1)  # t0 + 5000 = start + put_start_release_timeout
    again = m.put_start("c3", "{t}b", 100)  # this put_start releases the held extent first
    assert again[0].offset == old[0].offset
    assert m.usage().used_bytes == 200 and m.usage().objects == 2
    m.put_end("c2", "{t}a")
    m.put_end("c3", "{t}b")
    m.remove("{t}a")
    m.remove("{t}b")
    assert m.usage().used_bytes == 0


def test_preempted_space_is_released_by_a_later_put_start(new_master):
    m = new_master(put_start_discard_timeout=1_000, put_start_release_timeout=5_000)
    mount(m, "seg", 1 << 16)
    m.put_start("c1", "{t}a", 300)
    m.advance_clock(2_000)
    m.put_start("c2", "{t}a", 100)  # preempts, the 300 bytes stay held
    assert m.usage().used_bytes == 400
    m.advance_clock(10_000)
    assert m.usage().used_bytes == 400  # nothing happens by itself (no worker here)
    m.put_start("c3", "{t}c", 50)
    assert m.usage().used_bytes == 150


def test_the_held_bound_follows_the_held_extents(new_master):
    """P:config's held_due is the first deadline of P:held ('none': nothing held), so that a
    put_start looks at P:held only once something may be due; a store without the field (an
    earlier package's) gets it at the next put_start."""
    m = new_master(put_start_discard_timeout=1_000, put_start_release_timeout=5_000)
    mount(m, "seg", 1 << 16)
    p = keys_of(m, "{t}a")
    bound = lambda: m.redis.hget(p.config, "held_due")  # noqa: E731
    t0 = m.now_ms()
    m.put_start("c1", "{t}a", 300)
    assert bound() == b"none"  # swept once: nothing held
    m.advance_clock(1_000)
    m.put_start("c1", "{t}b", 200)
    m.advance_clock(1_000)
    m.put_start("c2", "{t}a", 100)  # preempts: held until t0 + 5000
    assert bound() == str(t0 + 5_000).encode()
    m.advance_clock(500)
    m.put_start("c2", "{t}b", 100)  # preempts: held until t0 + 6000, later than the bound
    assert m.redis.zcard(p.held) == 2 and bound() == str(t0 + 5_000).encode()
    m.advance_clock(2_499)  # t0 + 4999: nothing due
    m.put_start("c3", "{t}c", 10)
    assert m.redis.zcard(p.held) == 2
    m.advance_clock(1)  # t0 + 5000
    used = m.usage().used_bytes
    m.put_start("c3", "{t}d", 10)  # releases the first: the second's deadline is the bound
    assert m.redis.zcard(p.held) == 1 and bound() == str(t0 + 6_000).encode()
    assert m.usage().used_bytes == used - 300 + 10
    m.advance_clock(1_000)
    m.put_start("c3", "{t}e", 10)
    assert m.redis.zcard(p.held) == 0 and bound() == b"none"
    m.redis.hdel(p.config, "held_due")  # as an earlier package left it
    m.put_start("c3", "{t}f", 10)
    assert bound() == b"none"


def test_a_put_an_earlier_package_started_ends_like_any_other(new_master):
    """An earlier package wrote put_started and soft_pin_action preserve into a put in progress;
    put_start now leaves both out (the start is the P:processing score). Both kinds end the same."""
    m = new_master(put_start_discard_timeout=1_000)
    mount(m, "seg", 1 << 16)
    p = keys_of(m, "{t}old")
    t0 = m.now_ms()
    m.put_start("c1", "{t}old", 100)
    m.put_start("c1", "{t}new", 100)
    okey = p.object("default", "{t}old")
    assert set(m.redis.hkeys(okey)) == {b"size", b"status", b"writer", b"reps"}
    m.redis.hset(okey, mapping={"put_started": t0 - 500, "soft_pin_action": "preserve"})
    assert m.describe("{t}old").put_started_ms == t0 - 500 and m.describe("{t}new").put_started_ms == t0
    m.advance_clock(600)  # abandoned by its own put_started, not by its P:processing score
    with raises_code(ErrorCode.OBJECT_ALREADY_EXISTS):
        m.put_start("c2", "{t}new", 100)
    m.put_start("c2", "{t}old", 100)  # preempts
    m.redis.hset(okey, mapping={"put_started": t0, "soft_pin_action": "preserve"})
    m.put_end("c2", "{t}old")
    m.put_end("c1", "{t}new")
    for key in ("{t}old", "{t}new"):
        assert set(m.redis.hkeys(p.object("default", key))) == {b"size", b"writer", b"reps"}  # complete: no status
        assert m.describe(key).put_started_ms is None


# ---- put_start: placement ----------------------------------------------------------------

def test_replicas_go_to_distinct_segments(master):
    for name in ("s1", "s2", "s3"):
        mount(master, name, 1 << 16)
    replicas = master.put_start(WRITER, "k", 100, ReplicateConfig(replica_num=3))
    assert sorted(r.segment for r in replicas) == ["s1", "s2", "s3"]
    assert all(r.size == 100 and r.status == ReplicaStatus.PROCESSING for r in replicas)
    assert master.usage().used_bytes == 300
    master.put_end(WRITER, "k")
    assert sorted(r.segment for r in master.get_replica_list("k").replicas) == ["s1", "s2", "s3"]


def test_replica_num_above_segment_count_is_best_effort(master):
    mount(master, "s1", 1 << 16)
    mount(master, "s2", 1 << 16)
    replicas = master.put_start(WRITER, "k", 100, ReplicateConfig(replica_num=3))
    assert sorted(r.segment for r in replicas) == ["s1", "s2"]
    assert master.usage().used_bytes == 200
    assert sorted(r.segment for r in master.describe("k").replicas) == ["s1", "s2"]


def test_preferred_segments_are_used_first(master):
    mount(master, "big", 1 << 20)
    mount(master, "small-a", 1 << 12)
    mount(master, "small-b", 1 << 12)
    one = master.put_start(WRITER, "k1", 100, ReplicateConfig(preferred_segments=("small-b",)))
    assert [r.segment for r in one] == ["small-b"]
    two = master.put_start(WRITER, "k2", 100, ReplicateConfig(replica_num=2, preferred_segments=("small-a", "small-b")))
    assert sorted(r.segment for r in two) == ["small-a", "small-b"]
    # an unknown or full preferred segment is skipped, the rest is filled from the others
    three = master.put_start(WRITER, "k3", 100, ReplicateConfig(replica_num=2, preferred_segments=("nope", "small-a")))
    assert "small-a" in {r.segment for r in three} and len({r.segment for r in three}) == 2


def test_preferred_segment_is_not_used_twice(master):
    mount(master, "big", 1 << 20)
    mount(master, "small", 1 << 12)
    # "big" is preferred and also the segment with the most free space
    r = master.put_start(WRITER, "k1", 100, ReplicateConfig(replica_num=2, preferred_segments=("big",)))
    assert sorted(x.segment for x in r) == ["big", "small"]
    r = master.put_start(WRITER, "k2", 100, ReplicateConfig(replica_num=3, preferred_segments=("small", "small")))
    assert sorted(x.segment for x in r) == ["big", "small"]
    assert master.usage().used_bytes == 400


def test_nothing_fits_is_no_available_handle(master):
    with raises_code(ErrorCode.NO_AVAILABLE_HANDLE):
        master.put_start(WRITER, "k", 10)  # no segment at all
    mount(master, "seg", 1000)
    with raises_code(ErrorCode.NO_AVAILABLE_HANDLE):
        master.put_start(WRITER, "k", 1001)  # larger than any slice
    master.put_start(WRITER, "a", 600)  # in progress: never evicted to make room
    same_shard = keys_on_shard(master, shard_of_key(master, "a"), 1, stem="b")[0]
    with raises_code(ErrorCode.NO_AVAILABLE_HANDLE):
        master.put_start(WRITER, same_shard, 401)
    assert master.usage().used_bytes == 600 and master.usage().objects == 1
    with raises_code(ErrorCode.OBJECT_NOT_FOUND):
        master.describe("k")
    master.put_start(WRITER, same_shard, 400)  # exactly what is left fits


# ---- put_end / put_revoke ----------------------------------------------------------------

def test_put_end_only_by_the_writer(master):
    mount(master, "seg", 1 << 16)
    master.put_start(WRITER, "k", 100)
    with raises_code(ErrorCode.ILLEGAL_CLIENT):
        master.put_end("intruder", "k")
    assert master.describe("k").status == ReplicaStatus.PROCESSING
    assert not master.exist_key("k")
    master.put_end(WRITER, "k")
    assert master.exist_key("k")
    with raises_code(ErrorCode.ILLEGAL_CLIENT):
        master.put_end("intruder", "k")  # not even on a complete object


def test_put_end_of_missing_object_is_not_found(master):
    with raises_code(ErrorCode.OBJECT_NOT_FOUND):
        master.put_end(WRITER, "nope")


def test_put_end_sets_lease_to_now_and_is_idempotent(master):
    mount(master, "seg", 1 << 16)
    replicas = master.put_start(WRITER, "k", 100)
    master.advance_clock(777)
    ended_at = master.now_ms()
    master.put_end(WRITER, "k")
    info = master.describe("k")
    assert info.status == ReplicaStatus.COMPLETE and info.lease_until_ms == ended_at
    assert [(r.segment, r.offset) for r in info.replicas] == [(r.segment, r.offset) for r in replicas]
    master.advance_clock(5_000)
    master.put_end(WRITER, "k")  # a retry succeeds and changes nothing
    again = master.describe("k")
    assert again.lease_until_ms == ended_at and again.fields == info.fields
    assert master.usage().used_bytes == 100 and master.usage().objects == 1


def test_put_revoke_frees_the_in_progress_replicas(master):
    for name in ("s1", "s2"):
        mount(master, name, 1 << 16)
    put(master, "keep", 50)
    before = master.usage()
    master.put_start(WRITER, "k", 300, ReplicateConfig(replica_num=2))
    assert master.usage().used_bytes == before.used_bytes + 600
    with raises_code(ErrorCode.ILLEGAL_CLIENT):
        master.put_revoke("intruder", "k")
    master.put_revoke(WRITER, "k")
    after = master.usage()
    assert after.used_bytes == before.used_bytes and after.objects == before.objects
    with raises_code(ErrorCode.OBJECT_NOT_FOUND):
        master.describe("k")
    with raises_code(ErrorCode.OBJECT_NOT_FOUND):
        master.put_revoke(WRITER, "k")
    master.put_start("another", "k", 300)  # the key is free again at once


def test_put_revoke_of_complete_object_is_invalid_write(master):
    mount(master, "seg", 1 << 16)
    put(master, "k", 100)
    with raises_code(ErrorCode.INVALID_WRITE):
        master.put_revoke(WRITER, "k")
    assert master.get_replica_list("k").replicas[0].size == 100
    assert master.usage().used_bytes == 100


# ---- tenants -----------------------------------------------------------------------------

def test_tenant_scopes_object_keys(master):
    mount(master, "seg", 1 << 16)
    put(master, "k", 100, tenant_id="alpha")
    with raises_code(ErrorCode.OBJECT_NOT_FOUND):
        master.get_replica_list("k", tenant_id="beta")
    put(master, "k", 300, tenant_id="beta")  # not OBJECT_ALREADY_EXISTS: another object
    assert master.get_replica_list("k", tenant_id="alpha").replicas[0].size == 100
    assert master.get_replica_list("k", tenant_id="beta").replicas[0].size == 300
    assert master.describe("k", tenant_id="alpha").size == 100
    with raises_code(ErrorCode.OBJECT_NOT_FOUND):
        master.describe("k")  # the default tenant has no such object
    assert master.usage().used_bytes == 400 and master.usage().objects == 2


# ---- batches -----------------------------------------------------------------------------

def test_batch_put_start_returns_one_result_per_key_in_order(master):
    mount(master, "seg", 1 << 16)
    put(master, "exists", 10)
    master.get_replica_list("exists")  # leased: nothing may evict it to make room
    spread = [f"key-{i}" for i in range(12)]  # with 4 shards these land on several shards
    if master.shards > 1:
        assert len({shard_of_key(master, k) for k in spread}) > 1
    keys = [spread[0], "", spread[1], "exists", spread[2], spread[3], "x" * 5000] + spread[4:]
    sizes = [10, 10, 0, 10, 11, 1 << 20, 10] + [20 + i for i in range(len(spread) - 4)]
    out = master.batch_put_start(WRITER, keys, sizes)
    assert len(out) == len(keys)
    assert [r.size for r in out[0]] == [10]
    assert out[1] == ErrorCode.INVALID_PARAMS       # empty key
    assert out[2] == ErrorCode.INVALID_PARAMS       # size 0
    assert out[3] == ErrorCode.OBJECT_ALREADY_EXISTS
    assert [r.size for r in out[4]] == [11]
    assert out[5] == ErrorCode.NO_AVAILABLE_HANDLE  # larger than a slice
    assert out[6] == ErrorCode.INVALID_PARAMS       # key too long
    for i, key in enumerate(spread[4:]):
        assert [r.size for r in out[7 + i]] == [20 + i], key
    assert master.usage().used_bytes == 10 + 10 + 11 + sum(20 + i for i in range(len(spread) - 4))


def test_batch_put_end_and_revoke_return_codes_in_order(master):
    mount(master, "seg", 1 << 16)
    keys = [f"key-{i}" for i in range(8)]
    master.batch_put_start(WRITER, keys, [10] * len(keys))
    put(master, "done", 10, client="other")
    ends = master.batch_put_end(WRITER, [keys[0], "missing", keys[1], "done", keys[2], keys[3]])
    assert ends == [ErrorCode.OK, ErrorCode.OBJECT_NOT_FOUND, ErrorCode.OK, ErrorCode.ILLEGAL_CLIENT,
                    ErrorCode.OK, ErrorCode.OK]
    revokes = master.batch_put_revoke(WRITER, [keys[4], keys[0], "missing", keys[5], keys[6], keys[7]])
    assert revokes == [ErrorCode.OK, ErrorCode.INVALID_WRITE, ErrorCode.OBJECT_NOT_FOUND, ErrorCode.OK,
                       ErrorCode.OK, ErrorCode.OK]
    assert master.batch_exist_key(keys) == [True, True, True, True, False, False, False, False]
    assert master.usage().used_bytes == 50 and master.usage().objects == 5


# ---- the wire protocol -------------------------------------------------------------------

def test_functions_are_the_wire_protocol(master):
    """A non-Python engine calls the functions with any Redis client: named options, then the
    declared per-key fields, then the rows."""
    mount(master, "seg", 1 << 16)
    r = master.redis
    key = b"wire/key"
    p = shard_keys(master, shard_of(key, master.shards)).P

    def fcall(fn, *argv):
        return r.execute_command("FCALL", fn, 1, p, *argv)

    # put_start: 1 option (client_id; the rest take their defaults), 2 fields (key, size)
    reply = fcall("mc_put_start", 1, "client_id", "engine", 2, "key", "size", key, 4096)
    assert len(reply) == 1 and reply[0][0] == b"seg" and isinstance(reply[0][1], int)
    offset = reply[0][1]
    assert fcall("mc_exist_key", 0, 1, "key", key) == [0]  # tenant defaults to "default"
    assert fcall("mc_get_replica_list", 1, "tenant", "default", 1, "key", key) == [
        int(ErrorCode.REPLICA_IS_NOT_READY)]
    assert fcall("mc_put_end", 2, "client_id", "engine", "tenant", "default", 1, "key", key, b"missing") == [
        0, int(ErrorCode.OBJECT_NOT_FOUND)]
    assert fcall("mc_exist_key", 0, 1, "key", key, b"missing") == [1, 0]
    ttl = master.config.default_kv_lease_ttl
    assert fcall("mc_get_replica_list", 0, 1, "key", key) == [[ttl, 4096, b"seg", offset]]
    # the typed client sees the same object
    assert master.get_replica_list(key).replicas[0].offset == offset
    assert fcall("mc_remove", 0, 1, "key", key) == [int(ErrorCode.OBJECT_HAS_LEASE)]
    assert fcall("mc_remove", 1, "force", 1, 1, "key", key) == [0]
    assert master.usage().used_bytes == 0
    # whole-call errors are "<NAME> <code> <detail>" replies
    import redis as redis_py

    for argv, why in [((1, "tenant", "bad tenant", 1, "key", key), "tenant_id"),
                      ((1, "colour", "red", 1, "key", key), "unknown option colour"),
                      ((0, 1, "prefix", key), "unknown or repeated field prefix"),
                      ((0, 2, "key", "key", key, key), "unknown or repeated field key"),
                      ((2, "tenant", "a", "tenant", "b", 1, "key", key), "option tenant given twice"),
                      ((3, "tenant", "a", 1, "key", key), "expected n_opts"),
                      ((0,), "expected n_fields")]:
        with pytest.raises(redis_py.ResponseError) as info:
            fcall("mc_exist_key", *argv)
        assert str(info.value).startswith("INVALID_PARAMS -600") and why in str(info.value), (argv, info.value)
    with pytest.raises(redis_py.ResponseError) as info:
        fcall("mc_put_start", 1, "client_id", "engine", 1, "key", key)
    assert "missing field size" in str(info.value)
    with pytest.raises(redis_py.ResponseError) as info:
        fcall("mc_put_start", 0, 2, "key", "size", key, 1)
    assert "missing option client_id" in str(info.value)
    with pytest.raises(redis_py.ResponseError) as info:
        fcall("mc_put_start", 1, "client_id", "engine", 2, "key", "size", key)
    assert "each row must have 2 values" in str(info.value)


def test_put_start_keeps_a_prefix_field_passed_per_key(master):
    """The prefix hash is computed by the caller and passed per key (field `prefix`)."""
    mount(master, "seg", 1 << 16)
    key = b"{w}a"
    p = keys_of(master, key).P
    reply = master.redis.execute_command("FCALL", "mc_put_start", 1, p, 1, "client_id", WRITER,
                                         3, "key", "prefix", "size", key, "ab" * 16, 100, b"{w}b", "", 100)
    assert isinstance(reply[0], list) and reply[1] == int(ErrorCode.INVALID_PARAMS)  # an empty prefix
    assert master.describe(key).fields["prefix"] == "ab" * 16


def test_the_configuration_hash_is_a_hashtable(master, backend):
    """Master.connect keeps every shard's P:config a hashtable (keys.HASHTABLE_FIELD): every call
    looks up fields of it, which a listpack finds by linear scans."""
    if backend == "memory":
        pytest.skip("fakeredis has no encodings")
    for shard in range(master.shards):
        assert master.redis.object("encoding", shard_keys(master, shard).config) == b"hashtable"
