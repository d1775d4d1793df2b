"""Groups and the radix index together (docs/radix.md, docs/group-retention.md): a key put with
a group id under the radix index is its node's (the node is its eviction unit) and a member of
its group; a group id names its shard by the key profile's rule (SGLang's
`sglang-hicache:<page key>` sits with its page); a retained group ranks its keys' nodes as
retained, which keeps every ancestor; protections of a key protect its node and its ancestors,
not the other nodes of its group. For each engine profile, real keys through put, evict, expire
and retain, and a state machine over chains of tagged pages with groups under eviction pressure
that checks "children alive implies parent alive" and that no protected node is evicted."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from helpers import examples, mount, put, raises_code
from mooncake_redis import ErrorCode, Master, MasterError, ReplicateConfig
from mooncake_redis.fsck import fsck
from mooncake_redis.keys import group_routing_part, group_shard_of, node_shard, shard_of
from test_engine_keys import DEPLOYMENTS, MODEL, alive, node_alive, profile_config, sglang_keys, sha

SMALL = 100
LEASE = 10_000  # default_kv_lease_ttl


def radix(new_master, profile: str = "sglang", **config) -> Master:
    """A radix store under eviction pressure (everything evictable goes), where a retention
    protects (allow_evict_retained_groups off unless asked)."""
    config.setdefault("allow_evict_retained_groups", False)
    m = new_master(enable_radix_tree=True, eviction_high_watermark_ratio=0.000001, eviction_ratio=0.000001,
                   **profile_config(profile), **config)
    mount(m, "seg", 256 * 1024)
    return m


def group_of(profile: str, node: str, key: str) -> str:
    """The group id an engine would give a page: SGLang's `sglang-hicache:<page key>` (the key up
    to its hash), else `<profile>:<key>`."""
    if profile in ("sglang", "hash-first"):
        return "sglang-hicache:" + key[:key.index(node) + len(node)]
    return f"{profile}:{key}"


def unit_tier(m: Master, node: str) -> str | None:
    """The tier node's unit sits in (None: none)."""
    k = m.transport.keys[m.node_shard(node.encode())]
    unit = b"r:default:" + node.encode()
    for name, index in (("ordinary", k.tier_ordinary), ("retained", k.tier_retained)):
        if m.redis.zscore(index, unit) is not None:
            return name
    return None


# ---- routing -------------------------------------------------------------------------------

def test_a_group_id_named_after_a_page_key_routes_with_the_page():
    h = sha("page")
    for key in [*sglang_keys(h, tag="prod", model=MODEL), *sglang_keys(h), *sglang_keys(h, mla=True)]:
        g = group_of("sglang", h, key).encode()
        assert group_routing_part(g) == h.encode()
        for shards in (4, 16):
            assert group_shard_of(g, shards) == shard_of(key.encode(), shards) == node_shard(h.encode(), shards)
    # ids of no such form route as before: a {tag}, the pattern on the whole id, or the whole id
    assert group_routing_part(b"req42") == b"req42" and group_routing_part(b"x{t}y") == b"t"
    assert group_routing_part(b"ns:not-a-key") == b"ns:not-a-key"
    assert group_routing_part(f"a_{h}".encode()) == h.encode()


# ---- per profile, on a store ----------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(DEPLOYMENTS))
def test_grouped_pages_index_retain_expire_and_evict_leaf_first(new_master, name):
    """Three chained pages, each page's keys one group: every key is indexed under its page's
    node and a member of its group on the same shard; the leaf's retention keeps the whole chain
    (without allow_evict_retained_groups), and once it ends the chain goes leaf first; a
    guaranteed page's guarantee holds its node until expire_guaranteed of its hash ends it."""
    profile, node_of, keys_of = DEPLOYMENTS[name]
    m = radix(new_master, profile)
    pages = [f"{name}-g{i}" for i in range(3)]
    nodes = [node_of(p) for p in pages]
    keys = [keys_of(p) for p in pages]
    groups = [group_of(profile, n, ks[0]) for n, ks in zip(nodes, keys)]
    for i, page_keys in enumerate(keys):
        parent = nodes[i - 1] if i else None
        m.batch_put_start("w", page_keys, [SMALL] * len(page_keys),
                          ReplicateConfig(group_id=groups[i], parent_block_hash=parent))
        m.batch_put_end("w", page_keys)
    for n, g, page_keys in zip(nodes, groups, keys):
        info = m.describe_radix_node(n)
        assert sorted(info.keys) == sorted(k.encode() for k in page_keys)
        gi = m.describe_group(g)
        assert gi.members == len(page_keys) and gi.why == "radix_nodes" and gi.shard == info.shard
        assert all(m.describe(k).group_id == g for k in page_keys)
    assert m.retain_groups([groups[2]], ttl_ms=60_000)[0] > 0
    assert unit_tier(m, nodes[2]) == "retained"
    m.run_eviction()
    assert all(alive(m, k) for ks in keys for k in ks)  # the leaf is retained, its ancestors have a child
    assert fsck(m).ok
    m.advance_clock(60_001)
    live = [True] * 3
    for _ in range(40):
        for shard in range(m.shards):
            m.evict_step(shard, 1)
        m.drain_radix_outbox()
        now = [node_alive(m, n, ks) for n, ks in zip(nodes, keys)]
        for i in range(2):
            assert now[i] or not now[i + 1], f"page {i} evicted while page {i + 1} lives"
        live = now
        if not any(live):
            break
    assert not any(live)
    m.run_eviction()  # the drains under way end
    for g in groups:
        with raises_code(ErrorCode.OBJECT_NOT_FOUND):
            m.describe_group(g)
    # a guaranteed grouped page: its guarantee protects its node until expire_guaranteed ends it
    page_keys = keys_of(f"{name}-guaranteed")
    node = node_of(f"{name}-guaranteed")
    cfg = ReplicateConfig(group_id=group_of(profile, node, page_keys[0]), guaranteed_ttl_ms=60_000)
    m.batch_put_start("w", page_keys, [SMALL] * len(page_keys), cfg)
    m.batch_put_end("w", page_keys)
    m.run_eviction()
    assert all(alive(m, k) for k in page_keys) and m.describe_radix_node(node).why == "guaranteed"
    assert m.expire_guaranteed([node]) == [len(page_keys)]
    m.run_eviction()
    assert not any(alive(m, k) for k in page_keys)
    report = fsck(m)
    assert report.ok, report.summary()


def test_a_group_member_leaves_its_group_and_node_on_remove(new_master):
    m = radix(new_master)
    h = sha("removed")
    ks = sglang_keys(h, tag="t", model=MODEL)
    g = group_of("sglang", h, ks[0])
    m.batch_put_start("w", ks, [SMALL] * len(ks), ReplicateConfig(group_id=g))
    m.batch_put_end("w", ks)
    m.remove(ks[0])
    assert m.describe_group(g).members == len(ks) - 1
    assert ks[0].encode() not in m.describe_radix_node(h).keys
    m.batch_remove(ks[1:])
    with raises_code(ErrorCode.OBJECT_NOT_FOUND):
        m.describe_group(g)
    with raises_code(ErrorCode.OBJECT_NOT_FOUND):
        m.describe_radix_node(h)
    assert fsck(m).ok


def test_a_protected_member_keeps_its_node_not_the_other_nodes_of_its_group(new_master):
    """A request-level group over two pages (A and B, on the group's shard): a hard pin on one
    key of A keeps all of A, while B, the same group's other node, is evicted. Without the
    index the group is one unit, kept whole by its pinned member (neither is Mooncake's rule,
    which evicts the other members of a group with one pinned member: docs/group-retention.md)."""
    m = radix(new_master)
    group = "req-1"
    shard = group_shard_of(group.encode(), m.shards)
    a, b = [h for h in (sha(f"req-page{i}") for i in range(200)) if node_shard(h.encode(), m.shards) == shard][:2]
    ka, kb = sglang_keys(a), sglang_keys(b)
    put(m, ka[0], SMALL, config=ReplicateConfig(group_id=group, with_hard_pin=True))
    for k in ka[1:] + kb:
        put(m, k, SMALL, config=ReplicateConfig(group_id=group))
    m.run_eviction()
    assert all(alive(m, k) for k in ka) and not any(alive(m, k) for k in kb)
    assert m.describe_group(group).members == len(ka)
    assert fsck(m).ok


def test_without_the_index_a_pinned_member_keeps_its_whole_group(new_master):
    m = new_master(eviction_high_watermark_ratio=0.000001, eviction_ratio=0.000001)
    mount(m, "seg", 64 * 1024)
    keys = [f"{{req-1}}{k}" for k in sglang_keys(sha("a")) + sglang_keys(sha("b"))]
    put(m, keys[0], SMALL, config=ReplicateConfig(group_id="req-1", with_hard_pin=True))
    for k in keys[1:]:
        put(m, k, SMALL, config=ReplicateConfig(group_id="req-1"))
    m.run_eviction()
    assert all(alive(m, k) for k in keys) and m.describe_group("req-1").why == "hard_pin"
    assert fsck(m).ok


def test_a_node_takes_keys_of_a_bounded_number_of_groups(new_master):
    m = radix(new_master)
    h = sha("crowded")
    ks = sglang_keys(h, split=5)  # 10 keys of one page
    for i, k in enumerate(ks):
        g = f"g{i}:{h}"
        if i < 8:
            put(m, k, SMALL, config=ReplicateConfig(group_id=g))
        else:
            with raises_code(ErrorCode.INVALID_PARAMS):
                m.put_start("w", k, SMALL, ReplicateConfig(group_id=g))
    put(m, ks[8], SMALL, config=ReplicateConfig(group_id=f"g0:{h}"))  # a group it has: fine
    assert len(m.describe_radix_node(h).keys) == 9
    assert fsck(m).ok


def test_a_retention_that_starts_after_the_put_and_ends_re_places_the_node(new_master):
    m = radix(new_master, allow_evict_retained_groups=True)
    h = sha("late")
    ks = sglang_keys(h, tag="t", model=MODEL)
    g = group_of("sglang", h, ks[0])
    m.batch_put_start("w", ks, [SMALL] * len(ks), ReplicateConfig(group_id=g))
    m.batch_put_end("w", ks)
    assert unit_tier(m, h) == "ordinary"
    m.retain_groups([g], ttl_ms=5_000)
    assert unit_tier(m, h) == "retained"
    assert fsck(m).ok
    m.advance_clock(5_001)
    assert fsck(m).ok  # the sweep is due: not drift
    m.get_replica_list(ks[0])  # a lease: the step below sweeps, and evicts nothing
    m.evict_step(m.node_shard(h.encode()), 1)  # its sweep ends the retention
    assert unit_tier(m, h) == "ordinary" and all(alive(m, k) for k in ks)
    assert fsck(m).ok


# ---- the invariant, under eviction pressure --------------------------------------------------

N_PAGES = 8  # page i's parent is page (i - 1) // 2
op_st = st.one_of(
    st.tuples(st.just("put"), st.integers(0, N_PAGES - 1), st.integers(0, 1), st.sampled_from(["", "pin", "g"]),
              st.sampled_from(["page", "req"])),
    st.tuples(st.just("read"), st.integers(0, N_PAGES - 1)),
    st.tuples(st.just("retain"), st.integers(-1, N_PAGES - 1), st.sampled_from([3_000, 30_000])),
    st.tuples(st.just("remove"), st.integers(0, N_PAGES - 1)),
    st.tuples(st.just("advance"), st.sampled_from([1_000, 6_000, 20_000])),
    st.tuples(st.just("evict"), st.integers(0, 3), st.integers(1, 3)),
    st.tuples(st.just("drain"),),
)


EVICT_ALL = [("evict", s, 3) for s in range(4)]


@settings(max_examples=examples(20), deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
# a retained leaf, a pinned page, a guaranteed page, a leased page, then their ends
@example(ops=[("put", 0, 0, ""), ("put", 1, 0, ""), ("retain", 1, 3_000), *EVICT_ALL, ("advance", 6_000), *EVICT_ALL])
@example(ops=[("put", 0, 0, ""), ("put", 2, 1, "pin"), ("put", 2, 0, ""), *EVICT_ALL, ("remove", 2), *EVICT_ALL])
@example(ops=[("put", 3, 0, "g"), ("put", 1, 0, ""), ("put", 0, 1, ""), *EVICT_ALL, ("advance", 20_000), *EVICT_ALL])
@example(ops=[("put", 0, 0, ""), ("put", 1, 1, ""), ("read", 1), *EVICT_ALL, ("advance", 20_000), *EVICT_ALL])
# a request-level group over pages 3 and 4 (one key each), retained; page 1 keys in both groups
@example(ops=[("put", 0, 0, ""), ("put", 1, 0, ""), ("put", 3, 0, "", "req"), ("put", 4, 1, "", "req"),
              ("put", 1, 1, "", "req"), ("retain", -1, 3_000), *EVICT_ALL, ("advance", 6_000), *EVICT_ALL])
# a read of a page whose group is retained: its node's retained-tier score is its new lease
@example(ops=[("retain", 0, 3_000), ("put", 0, 0, ""), ("read", 0)])
@given(ops=st.lists(op_st, min_size=5, max_size=40))
def test_grouped_tagged_chains_keep_parents_and_protected_nodes(new_master, ops):
    """SGLang tagged pages (TP ranks 0 and 1, each a _k/_v pair), chained as a binary tree; a
    put's keys join their page's group or a request-level group over several pages ("req", on
    the pages' shard). A put may hard-pin its keys or guarantee them ("pin", "g"); retain gives a
    page's group (or the request's, -1) a retention; reads lease the page's node. After every
    step: a page whose keys vanished without a remove had no live child, and was not protected
    before the step (a hard pin, an active guarantee, an active retention of a group of one of
    its keys, a lease); fsck is clean at the end."""
    m = radix(new_master)
    req = "req-chain"
    shard = group_shard_of(req.encode(), m.shards)
    hashes = [h for h in (sha(f"chain{i}") for i in range(400)) if node_shard(h.encode(), m.shards) == shard][:N_PAGES]
    keys = {i: {r: sglang_keys(hashes[i], tag="prod", model=MODEL, tp_rank=r) for r in (0, 1)} for i in range(N_PAGES)}
    groups = [group_of("sglang", hashes[i], keys[i][0][0]) for i in range(N_PAGES)]
    parent = {i: (i - 1) // 2 if i else None for i in range(N_PAGES)}
    pinned: set[int] = set()
    guaranteed: dict[int, int] = {}
    retained: dict[str, int] = {}  # group -> its retention deadline
    leased: dict[int, int] = {}
    assigned: dict[str, str] = {}  # key -> the group it was put with
    now = m.now_ms()

    def page_keys(i: int) -> list[str]:
        return keys[i][0] + keys[i][1]

    def page_alive(i: int) -> bool:
        return node_alive(m, hashes[i], page_keys(i))

    def protected(i: int) -> bool:
        by_group = any(retained.get(assigned[k], 0) > now for k in page_keys(i) if k in assigned)
        return i in pinned or guaranteed.get(i, 0) > now or by_group or leased.get(i, 0) > now

    live: set[int] = set()
    for op in ops:
        kind = op[0]
        before = {i for i in live if protected(i)}
        if kind == "put":
            i, r, how = op[1], op[2], op[3]
            group = req if len(op) > 4 and op[4] == "req" else groups[i]
            p = hashes[parent[i]] if parent[i] is not None else None
            cfg = ReplicateConfig(group_id=group, parent_block_hash=p, with_hard_pin=how == "pin",
                                  guaranteed_ttl_ms=20_000 if how == "g" else 0)
            got = m.batch_put_start("w", keys[i][r], [SMALL] * 2, cfg)
            done = [k for k, g in zip(keys[i][r], got) if not isinstance(g, ErrorCode)]
            for g in got:
                assert not isinstance(g, ErrorCode) or g in (
                    ErrorCode.OBJECT_ALREADY_EXISTS, ErrorCode.NO_AVAILABLE_HANDLE,
                    ErrorCode.GUARANTEED_CAPACITY_EXCEEDED), g
            if done:
                m.batch_put_end("w", done)
                assigned.update((k, group) for k in done)
                if how == "pin":
                    pinned.add(i)
                elif how == "g" and any(m.describe(k).guaranteed_until_ms for k in done):
                    guaranteed[i] = max(guaranteed.get(i, 0), now + 20_000)
        elif kind == "read":
            i = op[1]
            try:
                m.get_replica_list(keys[i][0][0])
                leased[i] = now + LEASE
            except MasterError as exc:
                assert exc.code in (ErrorCode.OBJECT_NOT_FOUND, ErrorCode.REPLICA_IS_NOT_READY)
        elif kind == "retain":
            group = req if op[1] < 0 else groups[op[1]]
            until = m.retain_groups([group], ttl_ms=op[2])[0]
            assert not isinstance(until, ErrorCode)
            retained[group] = until
        elif kind == "remove":
            i = op[1]
            m.batch_remove(page_keys(i), force=True)
            pinned.discard(i)
            guaranteed.pop(i, None)
        elif kind == "advance":
            now = m.advance_clock(op[1])
        elif kind == "evict":
            if op[1] < m.shards:
                m.evict_step(op[1], op[2])
        else:
            m.drain_radix_outbox()
        now_live = {i for i in range(N_PAGES) if page_alive(i)}
        if kind != "remove":
            for i in live - now_live:  # evicted in this step
                assert i not in before, f"page {i} evicted while protected ({op})"
                kids = [c for c in range(N_PAGES) if parent[c] == i]
                assert not any(c in now_live for c in kids), f"page {i} evicted with a live child ({op})"
        for i in range(N_PAGES):  # a page that is gone lost its keys' pins, guarantees and groups
            gone = [k for k in page_keys(i) if not alive(m, k)]
            for k in gone:
                assigned.pop(k, None)
            if len(gone) == len(page_keys(i)):
                pinned.discard(i)
                guaranteed.pop(i, None)
        live = now_live
    m.drain_radix_outbox()
    m.reconcile_radix_all(grace_ms=0)
    report = fsck(m)
    assert report.ok, report.summary()


# ---- fsck ------------------------------------------------------------------------------------

def test_fsck_finds_and_repairs_the_indexed_membership(new_master):
    m = radix(new_master)
    a, b = sha("fa"), sha("fb")
    ka = sglang_keys(a, tag="t", model=MODEL)
    ga = group_of("sglang", a, ka[0])
    m.batch_put_start("w", ka, [SMALL] * len(ka), ReplicateConfig(group_id=ga))
    m.batch_put_end("w", ka)
    m.retain_groups([ga], ttl_ms=60_000)
    assert fsck(m).ok
    k = m.transport.keys[m.node_shard(a.encode())]
    unit = b"g:default:" + ga.encode()
    m.redis.zrem(k.aggregate(b"indexed", unit), ka[0])            # a member lost
    m.redis.zadd(k.aggregate(b"nodes", unit), {b.encode(): 3})     # a node it has no key in
    m.redis.zrem(k.aggregate(b"groups", b"r:default:" + a.encode()), ga)  # the node forgets its group
    m.redis.zadd(k.tier_ordinary, {b"r:default:" + a.encode(): 0})  # and ranks as not retained
    m.redis.zrem(k.tier_retained, b"r:default:" + a.encode())
    m.redis.hdel(k.radix_node(b"default", a.encode()), "grouped")   # and its record its mark
    report = fsck(m)
    kinds = {f.kind for f in report.findings}
    assert {"indexed_members", "indexed_nodes"} <= kinds, report.summary()
    fsck(m, repair=True)
    report = fsck(m)
    assert report.ok, report.summary()
    assert unit_tier(m, a) == "retained" and m.describe_group(ga).members == len(ka)
    assert m.redis.hget(k.radix_node(b"default", a.encode()), "grouped") == b"1"
    assert not m.redis.exists(k.aggregate(b"groups", b"r:default:" + b.encode()))


def test_retention_members_counts_own_and_indexed_members_page_by_page(new_master):
    m = radix(new_master)
    m.retain_groups([f"empty{i}" for i in range(1030)], ttl_ms=60_000)  # more than a page (1,024)
    m.advance_clock(1)  # the groups with members come last in deadline order
    h = sha("counted")
    ks = sglang_keys(h, tag="t", model=MODEL)
    g = group_of("sglang", h, ks[0])
    m.batch_put_start("w", ks, [SMALL] * len(ks), ReplicateConfig(group_id=g))
    put(m, "{req}x", SMALL, config=ReplicateConfig(group_id="req"))  # not indexed: routed by its tag
    m.retain_groups([g, "req"], ttl_ms=60_000)
    assert sum(m.retention_members()) == len(ks) + 1
    m.advance_clock(60_000)
    assert m.retention_members() == [0] * m.shards
