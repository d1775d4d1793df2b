"""Bad input never corrupts state: it is refused with INVALID_PARAMS (and the store is left
exactly as it was), or, for odd but legal keys, stored faithfully."""
from __future__ import annotations

import re

import pytest
import redis

from helpers import OWNER, WRITER, code_of, mount, present, put, raises_code, shard_keys, shard_of_key, store_snapshot
from mooncake_redis import ErrorCode, MasterError, ReplicaListResult, ReplicateConfig, SoftPinAction
from mooncake_redis.keys import shard_of


@pytest.fixture
def m(master):
    """A store with some state: complete (leased), in-progress and soft-pinned objects."""
    mount(master, "seg", 1 << 16)
    put(master, "done", 100)
    put(master, "pinned", 50, config=ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE))
    master.put_start(WRITER, "busy", 25)
    master.batch_get_replica_list(["done", "pinned"])  # leased
    return master


def assert_refused(m, calls) -> None:
    """Every call raises INVALID_PARAMS and the store is exactly as before."""
    before, usage = store_snapshot(m), m.usage()
    for fn, args, kwargs in calls:
        code = code_of(fn, *args, **kwargs)
        assert code == ErrorCode.INVALID_PARAMS, f"{fn.__name__}{args}{kwargs}: {code.name}"
    assert m.usage() == usage
    assert store_snapshot(m) == before


def call(fn, *args, **kwargs):
    return fn, args, kwargs


# ---- wrong types and out-of-range numbers --------------------------------------------------

def test_put_start_with_wrong_types_is_refused(m):
    assert_refused(m, [
        call(m.put_start, WRITER, 123, 10),
        call(m.put_start, WRITER, None, 10),
        call(m.put_start, WRITER, 1.5, 10),
        call(m.put_start, WRITER, "k", "10"),
        call(m.put_start, WRITER, "k", 10.0),
        call(m.put_start, WRITER, "k", None),
        call(m.put_start, WRITER, "k", True),
        call(m.put_start, WRITER, "k", 2**60),
        call(m.put_start, WRITER, "k", 2**53),
        call(m.put_start, WRITER, "k", -(2**60)),
        call(m.put_start, None, "k", 10),
        call(m.put_start, 7, "k", 10),
        call(m.put_start, "", "k", 10),
        call(m.batch_put_start, WRITER, ["a", "b"], [10]),
        call(m.batch_put_start, WRITER, ["a", 5], [10, 10]),
    ])


@pytest.mark.parametrize("config", [
    ReplicateConfig(replica_num="2"),
    ReplicateConfig(replica_num=1.0),
    ReplicateConfig(replica_num=None),
    ReplicateConfig(replica_num=2**60),
    ReplicateConfig(soft_pin_action="bogus"),
    ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=-1),
    ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms="60000"),
    ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=1.5),
    ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=2**60),
    ReplicateConfig(preferred_segments=(1,)),
    ReplicateConfig(preferred_segments=("",)),
    ReplicateConfig(group_id=5),
    ReplicateConfig(with_hard_pin="no"),
    ReplicateConfig(preferred_segments="seg"),
    {"replica_num": 1},
], ids=repr)
def test_put_start_with_bad_config_is_refused(m, config):
    assert_refused(m, [call(m.put_start, WRITER, "{g}k", 10, config)])


def test_mount_with_bad_numbers_is_refused(m):
    assert_refused(m, [
        call(m.mount_segment, "new", 4096, OWNER, base=-1),
        call(m.mount_segment, "new", -4096, OWNER),
        call(m.mount_segment, "new", 0, OWNER),
        call(m.mount_segment, "new", "4096", OWNER),
        call(m.mount_segment, "new", 4096.0, OWNER),
        call(m.mount_segment, "new", None, OWNER),
        call(m.mount_segment, "new", 2**60, OWNER),
        call(m.mount_segment, "new", 4096, OWNER, base=2**60),
        call(m.mount_segment, "new", 4096, OWNER, base=2**53 - 100),  # base + size beyond 2^53
        call(m.mount_segment, "new", 4096, OWNER, base="0"),
        call(m.mount_segment, None, 4096, OWNER),
        call(m.mount_segment, "", 4096, OWNER),
        call(m.mount_segment, b"bytes-name", 4096, OWNER),
        call(m.mount_segment, "new", 4096, None),
        call(m.mount_segment, "new", 4096, ""),
    ])


def test_other_calls_with_wrong_key_types_are_refused(m):
    assert_refused(m, [
        call(m.put_end, WRITER, None),
        call(m.put_end, WRITER, 42),
        call(m.put_revoke, WRITER, 4.2),
        call(m.batch_put_end, WRITER, ["busy", None]),
        call(m.describe, None),
        call(m.describe, 1),
        call(m.remove, None),
        call(m.remove, 17, force=True),
        call(m.remove_by_regex, "("),
        call(m.remove_by_regex, 123),
        call(m.remove_by_regex, None),
        call(m.unmount_segment, None, OWNER),
        call(m.unmount_segment, "seg", None),
        call(m.ping, None),
    ])
    # reads refuse too (they would grant leases, so they are checked apart from the snapshot)
    for fn, arg in [(m.get_replica_list, None), (m.get_replica_list, 3), (m.exist_key, None),
                    (m.exist_key, 2.5), (m.batch_get_replica_list, ["done", 9]), (m.batch_exist_key, [None])]:
        assert code_of(fn, arg) == ErrorCode.INVALID_PARAMS, (fn.__name__, arg)


@pytest.mark.parametrize("tenant", ["has space", "", "t" * 65, None, 7, "a:b", "a*", "tenant/x", "ünï"])
def test_bad_tenant_ids_are_refused_everywhere(m, tenant):
    assert_refused(m, [
        call(m.put_start, WRITER, "k", 10, tenant_id=tenant),
        call(m.batch_put_start, WRITER, ["k", "l"], [10, 10], tenant_id=tenant),
        call(m.put_end, WRITER, "busy", tenant_id=tenant),
        call(m.put_revoke, WRITER, "busy", tenant_id=tenant),
        call(m.get_replica_list, "done", tenant_id=tenant),
        call(m.batch_get_replica_list, ["done"], tenant_id=tenant),
        call(m.exist_key, "done", tenant_id=tenant),
        call(m.batch_exist_key, ["done"], tenant_id=tenant),
        call(m.describe, "done", tenant_id=tenant),
        call(m.remove, "done", force=True, tenant_id=tenant),
        call(m.remove_by_regex, ".*", force=True, tenant_id=tenant),
        call(m.remove_all, force=True, tenant_id=tenant),
    ])


def test_longest_valid_tenant_id_works(m):
    tenant = "T.-_9" + "t" * 59
    assert len(tenant) == 64
    put(m, "k", 10, tenant_id=tenant)
    assert m.describe("k", tenant_id=tenant).tenant_id == tenant
    assert m.remove_all(tenant_id=tenant) == 1


def test_whole_batch_errors_are_master_errors_on_every_shard_count(m):
    """A parameter error in a batch that spans shards is still a MasterError(INVALID_PARAMS)."""
    keys = [f"key-{i}" for i in range(12)]
    if m.shards > 1:
        assert len({shard_of_key(m, k) for k in keys}) > 1
    before, usage = store_snapshot(m), m.usage()
    too_long = ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=m.config.max_kv_soft_pin_ttl + 1)
    with raises_code(ErrorCode.INVALID_PARAMS):
        m.batch_put_start(WRITER, keys, [10] * len(keys), too_long)
    with raises_code(ErrorCode.INVALID_PARAMS):
        m.put_start(WRITER, keys[0], 10, too_long)
    assert m.usage() == usage and store_snapshot(m) == before


# ---- huge sizes that are legal numbers ------------------------------------------------------

def test_put_larger_than_any_segment_changes_no_object(m):
    """2**40 bytes fit in no segment, even an empty one: the put fails and no object is lost
    (nothing can be evicted to make room for it)."""
    put(m, "{h}idle-1", 10)  # unleased, complete, on the shard of the huge put
    put(m, "{h}idle-2", 10)
    usage = m.usage()
    with raises_code(ErrorCode.NO_AVAILABLE_HANDLE):
        m.put_start(WRITER, "{h}huge", 2**40)
    assert present(m, ["{h}idle-1", "{h}idle-2", "done", "pinned", "busy", "{h}huge"]) == [True] * 5 + [False]
    assert m.usage() == usage


def test_offsets_near_two_to_the_53_are_exact(master):
    base = 2**53 - 1 - (1 << 16) * master.shards
    mount(master, "far", 1 << 16, base=base)
    replicas = master.put_start(WRITER, "k", 4097)
    master.put_end(WRITER, "k")
    got = master.get_replica_list("k").replicas
    assert [r.offset for r in got] == [r.offset for r in replicas]
    assert got[0].offset >= base and got[0].offset + 4097 <= 2**53 - 1
    assert master.describe("k").replicas[0].offset == got[0].offset


# ---- odd keys are stored faithfully -------------------------------------------------------

ODD_KEYS = [b"\xff\xfe", "a{b}c:d", "x:y:z", "{}", "{", "}{", "*?[]", "with space\nnewline", "nul\x00byte",
            "ünïcødé", ":", "obj:default:k"]


def test_odd_keys_round_trip(master):
    mount(master, "seg", 1 << 16)
    for i, key in enumerate(ODD_KEYS):
        put(master, key, 10 + i)
    for i, key in enumerate(ODD_KEYS):
        raw = key if isinstance(key, bytes) else key.encode()
        info = master.describe(key)
        assert info.key == raw and info.size == 10 + i, key
        got = master.get_replica_list(key)
        assert isinstance(got, ReplicaListResult) and got.replicas[0].size == 10 + i, key
        assert master.exist_key(key), key
        assert master.describe(raw).size == 10 + i  # str and its UTF-8 bytes name one object
    assert master.usage().objects == len(ODD_KEYS)
    assert master.usage().used_bytes == sum(10 + i for i in range(len(ODD_KEYS)))


def test_odd_keys_route_by_their_hash_tag(master):
    if master.shards == 1:
        pytest.skip("one shard")
    mount(master, "seg", 1 << 16)
    put(master, "a{b}c:d", 10)
    shard = shard_of(b"b", master.shards)
    assert master.usage().shards[shard].objects == 1
    assert master.redis.exists(shard_keys(master, shard).object("default", "a{b}c:d"))


def test_odd_keys_are_matched_by_remove_by_regex(master):
    mount(master, "seg", 1 << 16)
    for key in ODD_KEYS:
        put(master, key, 10)
    # a str pattern scans keys that are not UTF-8 without failing and leaves them alone
    assert master.remove_by_regex(r"^a\{b\}c:d$") == 1
    assert master.remove_by_regex(re.escape("nul\x00byte")) == 1
    assert master.remove_by_regex(rb"^\xff\xfe$") == 1  # a bytes pattern matches the raw key
    assert master.remove_by_regex(r"^\*\?\[\]$") == 1
    assert master.remove_by_regex(r"^ünïcødé$") == 1
    left = [k for k in ODD_KEYS if k not in (b"\xff\xfe", "a{b}c:d", "nul\x00byte", "*?[]", "ünïcødé")]
    assert present(master, left) == [True] * len(left)
    assert master.usage().objects == len(left)
    assert master.remove_all() == len(left)
    assert master.usage().objects == 0 and master.usage().used_bytes == 0


def test_key_that_looks_like_an_internal_name_stays_in_its_tenant(master):
    mount(master, "seg", 1 << 16)
    put(master, "other:k", 10)  # the default tenant's key "other:k" ...
    with raises_code(ErrorCode.OBJECT_NOT_FOUND):
        master.describe("k", tenant_id="other")  # ... is not tenant "other"'s key "k"
    assert master.remove_all(tenant_id="other") == 0
    assert present(master, ["other:k"]) == [True]


# ---- the raw protocol refuses garbage too ---------------------------------------------------

def test_raw_function_calls_with_garbage_arguments(m):
    r = m.redis
    p0 = shard_keys(m, 0).P
    before, usage = store_snapshot(m), m.usage()

    def fcall(*args):
        return r.execute_command("FCALL", *args)

    def whole_call_error(*args):
        with pytest.raises(redis.ResponseError) as info:
            fcall(*args)
        assert str(info.value).startswith("INVALID_PARAMS -600"), str(info.value)

    def put(*opts, rows=("k", 10), fields=("key", "size")):
        return ("mc_put_start", 1, p0, len(opts) // 2, *opts, len(fields), *fields, *rows)

    writer = ("client_id", WRITER)
    bad_sizes = ["1.5", "-5", "0", "1e3", "", " 7", "0x10", "99999999999999999999", "abc", "-0", "010"]
    for size in bad_sizes:
        assert fcall(*put(*writer, rows=("rawkey", size))) == [int(ErrorCode.INVALID_PARAMS)], size
    assert fcall(*put(*writer, rows=("", 10))) == [int(ErrorCode.INVALID_PARAMS)]
    whole_call_error(*put(*writer, "replica_num", "x"))
    whole_call_error(*put(*writer, "replica_num", 0))
    whole_call_error(*put(*writer, "soft_pin_action", "sometimes"))
    whole_call_error(*put(*writer, "hard_pin", 2))
    whole_call_error(*put(*writer, rows=("k",)))  # a row short of its fields
    whole_call_error(*put(*writer, "soft_pin_ttl_ms", 5))  # a ttl without enable
    whole_call_error(*put(*writer, "tenant", "bad tenant"))
    whole_call_error(*put())  # no client_id
    whole_call_error("mc_mount_segment", 1, p0, 4, "name", "raw-seg", "client_id", OWNER, "base", -1, "size", 100)
    whole_call_error("mc_mount_segment", 1, p0, 4, "name", "raw-seg", "client_id", OWNER, "base", 0, "size", "1.5")
    whole_call_error("mc_mount_segment", 1, p0, 4, "name", "raw-seg", "client_id", OWNER, "base", 0, "size", 0)
    whole_call_error("mc_mount_segment", 1, p0, 3, "name", "raw-seg", "client_id", OWNER, "base", 0)
    whole_call_error("mc_remove", 1, p0, 1, "force", "yes", 1, "key", "done")
    whole_call_error("mc_get_replica_list", 1, p0, 1, "tenant", "", 1, "key", "done")
    whole_call_error("mc_exist_key", 1, p0, 1, "tenant", "a b", 1, "key", "done")
    whole_call_error("mc_put_end", 1, p0, 1, "client_id", "", 1, "key", "busy")
    whole_call_error("mc_put_end", 1, p0, 0, 1, "key", "busy")
    assert m.usage() == usage and store_snapshot(m) == before


@pytest.mark.parametrize("call", [
    lambda m: m.batch_put_start("w", "ab", [1, 1]),
    lambda m: m.batch_put_end("w", "ab"),
    lambda m: m.batch_put_revoke("w", b"ab"),
    lambda m: m.batch_exist_key("ab"),
    lambda m: m.batch_get_replica_list(b"ab"),
    lambda m: m.batch_remove("ab"),
    lambda m: m.expire_guaranteed("ab"),
    lambda m: m.retain_groups("ab", 1000),
], ids=["batch_put_start", "batch_put_end", "batch_put_revoke", "batch_exist_key", "batch_get_replica_list",
        "batch_remove", "expire_guaranteed", "retain_groups"])
def test_a_str_where_a_list_is_expected_is_refused(master, call):
    """Not taken as a list of one-character keys."""
    with raises_code(ErrorCode.INVALID_PARAMS):
        call(master)


def test_a_shard_beyond_the_store_is_refused(master):
    for call in (lambda: master.sweep_shard(master.shards), lambda: master.sweep_shard(-1),
                 lambda: master.evict_step(master.shards)):
        with raises_code(ErrorCode.INVALID_PARAMS):
            call()


@pytest.mark.parametrize("size", [-1, 0, 2**62, 4096.0, "4096", True])
def test_put_start_names_the_size_and_its_range(master, size):
    with pytest.raises(MasterError) as e:
        master.put_start("w", "k", size)
    assert e.value.code == ErrorCode.INVALID_PARAMS
    assert "size must be an integer in [1, 2^53 - 1]" in e.value.message and repr(size) in e.value.message


def test_put_start_names_a_long_key_by_its_length_and_shows_only_its_start(master):
    key = "k" * 5_000
    with pytest.raises(MasterError) as e:
        master.put_start("w", key, 4096)
    msg = e.value.message
    assert "the key is 5,000 bytes" in msg and f"max_key_length ({master.config.max_key_length:,})" in msg
    assert len(msg) < 300 and "(5,000 bytes)" in msg
