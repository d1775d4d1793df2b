"""batch_put_start with a parent per key (`parents`): a chain of pages written in one call
registers each node under its own parent, across shards too, and evicts leaves first."""
from __future__ import annotations

import pytest

from helpers import WRITER, mount, raises_code
from mooncake_redis import ErrorCode, MasterError, ReplicateConfig
from mooncake_redis.fsck import fsck
from mooncake_redis.keys import node_shard
from test_radix import SMALL, H, alive, on_shard, radix


@pytest.fixture
def rm(new_master):
    return radix(new_master, eviction_high_watermark_ratio=0.000001, eviction_ratio=0.000001)


def chain(n: int, stem: str = "c") -> list[str]:
    return [H(f"{stem}{i}") for i in range(n)]


def put_chain(m, hashes: list[str], first_parent: str | None = None) -> list[str]:
    keys = [f"{h}_0" for h in hashes]
    parents = [first_parent, *hashes[:-1]]
    started = m.batch_put_start(WRITER, keys, [SMALL] * len(keys), parents=parents)
    assert all(isinstance(r, list) for r in started), started
    assert m.batch_put_end(WRITER, keys) == [ErrorCode.OK] * len(keys)
    return keys


def test_a_chain_in_one_batch_links_each_node_to_its_own_parent(rm):
    m = rm
    hs = chain(12)  # on 4 shards the links cross shards
    keys = put_chain(m, hs)
    for i, h in enumerate(hs):
        info = m.describe_radix_node(h)
        assert info.parent == (hs[i - 1].encode() if i else None)
        assert info.children == ([hs[i + 1].encode()] if i + 1 < len(hs) else [])
        assert info.keys == [keys[i].encode()] and not info.link_pending
    assert len(m.get_subtree_keys(hs[0], 20)) == len(hs)
    assert fsck(m).ok


def test_a_batched_chain_evicts_leaf_first(rm):
    m = rm
    hs = chain(6)
    keys = put_chain(m, hs)
    m.advance_clock(20_000)
    gone = []
    for _ in range(3 * len(hs)):
        for shard in range(m.shards):
            m.evict_step(shard)
        m.drain_radix_outbox()
        now_gone = [k for k in keys if not alive(m, k)]
        # a node goes only after every node below it: what is gone is always a tail of the chain
        assert now_gone == keys[len(keys) - len(now_gone):]
        gone = now_gone
    assert gone == keys and fsck(m).ok


def test_roots_and_children_mix_in_one_batch(rm):
    m = rm
    a, b, c = H("a"), H("b"), H("c")
    keys = [f"{a}_0", f"{b}_0", f"{c}_0"]
    assert all(isinstance(r, list) for r in m.batch_put_start(WRITER, keys, [SMALL] * 3, parents=[None, a, None]))
    assert m.describe_radix_node(b).parent == a.encode()
    assert m.describe_radix_node(a).parent is None and m.describe_radix_node(c).parent is None


def test_a_key_whose_node_has_another_parent_is_refused_alone(rm):
    m = rm
    a, b, c = H("a"), H("b"), H("c")
    put_chain(m, [a, b])
    keys = [f"{b}_1", f"{c}_0"]
    got = m.batch_put_start(WRITER, keys, [SMALL] * 2, parents=[H("z"), b])
    assert got[0] == ErrorCode.INVALID_PARAMS and isinstance(got[1], list)
    assert m.describe_radix_node(b).parent == a.encode()
    assert not m.exist_key(f"{b}_1")


@pytest.mark.parametrize("parents, why", [
    ([H("a")], "per key"),
    ("ab", "per key"),
    ([None, "x" * 257], "1-256 bytes"),
    ([None, ""], "1-256 bytes"),
])
def test_bad_parents_are_refused_before_anything_is_written(rm, parents, why):
    m = rm
    used = m.usage().used_bytes
    with pytest.raises(MasterError) as info:
        m.batch_put_start(WRITER, [f"{H('k0')}_0", f"{H('k1')}_0"], [SMALL] * 2, parents=parents)
    assert info.value.code == ErrorCode.INVALID_PARAMS and why in str(info.value)
    assert m.usage().used_bytes == used


def test_parents_beside_the_configs_parent_are_refused(rm):
    with raises_code(ErrorCode.INVALID_PARAMS):
        rm.batch_put_start(WRITER, [f"{H('k')}_0"], [SMALL], ReplicateConfig(parent_block_hash=H("p")),
                           parents=[H("q")])


def test_with_the_index_off_parents_are_ignored(new_master):
    m = new_master()
    mount(m, "seg", 64 * 1024)
    keys = [f"{H('a')}_0", f"{H('b')}_0"]
    assert all(isinstance(r, list) for r in m.batch_put_start(WRITER, keys, [SMALL] * 2, parents=[None, H("a")]))
    assert sum(s.nodes for s in m.radix_stats()) == 0


def test_an_eviction_step_ranks_the_parent_it_makes_a_candidate(rm):
    """Within a step, a parent whose last child went is weighed against its tier's head: taken
    next when it ranks first, else written to its tier before the other unit goes; a step that
    ends meanwhile leaves it in its tier (fsck checks every node's tier entry)."""
    m = rm
    a = [on_shard(m, 0, f"a{i}-") for i in range(3)]  # one shard: the unlinks apply in the step
    b = [on_shard(m, 0, f"b{i}-") for i in range(3)]
    ka = put_chain(m, a)
    m.advance_clock(1_000)
    kb = put_chain(m, b)
    m.advance_clock(1_000)
    m.get_replica_list(ka[1])  # a1's lease is now the newest of all
    m.advance_clock(m.config.default_kv_lease_ttl + 1_000)
    # a2 (the oldest) goes, then b2 ranks before a1, whose placement is written first
    assert m.evict_step(0, 2).units == 2
    assert [alive(m, k) for k in ka + kb] == [True, True, False, True, True, False]
    assert m.describe_radix_node(a[1]).why == "" and m.describe_radix_node(b[1]).why == ""
    assert fsck(m).ok
    # b1 ranks before a1 and is taken at once, then b0 the same way; a1 waits in its tier
    assert m.evict_step(0, 2).units == 2
    assert [alive(m, k) for k in ka + kb] == [True, True, False, False, False, False]
    assert fsck(m).ok
    assert m.evict_step(0, 1).units == 1
    assert [alive(m, k) for k in ka] == [True, False, False]
    assert m.describe_radix_node(a[0]).why == "" and fsck(m).ok


def kids_zset(m, h: str) -> bytes:
    return m.transport.keys[node_shard(h.encode(), m.shards)].radix_kids("default", h)


def record(m, h: str) -> bytes:
    return m.transport.keys[node_shard(h.encode(), m.shards)].radix_node("default", h)


def test_a_chain_put_in_one_call_lists_each_child_in_its_parents_record(rm):
    """A parent the same call created lists its first child in its record (no zset); a child
    added later goes into the zset beside it; readers, removes and eviction see both."""
    m = rm
    hs = [on_shard(m, 0, f"r{i}-") for i in range(3)]  # one shard: the links apply in the call
    keys = put_chain(m, hs)
    for parent, child in zip(hs, hs[1:]):
        assert m.redis.hget(record(m, parent), "kid") == child.encode()
        assert not m.redis.exists(kids_zset(m, parent))
    assert m.describe_radix_node(hs[0]).children == [hs[1].encode()]
    assert len(m.get_subtree_keys(hs[0], 4)) == 3
    other = on_shard(m, 0, "other-")
    put_chain(m, [other], first_parent=hs[0])  # a second child of hs[0], in a later call
    assert sorted(m.describe_radix_node(hs[0]).children) == sorted([hs[1].encode(), other.encode()])
    assert m.redis.zrange(kids_zset(m, hs[0]), 0, -1) == [other.encode()]
    assert fsck(m).ok
    m.remove(keys[2])  # the leaf: hs[1] lists no child now, and is a candidate
    assert m.redis.hget(record(m, hs[1]), "kid") is None
    assert m.describe_radix_node(hs[1]).why == ""
    m.remove(keys[1])  # hs[0] keeps the other child
    assert m.describe_radix_node(hs[0]).children == [other.encode()]
    assert m.describe_radix_node(hs[0]).why == "has_children"
    assert fsck(m).ok
    m.advance_clock(20_000)
    m.run_eviction()
    assert not alive(m, keys[0]) and not alive(m, f"{other}_0") and fsck(m).ok


def test_a_chain_longer_than_a_calls_cascade_evicts_leaf_first(rm):
    """Unlinks past MAX_CASCADE (32) of one call go through the outbox, also to a parent that
    lists its child in its record."""
    m = rm
    hs = [on_shard(m, 0, f"long{i}-") for i in range(40)]
    keys = []
    for i in range(0, len(hs), 20):  # two calls: the second's first page links to a parent of the first
        keys += put_chain(m, hs[i:i + 20], first_parent=hs[i - 1] if i else None)
    m.advance_clock(20_000)
    for _ in range(len(hs)):
        m.evict_step(0, 64)
        m.drain_radix_outbox()
        gone = [k for k in keys if not alive(m, k)]
        assert gone == keys[len(keys) - len(gone):]  # always a tail of the chain
    assert not any(alive(m, k) for k in keys) and fsck(m).ok


def test_shells_listing_their_child_in_the_record_go_with_it(rm):
    """Parents whose keys were removed stay as shells while the child their record lists lives;
    when it goes, they go, a call's cascade at a time (past 32, through the outbox)."""
    m = rm
    hs = [on_shard(m, 0, f"shell{i}-") for i in range(40)]
    keys = put_chain(m, hs[:20]) + put_chain(m, hs[20:], first_parent=hs[19])
    other = on_shard(m, 0, "second-")
    put_chain(m, [other], first_parent=hs[5])  # hs[5]'s second child, in its zset
    for k in keys[:-1]:
        m.remove(k)
    m.remove(f"{other}_0")  # hs[5] settles: no keys, but the child its record lists
    assert all(m.describe_radix_node(h).shell for h in hs[:-1])
    assert fsck(m).ok
    m.remove(keys[-1])
    m.drain_radix_outbox()
    for h in hs:
        with raises_code(ErrorCode.OBJECT_NOT_FOUND):
            m.describe_radix_node(h)
    assert all(s.nodes == 0 for s in m.radix_stats()) and fsck(m).ok


def test_a_chain_registered_in_one_call_lists_each_child_in_its_parents_record(rm):
    m = rm
    hs = [on_shard(m, 0, f"reg{i}-") for i in range(4)]
    assert m.batch_register_radix_nodes([(h, hs[i - 1] if i else None) for i, h in enumerate(hs)]) == [ErrorCode.OK] * 4
    for parent, child in zip(hs, hs[1:]):
        assert m.redis.hget(record(m, parent), "kid") == child.encode()
        assert not m.redis.exists(kids_zset(m, parent))
        assert m.describe_radix_node(parent).children == [child.encode()]
    keys = [f"{h}_0" for h in hs]
    for k in keys:
        m.put_start(WRITER, k, SMALL)
        m.put_end(WRITER, k)
    m.advance_clock(20_000)
    gone = []
    for _ in range(len(hs)):
        m.evict_step(0, 1)
        gone = [k for k in keys if not alive(m, k)]
        assert gone == keys[len(keys) - len(gone):]
    assert gone == keys and fsck(m).ok


# ---- rows of one batch that share a node, or that are refused between a node and its child -----

def test_two_keys_a_node_in_one_batch(rm):
    """A page's k and v in one batch: the second key of a node finds the record its first one
    wrote, and the next page links to it."""
    m = rm
    hs = chain(5, "kv")
    keys = [f"{h}_{kv}" for h in hs for kv in ("k", "v")]
    parents = [hs[i // 2 - 1] if i >= 2 else None for i in range(len(keys))]
    assert all(isinstance(r, list) for r in m.batch_put_start(WRITER, keys, [SMALL] * len(keys), parents=parents))
    assert m.batch_put_end(WRITER, keys) == [ErrorCode.OK] * len(keys)
    for i, h in enumerate(hs):
        info = m.describe_radix_node(h)
        assert info.keys == [f"{h}_k".encode(), f"{h}_v".encode()]
        assert info.children == ([hs[i + 1].encode()] if i + 1 < len(hs) else [])
    assert fsck(m).ok


def test_a_refused_row_between_a_node_and_its_child(rm):
    """Rows: a new root, a child of it refused before its link (its key exists), another child:
    the root lists the one child put, the refused key's node keeps no parent."""
    m = rm
    a, b, c = (on_shard(m, 0, stem) for stem in ("ra", "rb", "rc"))
    put_chain(m, [b])  # b_0 exists (a root): its row below is refused
    keys = [f"{a}_0", f"{b}_0", f"{c}_0"]
    got = m.batch_put_start(WRITER, keys, [SMALL] * 3, parents=[None, a, a])
    assert isinstance(got[0], list) and got[1] == ErrorCode.OBJECT_ALREADY_EXISTS and isinstance(got[2], list)
    assert m.batch_put_end(WRITER, [keys[0], keys[2]]) == [ErrorCode.OK] * 2
    assert m.describe_radix_node(a).children == [c.encode()]
    assert m.describe_radix_node(c).keys == [keys[2].encode()] and m.describe_radix_node(b).parent is None
    assert fsck(m).ok
