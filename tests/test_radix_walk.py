"""The walks over a shard's radix nodes (schema 9: no index of them; the caller SCANs the node
records and hands their ids to the function): status counts, reconciliation in bounded calls
that resume where the last stopped, the ids' validation, and the upgrade that empties a schema 8
store's node index."""
from __future__ import annotations

import hashlib

import pytest

from helpers import make_master, mount, put, shard_keys
from mooncake_redis import ErrorCode, Master, MasterConfig, ReplicateConfig
from mooncake_redis.fsck import fsck
from mooncake_redis.keys import node_shard
from mooncake_redis.library import SCHEMA_FIELD, SCHEMA_VERSION
from mooncake_redis.radix import RECONCILE_STEP
from mooncake_redis.upgrade import BATCH, NODE_INDEX

pytestmark = pytest.mark.cluster  # (a cluster's node holds several shards: each walk SCANs its own)

SMALL = 100


def H(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def on_shard(m: Master, shard: int, stem: str, n: int) -> list[str]:
    """n prefix hashes whose nodes live on `shard`."""
    out, i = [], 0
    while len(out) < n:
        if node_shard(H(f"{stem}{i}").encode(), m.shards) == shard:
            out.append(H(f"{stem}{i}"))
        i += 1
    return out


def radix(new_master, **config) -> Master:
    m = new_master(enable_radix_tree=True, **config)
    mount(m, "seg", 64 * 1024)
    return m


def test_status_counts_nodes_shells_and_leaves(new_master):
    m = radix(new_master)
    assert all(s.nodes == s.shells == s.leaves == s.outbox == 0 for s in m.radix_stats())
    root, mid, leaf, other = H("root"), H("mid"), H("leaf"), H("other")
    assert m.batch_register_radix_nodes([(root, None), (mid, root)]) == [ErrorCode.OK] * 2  # shells
    put(m, f"{leaf}_0", SMALL, config=ReplicateConfig(parent_block_hash=mid))
    put(m, f"{other}_0", SMALL)  # a root with a key and no child
    stats = m.radix_stats()
    assert sum(s.nodes for s in stats) == 4
    assert sum(s.shells for s in stats) == 2        # root and mid have no keys
    assert sum(s.leaves for s in stats) == 2        # leaf and other have no children
    for h in (root, mid, leaf, other):               # each counted on its own shard
        assert stats[node_shard(h.encode(), m.shards)].nodes >= 1


def test_a_reconciliation_step_resumes_past_its_bound_on_children(new_master):
    """A call looks at 256 children at most: the step hands the nodes it did not reach to the
    next call, so every phantom of the step's nodes goes in that one step."""
    m = radix(new_master)
    if m.shards == 1:
        pytest.skip("one shard's walk looks at no children")
    parents = on_shard(m, 0, "parent", 20)
    assert m.batch_register_radix_nodes([(p, None) for p in parents]) == [ErrorCode.OK] * 20
    k0 = shard_keys(m, 0)
    for p in parents:  # 16 children each that exist nowhere: 320 to look at
        m.redis.zadd(k0.radix_kids("default", p), {H(f"gone-{p}-{i}"): 0 for i in range(16)})
    assert RECONCILE_STEP >= len(parents)  # (one call would take them all but for the bound)
    cursor, dropped, phantoms = m.reconcile_radix(0, grace_ms=60_000, scan_count=10_000)
    assert (cursor, dropped, phantoms) == (0, 0, 320)
    # the last unlink leaves each parent with neither keys nor children: it goes with it
    assert m.radix_stats()[0].nodes == 0 and m.reconcile_radix_all(grace_ms=0) == (0, 0)
    assert fsck(m).ok


def test_a_walk_call_refuses_a_malformed_node_id(new_master):
    """An id is the tail of a node record's key: one without a ':' past its first byte or
    longer than a tenant, a ':' and a hash is refused (a caller of the cursor form too)."""
    m = radix(new_master)
    for fn, args in (("mc_radix_reconcile", (0, "no-colon")), ("mc_radix_reconcile", (0,)),
                     ("mc_radix_reconcile", ("x", f"default:{H('a')}")),
                     ("mc_radix_stats", ("x" * 300 + ":" + H("a"),)), ("mc_radix_stats", (0, 10_000))):
        reply = m.transport.run([m.transport.command(fn, 0, *args)], raise_on_error=False)[0]
        assert ErrorCode.INVALID_PARAMS.name in str(reply), (fn, args, reply)


def test_connect_empties_a_schema_8_node_index(valkey):
    m = make_master("valkey", valkey, shards=2, enable_radix_tree=True)
    mount(m, "seg", 64 * 1024)
    h = H("a")
    put(m, f"{h}_0", SMALL)
    index = [shard_keys(m, shard).P + NODE_INDEX for shard in range(m.shards)]
    m.redis.zadd(index[0], {f"default:{H(str(i))}": i for i in range(BATCH * 2 + 3)})  # as schema 8 kept it
    m.redis.zadd(index[1], {f"default:{h}": 1})
    for shard in range(m.shards):
        m.redis.hset(shard_keys(m, shard).config, SCHEMA_FIELD, 8)
    again = Master.connect(valkey.url, MasterConfig(shards=2, enable_radix_tree=True))
    assert not any(again.redis.exists(k) for k in index)
    assert all(int(again.redis.hget(shard_keys(m, s).config, SCHEMA_FIELD)) == SCHEMA_VERSION for s in range(2))
    assert again.get_keys_by_prefix(h) == [f"{h}_0".encode()] and fsck(again).ok
