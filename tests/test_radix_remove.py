"""A batched remove of radix keys: a node's last key leaves with one read of its record, and a
parent left without children is placed at the end of the batch unless its own last key goes in
it first (Radix.place_node's pending placement, cancelled or written by Units.leave_group). After
each batch the index, the units' tiers and the counters agree (fsck), and what is left is
evicted leaf first."""
from __future__ import annotations

import pytest

from helpers import WRITER, put
from mooncake_redis import ErrorCode, ReplicateConfig, SoftPinAction
from mooncake_redis.keys import node_shard
from mooncake_redis.fsck import fsck
from test_radix import SMALL, H, alive, radix


@pytest.fixture
def rm(new_master):
    return radix(new_master, eviction_high_watermark_ratio=0.000001, eviction_ratio=0.000001)


def put_chain(m, stem: str, n: int, per_node: int = 1) -> list[list[str]]:
    """A chain of n nodes put in one batch, per_node keys each: the keys, node by node."""
    hashes = [H(f"{stem}{i}") for i in range(n)]
    keys = [[f"{h}_{j}" for j in range(per_node)] for h in hashes]
    flat = [k for node in keys for k in node]
    parents = [hashes[i - 1] if i else None for i in range(n) for _ in range(per_node)]
    assert all(isinstance(r, list) for r in m.batch_put_start(WRITER, flat, [SMALL] * len(flat), parents=parents))
    assert m.batch_put_end(WRITER, flat) == [ErrorCode.OK] * len(flat)
    return keys


def drain(m) -> None:
    """Deliver every cross-shard step, cascades too (a parent dropped on one shard unlinks from
    its own parent through its shard's outbox)."""
    while m.drain_radix_outbox():
        pass


def nodes_left(m) -> int:
    return sum(s.nodes for s in m.radix_stats())


def test_a_chain_removed_leaf_first_in_one_batch_leaves_nothing(rm):
    m = rm
    keys = put_chain(m, "a", 6)
    assert m.batch_remove([node[0] for node in reversed(keys)]) == [ErrorCode.OK] * 6
    drain(m)
    assert nodes_left(m) == 0 and fsck(m).ok
    assert not any(m.redis.zcard(t) for k in m.transport.keys for t in k.tiers)  # no entry in any tier


def test_a_parent_whose_child_goes_is_placed_at_the_batchs_end(rm):
    m = rm
    keys = put_chain(m, "b", 3)
    other = put_chain(m, "o", 1)[0][0]
    assert m.batch_remove([keys[2][0], other]) == [ErrorCode.OK] * 2
    drain(m)
    assert fsck(m).ok
    assert m.describe_radix_node(H("b1")).why == ""  # a candidate now, in its tier
    m.advance_clock(20_000)
    m.run_eviction()
    drain(m)
    assert not any(alive(m, k[0]) for k in keys) and fsck(m).ok


@pytest.mark.parametrize("order", ["node by node", "key by key"])
def test_nodes_of_two_keys_removed_leaf_first(rm, order):
    """Node by node, a parent's first key finds its placement pending (written first, then
    the general path); key by key, each parent keeps a key until the second pass."""
    m = rm
    keys = put_chain(m, f"c-{order}", 4, per_node=2)
    if order == "node by node":
        batch = [k for node in reversed(keys) for k in node]
    else:
        batch = [node[0] for node in reversed(keys)] + [node[1] for node in reversed(keys)]
    assert m.batch_remove(batch) == [ErrorCode.OK] * 8
    drain(m)
    assert nodes_left(m) == 0 and fsck(m).ok


def test_a_leased_parent_kept_by_the_batch_is_placed_at_its_end(rm):
    m = rm
    keys = put_chain(m, "d", 3)
    m.get_replica_list(keys[1][0])  # leased: its remove is refused
    got = m.batch_remove([keys[2][0], keys[1][0], keys[0][0]])
    assert got == [ErrorCode.OK, ErrorCode.OBJECT_HAS_LEASE, ErrorCode.OK]  # (the root stays a shell)
    drain(m)
    assert fsck(m).ok and m.describe_radix_node(H("d1")).why == ""
    m.advance_clock(20_000)
    assert m.batch_remove([keys[1][0], keys[2][0]]) == [ErrorCode.OK, ErrorCode.OBJECT_NOT_FOUND]
    drain(m)
    assert nodes_left(m) == 0 and fsck(m).ok


def test_a_parents_pending_placement_is_written_before_its_key_leaves(rm):
    """The parent's placement waits while it holds the key of a retained group (the retained
    tier); that key then leaves in the same batch: the parent must end in the ordinary tier, as
    its other key says, not where the waiting placement would have put it."""
    m = rm
    p, mid, leaf = H("e0"), H("e1"), H("e2")
    group = f"sglang-hicache:{mid}"  # (as SGLang names a page's group: routed with the page)
    put(m, f"{p}_0", SMALL)
    put(m, f"{mid}_a", SMALL, config=ReplicateConfig(parent_block_hash=p, group_id=group))
    put(m, f"{mid}_b", SMALL, config=ReplicateConfig(parent_block_hash=p))
    put(m, f"{leaf}_0", SMALL, config=ReplicateConfig(parent_block_hash=mid))
    assert m.retain_groups([group], ttl_ms=600_000)[0] > 0
    drain(m)
    assert m.batch_remove([f"{leaf}_0", f"{mid}_a"]) == [ErrorCode.OK] * 2
    drain(m)
    assert fsck(m).ok
    k = m.transport.keys[node_shard(mid.encode(), m.shards)]
    unit = f"r:default:{mid}"
    assert m.redis.zscore(k.tier_ordinary, unit) is not None and m.redis.zscore(k.tier_retained, unit) is None


@pytest.mark.parametrize("how", ["remove", "evict"])
def test_a_nodes_aggregates_go_with_its_last_key(new_master, how):
    """A node whose one key has a soft pin and a guarantee aggregates their deadlines; its last
    key's removal or eviction takes them (a node whose key had neither names none)."""
    m = radix(new_master, eviction_high_watermark_ratio=0.000001, eviction_ratio=0.000001,
              allow_evict_soft_pinned_objects=True)
    h, plain = H("pinned"), H("plain")
    put(m, f"{h}_0", SMALL, config=ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE, guaranteed_ttl_ms=1_000))
    put(m, f"{plain}_0", SMALL)
    aggs = [k for sk in m.transport.keys for k in m.redis.scan_iter(match=sk.prefix("aggregate") + b"*")]
    assert any(b"soft_pin" in k for k in aggs) and any(b"guarantee" in k for k in aggs), aggs
    m.advance_clock(5_000)  # the guarantee ends; the soft pin (default ttl) outlasts it
    if how == "remove":
        assert m.batch_remove([f"{h}_0", f"{plain}_0"]) == [ErrorCode.OK] * 2
    else:
        m.run_eviction()
    drain(m)
    assert nodes_left(m) == 0 and fsck(m).ok
    assert not [k for sk in m.transport.keys for k in m.redis.scan_iter(match=sk.prefix("aggregate") + b"*")]
