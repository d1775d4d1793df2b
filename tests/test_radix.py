"""The radix index (MasterConfig.enable_radix_tree): registration (inline at put_start and in
bulk), shells, prefix and subtree queries, leaf-first eviction with the node as the unit,
cross-shard links through the outbox, crashes between the halves of a step, reconciliation,
fsck, and the invariant "children alive implies parent alive"."""
from __future__ import annotations

import hashlib

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from helpers import WRITER, examples, mount, put, raises_code
from mooncake_redis import ErrorCode, MasterConfig, MasterError, ReplicateConfig
from mooncake_redis.fsck import fsck
from mooncake_redis.keys import node_shard

SMALL = 100


def H(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def on_shard(m, shard: int, stem: str) -> str:
    """A prefix hash whose node lives on `shard`."""
    i = 0
    while node_shard(H(f"{stem}{i}").encode(), m.shards) != shard:
        i += 1
    return H(f"{stem}{i}")


def radix(new_master, **config):
    m = new_master(enable_radix_tree=True, **config)
    mount(m, "seg", 64 * 1024)
    return m


def put_node(m, h: str, parent: str | None, n_keys: int = 1, tenant_id: str = "default") -> list[str]:
    keys = [f"{h}_{i}" for i in range(n_keys)]
    for k in keys:
        put(m, k, SMALL, config=ReplicateConfig(parent_block_hash=parent), tenant_id=tenant_id)
    return keys


def alive(m, key: str) -> bool:
    """Does the object exist? (describe: an inspection, no lease.)"""
    try:
        m.describe(key)
    except MasterError as exc:
        assert exc.code == ErrorCode.OBJECT_NOT_FOUND
        return False
    return True


def evict_everything(m) -> None:
    """Evict every evictable unit: the target is 0 bytes."""
    m.run_eviction()


@pytest.fixture
def rm(new_master):
    return radix(new_master, eviction_high_watermark_ratio=0.000001, eviction_ratio=0.000001)


# ---- registration ------------------------------------------------------------------------

def test_register_describe_and_reregister(rm):
    m = rm
    a, b = H("a"), H("b")
    m.register_radix_node(a)
    m.register_radix_node(b, a)
    m.register_radix_node(b, a)  # the same parent again: fine
    with raises_code(ErrorCode.INVALID_PARAMS):
        m.register_radix_node(b, H("other"))  # a chained hash has one parent
    info = m.describe_radix_node(a)
    assert info.parent is None and info.children == [b.encode()] and info.shell and info.why == "no_members"
    info = m.describe_radix_node(b)
    assert info.parent == a.encode() and info.children == [] and info.shell
    assert m.batch_register_radix_nodes([(H("c"), a), ("", None), (H("c"), H("x")), (a, a)]) == [
        ErrorCode.OK, ErrorCode.INVALID_PARAMS, ErrorCode.INVALID_PARAMS, ErrorCode.INVALID_PARAMS]
    with raises_code(ErrorCode.OBJECT_NOT_FOUND):
        m.describe_radix_node(H("unknown"))
    assert sorted(m.describe_radix_node(a).children) == sorted([b.encode(), H("c").encode()])


def test_a_put_with_another_parent_is_refused_and_writes_nothing(rm):
    m = rm
    a, b = H("a"), H("b")
    put_node(m, b, a)
    used = m.usage().used_bytes
    with raises_code(ErrorCode.INVALID_PARAMS):
        m.put_start(WRITER, f"{b}_9", SMALL, ReplicateConfig(parent_block_hash=H("z")))
    assert m.usage().used_bytes == used and not m.exist_key(f"{b}_9")


def test_child_before_parent_makes_a_shell_filled_by_its_keys(rm):
    m = rm
    a, b = H("a"), H("b")
    put_node(m, b, a)
    shell = m.describe_radix_node(a)
    assert shell.shell and shell.children == [b.encode()] and shell.why == "no_members"
    put_node(m, a, None, 2)
    full = m.describe_radix_node(a)
    assert not full.shell and full.keys == sorted(f"{a}_{i}".encode() for i in range(2))
    assert full.why == "has_children"


def test_keys_by_prefix_and_subtree(rm):
    m = rm
    a, b, c, d = H("a"), H("b"), H("c"), H("d")
    put_node(m, a, None, 2)
    put_node(m, b, a, 3)
    put_node(m, c, a)
    put_node(m, d, b)
    put_node(m, a, None, 1, tenant_id="other")  # nodes are tenant-scoped
    assert m.get_keys_by_prefix(a) == [f"{a}_0".encode(), f"{a}_1".encode()]
    assert m.get_keys_by_prefix(a, tenant_id="other") == [f"{a}_0".encode()]
    assert m.get_keys_by_prefix(H("nothing")) == []
    assert m.get_subtree_keys(a, 0) == m.get_keys_by_prefix(a)
    level1 = set(m.get_subtree_keys(a, 1))
    assert level1 == {f"{x}".encode() for x in [f"{a}_0", f"{a}_1", f"{b}_0", f"{b}_1", f"{b}_2", f"{c}_0"]}
    assert len(m.get_subtree_keys(a, 5)) == 7 and m.get_subtree_keys(a, 5)[-1] == f"{d}_0".encode()
    with raises_code(ErrorCode.INVALID_PARAMS):
        m.get_subtree_keys(a, -1)


def test_radix_off_writes_no_index(new_master):
    m = new_master()
    mount(m, "seg", 64 * 1024)
    put(m, f"{H('a')}_0", SMALL, config=ReplicateConfig(parent_block_hash=H("p")))
    for k in m.transport.keys:
        assert not m.redis.keys(k.prefix("radix_node") + b"*") and not m.redis.exists(k.radix_outbox)
    assert "node" not in m.describe(f"{H('a')}_0").fields
    with raises_code(ErrorCode.INVALID_PARAMS):
        m.register_radix_node(H("a"))


def test_grouped_keys_are_indexed_and_members_of_their_group(rm):
    m = rm
    key = f"{H('a')}_0"
    group = f"sglang-hicache:{H('a')}"  # routes with the key (tests/test_radix_groups.py)
    put(m, key, SMALL, config=ReplicateConfig(group_id=group, parent_block_hash=H("p")))
    info = m.describe(key)
    assert info.fields["node"] == H("a") and info.group_id == group and "group" not in info.fields
    assert m.describe_radix_node(H("a")).keys == [key.encode()]
    assert m.describe_radix_node(H("p")).children == [H("a").encode()]
    assert m.describe_group(group).members == 1


def test_a_key_the_pattern_does_not_match_is_its_own_node(rm):
    m = rm
    put(m, "plain-key", SMALL)
    assert m.get_keys_by_prefix("plain-key") == [b"plain-key"]


def test_a_custom_pattern_routes_and_indexes_by_its_group(new_master):
    m = radix(new_master, radix_key_pattern=r"^model-[a-z]+:([0-9a-f]{64})")
    h = H("a")
    put(m, f"model-x:{h}:0", SMALL)
    put(m, f"model-y:{h}:1", SMALL)
    assert m.get_keys_by_prefix(h) == [f"model-x:{h}:0".encode(), f"model-y:{h}:1".encode()]
    assert m.transport.shard_of(f"model-x:{h}:0".encode()) == node_shard(h.encode(), m.shards)


def test_bad_patterns_are_refused():
    for bad in ["(", "no-group", "(a)(b)"]:
        with raises_code(ErrorCode.INVALID_PARAMS):
            MasterConfig(radix_key_pattern=bad)


# ---- eviction ------------------------------------------------------------------------------

def test_the_rfc_example_evicts_leaves_then_their_parent(rm):
    """A -> {B -> {D, E}, C -> {F leased}}: D and E go, then B; C and A stay."""
    m = rm
    n = {x: H(x) for x in "ABCDEF"}
    for x, p in [("A", None), ("B", "A"), ("C", "A"), ("D", "B"), ("E", "B"), ("F", "C")]:
        put_node(m, n[x], n[p] if p else None)
    m.advance_clock(20_000)
    m.get_replica_list(f"{n['F']}_0")  # leased for default_kv_lease_ttl
    evict_everything(m)
    assert {x: alive(m, f"{n[x]}_0") for x in "ABCDEF"} == {
        "A": True, "B": False, "C": True, "D": False, "E": False, "F": True}
    assert m.describe_radix_node(n["A"]).children == [n["C"].encode()]
    m.advance_clock(20_000)  # the lease ran out: F, then C, then A
    evict_everything(m)
    assert not any(alive(m, f"{n[x]}_0") for x in "ABCDEF")
    assert all(s.nodes == 0 for s in m.radix_stats())


def test_a_node_is_evicted_all_or_none(rm):
    m = rm
    a = H("a")
    keys = put_node(m, a, None, 5)
    m.advance_clock(20_000)
    m.get_replica_list(keys[3])  # one leased key protects the whole node
    evict_everything(m)
    assert all(alive(m, k) for k in keys)
    m.advance_clock(20_000)
    step = m.evict_step(node_shard(a.encode(), m.shards))
    assert step.units == 1 and step.objects == 5
    assert not any(alive(m, k) for k in keys)


def test_protections_of_a_child_protect_every_ancestor(rm):
    m = rm
    chain = [H(f"c{i}") for i in range(6)]
    for i, h in enumerate(chain):
        put_node(m, h, chain[i - 1] if i else None)
    m.put_start(WRITER, f"{chain[-1]}_1", SMALL, ReplicateConfig(parent_block_hash=chain[-2]))  # in progress
    m.advance_clock(20_000)
    evict_everything(m)
    assert all(alive(m, f"{h}_0") for h in chain)
    m.put_end(WRITER, f"{chain[-1]}_1")
    m.add_task_ref(f"{chain[-1]}_1")
    m.advance_clock(20_000)
    evict_everything(m)
    assert all(alive(m, f"{h}_0") for h in chain)
    m.release_task_ref(f"{chain[-1]}_1")
    evict_everything(m)
    assert not any(alive(m, f"{h}_0") for h in chain)


def test_leaf_first_under_pressure_one_unit_a_step(rm):
    m = rm
    a = H("root")
    nodes = {a: None}
    for i in range(12):
        parent = list(nodes)[i // 2]
        nodes[H(f"n{i}")] = parent
    put_node(m, a, None)
    for h, p in list(nodes.items())[1:]:
        put_node(m, h, p)
    m.advance_clock(20_000)
    gone_order = []
    for _ in range(200):
        for shard in range(m.shards):
            m.evict_step(shard, 1)
            m.drain_radix_outbox([shard])
            for h, p in nodes.items():
                if h not in gone_order and not alive(m, f"{h}_0"):
                    gone_order.append(h)
                    kids = [c for c, q in nodes.items() if q == h]
                    assert not any(alive(m, f"{c}_0") for c in kids), "a parent went before its child"
        if len(gone_order) == len(nodes):
            break
    assert len(gone_order) == len(nodes) and gone_order[-1] == a


def test_remove_unregisters_and_a_parent_becomes_a_leaf(rm):
    m = rm
    a, b = H("a"), H("b")
    put_node(m, a, None)
    put_node(m, b, a, 2)
    m.remove(f"{b}_0")
    assert m.describe_radix_node(b).keys == [f"{b}_1".encode()]
    m.remove(f"{b}_1")
    m.drain_radix_outbox()
    with raises_code(ErrorCode.OBJECT_NOT_FOUND):
        m.describe_radix_node(b)
    assert m.describe_radix_node(a).children == [] and m.describe_radix_node(a).why == ""
    assert m.remove_by_regex(f"^{a}") == 1
    with raises_code(ErrorCode.OBJECT_NOT_FOUND):
        m.describe_radix_node(a)


def test_revoke_and_discard_unregister(rm):
    m = rm
    a, b = H("a"), H("b")
    put_node(m, a, None)
    m.put_start(WRITER, f"{b}_0", SMALL, ReplicateConfig(parent_block_hash=a))
    m.put_revoke(WRITER, f"{b}_0")
    m.drain_radix_outbox()
    assert m.describe_radix_node(a).children == []


# ---- across shards -------------------------------------------------------------------------

@pytest.fixture
def cross(rm):
    if rm.shards == 1:
        pytest.skip("needs parent and child on different shards")
    return rm, on_shard(rm, 0, "parent"), on_shard(rm, 1, "child")


def test_cross_shard_cascade(cross):
    m, p, c = cross
    put_node(m, p, None)
    put_node(m, c, p)
    assert m.describe_radix_node(p).children == [c.encode()]
    m.advance_clock(20_000)
    assert m.evict_step(0).units == 0  # the parent has a live child on shard 1
    assert m.evict_step(1).units == 1  # the child goes; the unlink waits in shard 1's outbox
    assert m.describe_radix_node(p).why == "has_children"
    assert m.radix_stats()[1].outbox == 1
    assert m.drain_radix_outbox([1]) == 1
    assert m.describe_radix_node(p).why == ""
    assert m.evict_step(0).units == 1


def test_links_of_one_call_share_a_seq_until_an_outbox_entry(cross):
    """Same-shard links of one call take one seq (one HINCRBY a call); a link after an outbox
    entry of the call takes a newer one, so that an unlink written before it never removes it."""
    m, far, _ = cross  # far: a parent on shard 0
    near = on_shard(m, 1, "near")
    kids = [on_shard(m, 1, f"kid{i}") for i in range(3)]
    put_node(m, far, None)
    put_node(m, near, None)
    m.batch_put_start(WRITER, [f"{k}_0" for k in kids], [SMALL] * 3, parents=[near, far, near])
    k1, k0 = m.transport.keys[1], m.transport.keys[0]
    seq = [m.redis.zscore(k1.radix_kids("default", near), kids[0]),
           m.redis.zscore(k0.radix_kids("default", far), kids[1]),
           m.redis.zscore(k1.radix_kids("default", near), kids[2])]
    assert seq[0] < seq[1] < seq[2]
    m.batch_put_start(WRITER, [f"{on_shard(m, 1, f'more{i}')}_0" for i in range(2)], [SMALL] * 2, parents=[near, near])
    scores = sorted(m.redis.zrange(k1.radix_kids("default", near), 0, -1, withscores=True), key=lambda kv: kv[1])
    assert [s for _, s in scores][-2:] == [seq[2] + 1] * 2  # one seq for both, newer than the last call's


def test_a_link_not_delivered_blocks_the_childs_completion(cross, monkeypatch):
    m, p, c = cross
    put_node(m, p, None)
    monkeypatch.setattr(type(m), "drain_radix_outbox", lambda self, *a, **k: 0)  # the putter crashed
    m.put_start(WRITER, f"{c}_0", SMALL, ReplicateConfig(parent_block_hash=p))
    with raises_code(ErrorCode.RADIX_LINK_PENDING):
        m.put_end(WRITER, f"{c}_0")
    assert m.describe_radix_node(c).link_pending and m.describe_radix_node(p).children == []
    monkeypatch.undo()
    assert m.drain_radix_outbox() == 1  # what a worker does
    m.put_end(WRITER, f"{c}_0")
    assert m.describe_radix_node(p).children == [c.encode()]


def test_applied_but_not_acknowledged_steps_replay_harmlessly(cross):
    m, p, c = cross
    put_node(m, p, None)
    put_node(m, c, p)
    m.advance_clock(20_000)
    m.evict_step(1)
    (entry,) = m.transport.call("mc_radix_outbox", 1, 10)
    m.transport.call("mc_radix_apply", 0, entry)  # the drainer died before its ack
    put_node(m, c, p)  # the child comes back: its put drains the old unlink again, then its new link
    assert m.radix_stats()[1].outbox == 0
    assert m.describe_radix_node(p).children == [c.encode()]
    m.transport.call("mc_radix_apply", 0, entry)  # a late replay of the unlink: older than the link
    assert m.describe_radix_node(p).children == [c.encode()]
    assert fsck(m).ok


def test_a_lost_unlink_leaves_a_phantom_that_reconciliation_removes(cross):
    m, p, c = cross
    put_node(m, p, None)
    put_node(m, c, p)
    m.advance_clock(20_000)
    m.evict_step(1)
    m.redis.delete(m.transport.keys[1].radix_outbox)  # the outbox entry is lost
    assert m.describe_radix_node(p).children == [c.encode()]  # safe: the parent is kept too long
    report = fsck(m)
    assert report.kinds() == {"radix_phantom_child": 1}
    assert m.reconcile_radix_all() == (0, 1)
    assert m.describe_radix_node(p).why == ""
    assert fsck(m).ok
    evict_everything(m)
    assert not alive(m, f"{p}_0")


def test_on_one_shard_the_walk_looks_at_no_children_and_fsck_repairs_a_phantom(new_master):
    """One shard writes a link and its child in one call, so only drift leaves a phantom there:
    the reconciliation walk skips the children (two calls a node fewer), fsck finds it."""
    m = radix(new_master, shards=1)
    p, c = H("parent"), H("child")
    put_node(m, p, None)
    put_node(m, c, p)
    m.redis.zadd(m.transport.keys[0].radix_kids("default", p), {H("gone"): 1})  # planted
    assert m.reconcile_radix_all() == (0, 0)
    assert fsck(m).kinds() == {"radix_phantom_child": 1}
    fsck(m, repair=True)
    assert fsck(m).ok
    assert m.describe_radix_node(p).children == [c.encode()]


def test_fsck_repairs_an_unlisted_child(cross):
    m, p, c = cross
    put_node(m, p, None)
    put_node(m, c, p)
    k0 = m.transport.keys[0]
    m.redis.zrem(k0.radix_kids("default", p), c)  # the dangerous direction, planted
    report = fsck(m)
    # the parent, listing no child, is also missing from the candidates
    assert report.kinds() == {"radix_child_unlisted": 1, "unit_missing": 1}
    fsck(m, repair=True)
    assert fsck(m).ok
    assert m.describe_radix_node(p).children == [c.encode()] and m.describe_radix_node(p).why == "has_children"


def test_registration_racing_the_parents_eviction_recreates_it_as_a_shell(cross):
    m, p, c = cross
    put_node(m, p, None)
    m.advance_clock(20_000)
    assert m.evict_step(0).units == 1
    put_node(m, c, p)
    shell = m.describe_radix_node(p)
    assert shell.shell and shell.children == [c.encode()]


def test_empty_nodes_go_after_the_grace_period(rm):
    m = rm
    m.register_radix_node(H("lonely"))
    assert m.reconcile_radix_all(grace_ms=60_000) == (0, 0)
    m.advance_clock(60_000)
    assert m.reconcile_radix_all(grace_ms=60_000) == (1, 0)
    with raises_code(ErrorCode.OBJECT_NOT_FOUND):
        m.describe_radix_node(H("lonely"))


def test_the_worker_drains_and_reconciles(cross):
    from mooncake_redis.worker import Worker
    m, p, c = cross
    put_node(m, p, None)
    put_node(m, c, p)
    m.advance_clock(20_000)
    w = Worker(m)
    for _ in range(3):
        w.run_once()
    assert not alive(m, f"{c}_0") and not alive(m, f"{p}_0")
    assert all(s.nodes == 0 and s.outbox == 0 for s in m.radix_stats())


def test_the_workers_reconciliation_walk_starts_once_a_minute_after_the_last(rm):
    from mooncake_redis.worker import RADIX_WALK_EVERY_MS, Worker
    m = rm
    w = Worker(m)
    w.radix_grace_ms = 0
    w.run_once()  # a walk over every shard (each has fewer nodes than a call looks at) ends
    m.register_radix_node(H("lonely"))
    shard = m.node_shard(H("lonely").encode())
    assert w.run_once().radix_nodes_dropped == 0  # the next walk waits
    m.advance_clock(RADIX_WALK_EVERY_MS - 1)
    assert w.run_once().radix_nodes_dropped == 0
    assert m.radix_stats()[shard].nodes == 1
    m.advance_clock(1)
    assert w.run_once().radix_nodes_dropped == 1
    assert all(s.nodes == 0 for s in m.radix_stats())


def test_a_child_put_while_its_parent_is_being_evicted_finds_it_gone(rm):
    """A node with more keys than a step's budget is evicted over several steps; from the first
    one its keys are gone for readers, so a child put meanwhile (on the parent's shard, or on
    another one) finds a parent already evicted: the eviction ends, and the parent stays as a
    shell listing the child, as when the child's put comes after the parent's last key went."""
    m = rm
    p, c = on_shard(m, 0, "parent"), on_shard(m, m.shards - 1, "child")
    keys = put_node(m, p, None, 2)
    m.advance_clock(20_000)
    assert m.evict_step(0, 1).objects == 1  # a budget of 1 for 2 keys: the eviction is under way
    assert m.describe_radix_node(p).why == "draining"
    assert sum(alive(m, k) for k in keys) == 1 and not any(m.exist_key(k) for k in keys)
    with raises_code(ErrorCode.NO_AVAILABLE_HANDLE):
        m.put_start(WRITER, f"{p}_2", SMALL)  # the node takes no new key meanwhile
    put_node(m, c, p)
    assert m.describe_radix_node(p).children == [c.encode()] and m.describe_radix_node(p).why == "draining"
    assert m.evict_step(0, 1).objects == 1  # the rest of the parent goes, its new child does not
    shell = m.describe_radix_node(p)
    assert shell.shell and shell.children == [c.encode()] and shell.why == "no_members"
    assert alive(m, f"{c}_0") and not any(alive(m, k) for k in keys)
    put_node(m, p, None)  # the parent's key comes back under its live child
    assert m.describe_radix_node(p).why == "has_children"
    assert fsck(m).ok


# ---- the invariant -------------------------------------------------------------------------

def being_evicted(m, h: str) -> bool:
    """Is node h's eviction under way (begun, some keys not dropped yet)? An inspection, no lease."""
    try:
        return m.describe_radix_node(h).why == "draining"
    except MasterError as exc:
        assert exc.code == ErrorCode.OBJECT_NOT_FOUND
        return False


def node_alive(m, h: str) -> bool:
    """Is a key of node h readable? (Without a lease: a key exists, and its node is not being
    evicted, which makes every key of it OBJECT_NOT_FOUND for readers.)"""
    return (alive(m, f"{h}_0") or alive(m, f"{h}_1")) and not being_evicted(m, h)


N_NODES = 10
op_st = st.one_of(
    st.tuples(st.just("put"), st.integers(0, N_NODES - 1), st.integers(0, 1)),
    st.tuples(st.just("read"), st.integers(0, N_NODES - 1)),
    st.tuples(st.just("remove"), st.integers(0, N_NODES - 1)),
    st.tuples(st.just("advance"), st.sampled_from([1_000, 6_000, 20_000])),
    st.tuples(st.just("evict"), st.integers(0, 3), st.integers(1, 3)),
    st.tuples(st.just("drain"), st.integers(0, 3)),
    st.tuples(st.just("reconcile"),),
)


@settings(max_examples=examples(25), deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
# node 0 (on shard 0 of 1, shard 2 of 4) with 2 keys and a budget of 1 a step: its eviction is
# under way when its key is put again (NO_AVAILABLE_HANDLE), or when its child (node 1) is put
@example(ops=[("put", 0, 0), ("put", 0, 1), ("evict", 0, 1), ("evict", 2, 1), ("put", 0, 0)])
@example(ops=[("put", 0, 0), ("put", 0, 1), ("evict", 0, 1), ("evict", 2, 1), ("put", 1, 0), ("evict", 2, 1),
              ("evict", 0, 1)])
@given(ops=st.lists(op_st, min_size=5, max_size=50))
def test_no_node_is_evicted_while_a_child_is_alive(new_master, ops):
    """Node i's parent is node (i - 1) // 2 (a binary tree). After every operation: a node whose
    keys vanished without a remove had no child alive that was registered before; and at the
    end, after draining and reconciliation, fsck is clean. A node is alive while a key of it is
    readable: a node whose eviction is under way (drained over several steps when it has more
    keys than a step's budget) is gone from the step that began it, as its keys are for readers,
    although `describe` still shows the keys not dropped yet; a child put meanwhile does not
    bring it back (test_a_child_put_while_its_parent_is_being_evicted_finds_it_gone)."""
    m = radix(new_master, eviction_high_watermark_ratio=0.000001, eviction_ratio=0.000001)
    names = [H(f"node{i}") for i in range(N_NODES)]
    parent = {i: (i - 1) // 2 if i else None for i in range(N_NODES)}
    live: set[int] = set()
    for op in ops:
        kind = op[0]
        if kind == "put":
            i = op[1]
            p = names[parent[i]] if parent[i] is not None else None
            try:
                put(m, f"{names[i]}_{op[2]}", SMALL, config=ReplicateConfig(parent_block_hash=p))
            except MasterError as exc:
                assert exc.code == ErrorCode.OBJECT_ALREADY_EXISTS or (
                    exc.code == ErrorCode.NO_AVAILABLE_HANDLE and being_evicted(m, names[i]))
        elif kind == "read":
            try:
                m.get_replica_list(f"{names[op[1]]}_0")
            except MasterError as exc:
                assert exc.code == ErrorCode.OBJECT_NOT_FOUND
        elif kind == "remove":
            for j in (0, 1):
                try:
                    m.remove(f"{names[op[1]]}_{j}", force=True)
                except MasterError as exc:
                    assert exc.code == ErrorCode.OBJECT_NOT_FOUND
        elif kind == "advance":
            m.advance_clock(op[1])
        elif kind == "evict":
            if op[1] < m.shards:
                m.evict_step(op[1], op[2])
        elif kind == "drain":
            if op[1] < m.shards:
                m.drain_radix_outbox([op[1]])
        else:
            m.reconcile_radix_all()
        now_live = {i for i in range(N_NODES) if node_alive(m, names[i])}
        if kind != "remove":
            for i in live - now_live:  # evicted in this step
                kids = [c for c in range(N_NODES) if parent[c] == i]
                assert not any(c in now_live for c in kids), f"node {i} evicted with a live child ({op})"
        live = now_live
    m.drain_radix_outbox()
    m.reconcile_radix_all(grace_ms=0)
    report = fsck(m)
    assert report.ok, report.summary()


def test_discard_and_the_unmount_sweep_unregister(rm):
    m = rm
    a, b = H("a"), H("b")
    put_node(m, a, None)
    m.put_start(WRITER, f"{b}_0", SMALL, ReplicateConfig(parent_block_hash=a))  # abandoned
    m.advance_clock(m.config.put_start_discard_timeout + 1)
    shard = node_shard(b.encode(), m.shards)
    assert m.transport.call("mc_discard_puts", shard, 16)[0] == 1  # the worker's discard step
    m.drain_radix_outbox()
    with raises_code(ErrorCode.OBJECT_NOT_FOUND):
        m.describe_radix_node(b)
    assert m.describe_radix_node(a).children == []
    m.unmount_segment("seg", "owner")  # the sweep drops a's object: its node goes
    for shard in range(m.shards):
        m.sweep_shard(shard)
    with raises_code(ErrorCode.OBJECT_NOT_FOUND):
        m.describe_radix_node(a)
    assert fsck(m).ok


def test_a_new_child_stops_its_parent_being_a_candidate(rm):
    m = rm
    a, b = H("a"), H("b")
    put_node(m, a, None)
    m.advance_clock(20_000)
    assert m.describe_radix_node(a).why == ""
    m.register_radix_node(b, a)  # a shell child, no keys yet
    assert m.describe_radix_node(a).why == "has_children"
    evict_everything(m)
    assert alive(m, f"{a}_0")


def test_fsck_takes_steps_in_the_outbox_for_no_drift(cross):
    m, p, c = cross
    put_node(m, p, None)
    put_node(m, c, p)
    m.advance_clock(20_000)
    m.evict_step(1)  # the child goes; its unlink waits in shard 1's outbox
    assert m.radix_stats()[1].outbox == 1
    assert fsck(m).ok


def test_fsck_unit_re_places_a_radix_node(rm):
    """mc_fsck_unit re-places a node's unit "r:<tenant>:<hash>" from its record, as it does a
    group's, rather than dropping it as malformed."""
    m = rm
    a = H("a")
    put_node(m, a, None)
    unit = f"r:default:{a}".encode()
    P = m.transport.keys[node_shard(a.encode(), m.shards)].P
    tiers = {k for k in m.redis.keys(P + b":evict:*") if m.redis.zscore(k, unit) is not None}
    assert tiers
    for k in tiers:
        m.redis.zrem(k, unit)
    assert m.redis.execute_command("FCALL", "mc_fsck_unit", 1, P, unit) == b"r"
    assert {k for k in m.redis.keys(P + b":evict:*") if m.redis.zscore(k, unit) is not None} == tiers
    assert fsck(m).ok


def test_a_guaranteed_key_is_indexed_and_its_guarantee_protects_the_node(rm):
    m = rm
    a = H("a")
    put(m, f"{a}_0", SMALL, config=ReplicateConfig(guaranteed_ttl_ms=60_000))
    assert m.get_keys_by_prefix(a) == [f"{a}_0".encode()]
    m.advance_clock(20_000)
    assert m.describe_radix_node(a).why == "guaranteed"
    evict_everything(m)
    assert alive(m, f"{a}_0")
    assert m.expire_guaranteed([a]) == [1]
    evict_everything(m)
    assert not alive(m, f"{a}_0")


def test_a_store_written_before_the_pattern_keeps_its_routing(new_master):
    """A stored configuration without radix_key_pattern routes by the former rule (32-128 hex),
    also for a config that names no pattern; a different pattern for an existing store of several
    shards is refused (its keys would move)."""
    from mooncake_redis import Master
    from mooncake_redis.keys import LEGACY_KEY_PATTERN

    m = new_master()
    for k in m.transport.keys:
        m.redis.hdel(k.config, "radix_key_pattern")
    reopened = Master._open(m.redis, None)
    assert reopened.config.radix_key_pattern == LEGACY_KEY_PATTERN
    key = ("ab" * 16 + "_0").encode()  # 32 hex: a prefix under the former rule only
    assert reopened.transport.shard_of(key) == reopened.transport.shard_of(b"ab" * 16)
    assert Master._open(m.redis, MasterConfig(shards=m.shards)).config.radix_key_pattern == LEGACY_KEY_PATTERN
    if m.shards > 1:
        with raises_code(ErrorCode.INVALID_PARAMS):
            Master._open(m.redis, MasterConfig(shards=m.shards, key_profile="sglang"))
    else:
        assert Master._open(m.redis, MasterConfig(shards=1, key_profile="sglang")).config.radix_key_pattern \
            != LEGACY_KEY_PATTERN
