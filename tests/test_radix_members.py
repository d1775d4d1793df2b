"""A radix node's keys are fields of its record (schema 7), each key with the node's hash taken
out ('=' <n> ':' and the rest, or '=' and the rest for a key that starts with it), another key
escaped with a backslash: every reader (queries, eviction, fsck) sees the keys themselves, a
store of schema 4 or 6 (a key set P:rkeys a node) is moved into the records by Master.connect,
and until then the set is read beside the record."""
from __future__ import annotations

import hashlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import WRITER, examples, make_master, mount, put, shard_keys
from mooncake_redis import Master, MasterConfig, ReplicateConfig
from mooncake_redis.fsck import fsck
from mooncake_redis.keys import node_shard
from mooncake_redis.library import SCHEMA_FIELD

SMALL = 100
PATTERN = r"^(?:[^:]*:)?([0-9a-f]{64})"  # the hash at the start, or after a "<label>:"


def H(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def node_set(m: Master, h: str) -> bytes:
    return shard_keys(m, node_shard(h.encode(), m.shards)).radix_keys("default", h)


def node_record(m: Master, h: str) -> bytes:
    return shard_keys(m, node_shard(h.encode(), m.shards)).radix_node("default", h)


def node_members(m: Master, h: str) -> set[bytes]:
    """The member fields of a node's record ('=' or a backslash first: no other field's)."""
    return {f for f in m.redis.hkeys(node_record(m, h)) if f[:1] in (b"=", b"\\")}


def raw_node(m: Master, key: str) -> bytes:
    return m.redis.hget(shard_keys(m, m.transport.shard_of(key.encode())).object("default", key), "node")


def radix(new_master):
    m = new_master(enable_radix_tree=True, radix_key_pattern=PATTERN,
                   eviction_high_watermark_ratio=0.000001, eviction_ratio=0.000001)
    mount(m, "seg", 64 * 1024)
    return m


def test_every_reader_sees_the_keys_and_the_set_their_member_form(new_master):
    m = radix(new_master)
    h = H("a")
    keys = {f"{h}_0": b"=_0", f"{h}": b"=", f"{h}7_k": b"=0:7_k", f"=a:{h}": b"=3:=a:",
            f"\\b:{h}": b"=3:\\b:", f"c:{h}_0_k": b"=2:c:_0_k"}
    for k in keys:
        put(m, k, SMALL, config=ReplicateConfig(parent_block_hash=H("root")))
    assert node_members(m, h) == set(keys.values()) and not m.redis.exists(node_set(m, h))
    assert sorted(m.get_keys_by_prefix(h)) == sorted(k.encode() for k in keys)
    assert sorted(m.describe_radix_node(h).keys) == sorted(k.encode() for k in keys)
    # an object's node field says where the hash sits in its key; describe shows the hash
    assert {k: raw_node(m, k) for k in keys} == {k: f"={k.index(h)}:64".encode() for k in keys}
    assert all(m.describe(k).fields["node"] == h for k in keys)
    assert fsck(m).ok
    m.advance_clock(20_000)
    m.run_eviction()
    assert m.batch_exist_key(list(keys)) == [False] * len(keys)
    assert all(s.nodes == 0 for s in m.radix_stats())
    assert fsck(m).ok


def test_a_key_without_its_nodes_hash_is_listed_as_it_is_or_escaped(new_master, monkeypatch):
    m = radix(new_master)
    if m.shards > 1:
        pytest.skip("the keys route by the pattern: on several shards they miss their node's")
    h = H("a")
    monkeypatch.setattr(m, "radix_prefix", lambda key: h.encode())  # a caller's own node for any key
    keys = {"plain": b"\\plain", "=x": b"\\=x", "\\y": b"\\\\y"}
    for k in keys:
        put(m, k, SMALL)
    assert node_members(m, h) == set(keys.values())
    assert sorted(m.get_keys_by_prefix(h)) == sorted(k.encode() for k in keys)
    assert {raw_node(m, k) for k in keys} == {h.encode()}  # the hash is in none of them
    odd = "=odd"  # a node whose hash starts with '=' and is not in its key
    monkeypatch.setattr(m, "radix_prefix", lambda key: odd.encode())
    put(m, "zz", SMALL)
    assert raw_node(m, "zz") == b"\\=odd" and m.describe("zz").fields["node"] == odd
    assert m.get_keys_by_prefix(odd) == [b"zz"]
    assert fsck(m).ok
    m.advance_clock(20_000)
    m.run_eviction()
    assert m.batch_exist_key([*keys, "zz"]) == [False] * (len(keys) + 1)


def test_an_entry_that_names_another_object_evicts_only_the_entry(new_master):
    m = radix(new_master)
    h = H("a")
    put(m, f"{h}_0", SMALL, config=ReplicateConfig(parent_block_hash=H("root")))
    other = f"{h}_other"
    put(m, other, SMALL)
    assert m.redis.hexists(node_record(m, h), b"=_other")
    # the object leaves the node behind the index's back: its entry "=_other" is stale
    m.redis.hdel(shard_keys(m, m.transport.shard_of(other.encode())).object("default", other), "node")
    m.advance_clock(20_000)
    m.run_eviction()
    assert not m.exist_key(f"{h}_0")
    assert m.describe(other).size == SMALL


def connect_as_schema(m: Master, url: str, schema: int) -> Master:
    """Mark every shard of m's store as of `schema` and connect again (which upgrades it)."""
    for shard in range(m.shards):
        m.redis.hset(shard_keys(m, shard).config, SCHEMA_FIELD, schema)
    return Master.connect(url, MasterConfig(shards=m.shards, enable_radix_tree=True, radix_key_pattern=PATTERN))


def store_of(valkey, keys: list[str]) -> Master:
    """A store of two shards on Valkey holding `keys`, complete."""
    m = make_master("valkey", valkey, shards=2, enable_radix_tree=True, radix_key_pattern=PATTERN)
    mount(m, "seg", 64 * 1024)
    for k in keys:
        put(m, k, SMALL)
    return m


def test_a_schema_4_store_is_relisted_by_connect(valkey):
    h = H("a")
    keys = [f"{h}_0", f"=a:{h}", f"\\b:{h}"]
    m = store_of(valkey, keys)
    try:
        mkey = node_set(m, h)
        m.redis.delete(mkey)
        m.redis.sadd(mkey, *keys)  # as a schema 4 store listed them
        for k in keys:  # and named their node
            m.redis.hset(shard_keys(m, m.transport.shard_of(k.encode())).object("default", k), "node", h)
        again = connect_as_schema(m, valkey.url, 4)
        try:
            # every entry in the member form, in the node's record
            assert node_members(again, h) == {b"=_0", b"=3:=a:", b"=3:\\b:"} and not again.redis.exists(mkey)
            assert sorted(again.get_keys_by_prefix(h)) == sorted(k.encode() for k in keys)
            assert {k: raw_node(again, k) for k in keys} == {k: f"={k.index(h)}:64".encode() for k in keys}
            assert fsck(again).ok
        finally:
            again.close()
    finally:
        m.close()


def test_a_node_of_engine_keys_keeps_a_small_record(valkey):
    """`<hash>_<rank>` keys make members of a few bytes: the record stays a listpack."""
    m = make_master("valkey", valkey, shards=1, enable_radix_tree=True)
    try:
        mount(m, "seg", 64 * 1024)
        h = H("a")
        for i in range(4):
            put(m, f"{h}_{i}", SMALL)
        assert node_members(m, h) == {f"=_{i}".encode() for i in range(4)}
        assert m.redis.object("encoding", node_record(m, h)) == b"listpack"
    finally:
        m.close()


def legacy(m: Master, h: str, members: set[bytes]) -> None:
    """Move `members` of node h from its record into a set, as a store of schema 6 keeps them."""
    m.redis.hdel(node_record(m, h), *members)
    m.redis.sadd(node_set(m, h), *members)


def test_a_nodes_set_of_an_older_layout_is_read_beside_its_record(new_master):
    """Until the upgrade has moved them, members in a node's set count as its members: queries
    list them, a remove takes them out, fsck counts them, eviction takes them."""
    m = radix(new_master)
    h = H("a")
    keys = [f"{h}_{i}" for i in range(5)]
    for k in keys:
        put(m, k, SMALL, config=ReplicateConfig(parent_block_hash=H("root")))
    legacy(m, h, {b"=_1", b"=_2", b"=_3"})
    assert sorted(m.get_keys_by_prefix(h)) == sorted(k.encode() for k in keys)
    assert sorted(m.describe_radix_node(h).keys) == sorted(k.encode() for k in keys)
    m.remove(keys[1])  # from the set
    assert m.redis.smembers(node_set(m, h)) == {b"=_2", b"=_3"}
    assert sorted(m.get_keys_by_prefix(h)) == sorted(k.encode() for k in keys if k != keys[1])
    assert fsck(m).ok
    legacy(m, h, {b"=_0"})
    m.advance_clock(20_000)
    while any(s.state == "more" for s in (m.evict_step(shard, 1) for shard in range(m.shards))):
        pass  # one member a step: the node drains over several, its set's members with it
    assert m.batch_exist_key(keys) == [False] * len(keys)
    assert not m.redis.exists(node_set(m, h)) and not m.redis.exists(node_record(m, h))
    assert fsck(m).ok


def test_a_schema_6_store_is_moved_into_the_records_by_connect(valkey):
    h = H("a")
    keys = [f"{h}_0", f"=a:{h}", f"c:{h}_0_k"]
    m = store_of(valkey, keys)
    try:
        legacy(m, h, node_members(m, h))
        again = connect_as_schema(m, valkey.url, 6)
        try:
            assert node_members(again, h) == {b"=_0", b"=3:=a:", b"=2:c:_0_k"}
            assert not again.redis.exists(node_set(again, h))
            assert sorted(again.get_keys_by_prefix(h)) == sorted(k.encode() for k in keys)
            assert fsck(again).ok
        finally:
            again.close()
    finally:
        m.close()


PIECE = st.text(alphabet="=\\:_0123456789ab@", max_size=6)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=st.lists(st.tuples(PIECE, st.booleans(), PIECE), min_size=1, max_size=6, unique=True))
def test_every_key_comes_back_as_it_was_put(new_master, pieces):
    """Keys of any shape under one node (the hash at the start, inside, at the end, or not in the
    key at all; '=', backslashes, digits and ':' anywhere): the node lists exactly the keys put,
    and its eviction takes exactly them."""
    m = new_master(enable_radix_tree=True, shards=1, eviction_high_watermark_ratio=0.000001, eviction_ratio=0.000001)
    mount(m, "seg", 64 * 1024)
    h = H("a")
    m.radix_prefix = lambda key: h.encode()  # type: ignore[method-assign]  (a caller's own node for any key)
    keys = sorted({a + (h if with_hash else "") + b for a, with_hash, b in pieces} - {""})
    for k in keys:
        put(m, k, SMALL)
    assert sorted(m.get_keys_by_prefix(h)) == sorted(k.encode() for k in keys)
    assert fsck(m).ok
    m.advance_clock(20_000)
    m.run_eviction()
    assert m.batch_exist_key(keys) == [False] * len(keys)


def test_a_node_of_many_keys_drains_in_small_steps(new_master):
    """A record of more fields than a listpack holds (a hashtable): the scan for members takes
    several steps a call, and no member is taken twice or missed."""
    m = radix(new_master)
    h = H("big")
    keys = [f"{h}_{i}" for i in range(160)]
    m.batch_put_start(WRITER, keys, [SMALL] * len(keys))
    m.batch_put_end(WRITER, keys)
    assert len(node_members(m, h)) == len(keys)
    m.advance_clock(20_000)
    shard = node_shard(h.encode(), m.shards)
    for step in range(len(keys) // 3 + 2):
        m.evict_step(shard, 3)
        if step % 10 == 0:
            assert fsck(m).ok
    assert m.batch_exist_key(keys) == [False] * len(keys)
    assert not m.redis.exists(node_record(m, h)) and fsck(m).ok
