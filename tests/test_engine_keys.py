"""Engine key profiles (MasterConfig.key_profile, docs/engines.md): keys built to each engine's
documented format (SGLang HiCache's Mooncake backend with and without its tag, MHA, MLA, TP and
PP ranks, split heads; vLLM's MooncakeStoreConnector; LMCache's mooncakestore backend) route all
keys of a page to one shard, index them under one radix node (the page's hash), let
`expire_guaranteed([hash])` end every part of a page, and keep "children alive implies parent
alive" under eviction pressure. The default configuration handles SGLang's tagged keys."""
from __future__ import annotations

import hashlib
from typing import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import examples, mount, put, raises_code
from mooncake_redis import ErrorCode, Master, MasterConfig, MasterError, ReplicateConfig
from mooncake_redis.fsck import fsck
from mooncake_redis.keys import (DEFAULT_KEY_PROFILE, KEY_PROFILES, compile_key_pattern, node_shard, prefix_of,
                                 routing_part, shard_of)

SMALL = 100


# ---- the engines' key builders, as their code writes keys (sources: docs/engines.md) -----------

def sglang_keys(page_hash: str, *, tag: str | None = None, model: str | None = None, tp_rank: int = 0,
                mla: bool = False, pp_rank: int | None = None, split: int | None = None) -> list[str]:
    """SGLang HiCache's Mooncake backend (mooncake_store.py): the config prefix is the backend
    tag and the model name ("/" as "-") joined by "_", prepended with "_" (`_tag_keys`); MHA
    writes `<key>_<rank>_k` and `_v` per TP rank (`<rank>_<pp rank>` with pipeline
    parallelism; split heads: the ranks local_rank * split ...), MLA `<key>_<mla suffix>_k`
    with an empty suffix (`<key>__k`), or the PP rank."""
    parts = ([tag] if tag is not None else []) + (["-".join(model.split("/"))] if model else [])
    key = f"{'_'.join(parts)}_{page_hash}" if parts else page_hash
    if mla:
        return [f"{key}_{'' if pp_rank is None else pp_rank}_k"]
    ranks = [tp_rank] if split is None else [tp_rank * split + i for i in range(split)]
    out = []
    for r in ranks:
        suffix = f"{r}" if pp_rank is None else f"{r}_{pp_rank}"
        out += [f"{key}_{suffix}_k", f"{key}_{suffix}_v"]
    return out


def vllm_key(chunk_hash: str, model: str, tp_rank: int = 0, pcp: int = 0, dcp: int = 0, pp_rank: int = 0,
             group: int = 0, cache_prefix: str = "") -> str:
    """vLLM's MooncakeStoreConnector (mooncake/store/data.py, PoolKey.build_prefix and
    build_key_string): the block hash's hex after the rank fields."""
    prefix = f"{cache_prefix}@" if cache_prefix else ""
    return (f"{prefix}{model}@tp_rank:{tp_rank}@pcp{pcp}@dcp{dcp}@pp_rank:{pp_rank}@group:{group}"
            f"@{chunk_hash}")


def lmcache_key(chunk_hash: int, model: str, world_size: int, worker_id: int, dtype: str = "bfloat16",
                layer: int | None = None, tags: tuple[tuple[str, str], ...] = ()) -> str:
    """LMCache's CacheEngineKey.to_string (LayerCacheEngineKey with a layer id), the key its
    mooncakestore connector writes: the chunk hash as hex without padding."""
    s = f"{model}@{world_size}@{worker_id}@{chunk_hash:x}@{dtype}"
    if layer is not None:
        s += f"@{layer}"
    return s + "".join(f"@{k}%{v}" for k, v in tags)


def sha(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def xxh(name: str) -> str:  # a 16-byte digest: vLLM's xxhash block hashes
    return hashlib.sha256(name.encode()).hexdigest()[:32]


def lm(name: str) -> int:  # LMCache's chunk hashes are integers
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")


MODEL = "Qwen/Qwen3-8B"
# deployment -> (profile, page node of a name, the keys every writer of the deployment writes for that page)
Deployment = tuple[str, Callable[[str], str], Callable[[str], list[str]]]
DEPLOYMENTS: dict[str, Deployment] = {
    "sglang-mha-tp2-tag-model": ("sglang", sha, lambda n: [
        k for r in (0, 1) for k in sglang_keys(sha(n), tag="prod", model=MODEL, tp_rank=r)]),
    "sglang-mha-model": ("sglang", sha, lambda n: sglang_keys(sha(n), model=MODEL)),
    "sglang-mha-untagged": ("sglang", sha, lambda n: sglang_keys(sha(n))),
    "sglang-mha-pp-split": ("sglang", sha, lambda n: [
        k for pp in (0, 1) for k in sglang_keys(sha(n), model="org/team/m_x", tp_rank=1, pp_rank=pp, split=2)]),
    "sglang-mla-tag-model": ("sglang", sha, lambda n: sglang_keys(sha(n), tag="v2", model=MODEL, mla=True)),
    "sglang-mla-pp": ("sglang", sha, lambda n: [
        k for pp in (0, 1) for k in sglang_keys(sha(n), model=MODEL, mla=True, pp_rank=pp)]),
    "sglang-mla-untagged": ("sglang", sha, lambda n: sglang_keys(sha(n), mla=True)),
    "hash-first-untagged": ("hash-first", sha, lambda n: sglang_keys(sha(n)) + sglang_keys(sha(n), mla=True)),
    "vllm-tp2": ("vllm", sha, lambda n: [vllm_key(sha(n), MODEL, tp_rank=r) for r in (0, 1)]),
    "vllm-prefix-xxhash-pp": ("vllm", xxh, lambda n: [
        vllm_key(xxh(n), MODEL, pp_rank=pp, group=1, cache_prefix="prod") for pp in (0, 1)]),
    "lmcache-ws2": ("lmcache", lambda n: f"{lm(n):x}", lambda n: [
        lmcache_key(lm(n), MODEL, 2, w) for w in (0, 1)]),
    "lmcache-layers-tags": ("lmcache", lambda n: f"{lm(n):x}", lambda n: [
        lmcache_key(lm(n), MODEL, 1, 0, "half", layer, (("user", "alice"),)) for layer in (0, 1, 2)]),
}


def profile_config(profile: str) -> dict:
    """The configuration of a profile: the default profile is the default configuration."""
    return {} if profile == DEFAULT_KEY_PROFILE else {"key_profile": profile}


# ---- the profiles, without a store -------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(DEPLOYMENTS))
def test_every_key_of_a_page_has_the_page_hash_as_prefix_and_shard(name):
    profile, node_of, keys_of = DEPLOYMENTS[name]
    rx = compile_key_pattern(MasterConfig(**profile_config(profile)).radix_key_pattern)
    for page in ("a", "b", "c", "d", "e"):
        node = node_of(page).encode()
        keys = [k.encode() for k in keys_of(page)]
        assert len(set(keys)) == len(keys) >= 1
        for k in keys:
            assert prefix_of(k, rx) == node, (name, k)
            assert routing_part(k, rx) == node
            for shards in (4, 16):
                assert shard_of(k, shards, rx) == node_shard(node, shards)


def test_the_default_profile_handles_sglang_tagged_keys_and_the_former_default_does_not():
    assert MasterConfig().key_profile == "sglang" == DEFAULT_KEY_PROFILE
    h = sha("page")
    tagged = [*sglang_keys(h, tag="prod", model=MODEL), *sglang_keys(h, model=MODEL, mla=True)]
    default = compile_key_pattern(MasterConfig().radix_key_pattern)
    hash_first = compile_key_pattern(KEY_PROFILES["hash-first"])
    for k in tagged:
        assert prefix_of(k.encode(), default) == h.encode()
        assert prefix_of(k.encode(), hash_first) == k.encode()  # each key its own node: why it changed
    # keys the former default matched are matched the same way
    for k in sglang_keys(h) + sglang_keys(h, mla=True) + [h, f"{h}_anything"]:
        assert prefix_of(k.encode(), default) == prefix_of(k.encode(), hash_first) == h.encode()


def test_keys_of_no_profile_format_stay_their_own_node():
    for profile, pattern in KEY_PROFILES.items():
        rx = compile_key_pattern(pattern)
        for k in (b"plain-key", b"sglang_mooncake_store_warmup_key" + b"ab" * 16, b"x" * 64):
            assert prefix_of(k, rx) == k, (profile, k)


def test_profile_and_pattern_name_each_other():
    for profile, pattern in KEY_PROFILES.items():
        assert MasterConfig(key_profile=profile).radix_key_pattern == pattern
        assert MasterConfig(radix_key_pattern=pattern).key_profile == profile
        assert MasterConfig(key_profile=profile, radix_key_pattern=pattern).key_profile == profile
    custom = MasterConfig(radix_key_pattern=r"^model-[a-z]+:([0-9a-f]{64})")
    assert custom.key_profile == "custom"
    assert MasterConfig(key_profile="custom", radix_key_pattern=custom.radix_key_pattern) == custom
    for bad in [dict(key_profile="trtllm"), dict(key_profile="custom"),
                dict(key_profile="vllm", radix_key_pattern=KEY_PROFILES["sglang"]), dict(key_profile=3)]:
        with raises_code(ErrorCode.INVALID_PARAMS):
            MasterConfig(**bad)


# ---- on a store ----------------------------------------------------------------------------

def radix(new_master, profile: str, **config) -> Master:
    m = new_master(enable_radix_tree=True, eviction_high_watermark_ratio=0.000001, eviction_ratio=0.000001,
                   **profile_config(profile), **config)
    mount(m, "seg", 256 * 1024)
    return m


def alive(m: Master, key: str) -> bool:
    try:
        m.describe(key)
    except MasterError as exc:
        assert exc.code == ErrorCode.OBJECT_NOT_FOUND
        return False
    return True


def node_alive(m: Master, node: str, keys: list[str]) -> bool:
    """A key of the node is readable (it exists, and the node's eviction is not under way)."""
    if not any(alive(m, k) for k in keys):
        return False
    try:
        return m.describe_radix_node(node).why != "draining"
    except MasterError as exc:
        assert exc.code == ErrorCode.OBJECT_NOT_FOUND
        return True


@pytest.mark.parametrize("name", sorted(DEPLOYMENTS))
def test_a_chain_of_pages_indexes_routes_and_evicts_leaf_first(new_master, name):
    """Four chained pages of one deployment: every key of a page sits on the page node's shard,
    registered under that node (the page hash), the node's parent is the previous page; under
    eviction pressure one unit a step, a page never goes while the next one is alive."""
    profile, node_of, keys_of = DEPLOYMENTS[name]
    m = radix(new_master, profile)
    pages = [f"{name}-{i}" for i in range(4)]
    nodes = [node_of(p) for p in pages]
    keys = [keys_of(p) for p in pages]
    for i, page_keys in enumerate(keys):
        parent = nodes[i - 1] if i else None
        for k in page_keys:
            put(m, k, SMALL, config=ReplicateConfig(parent_block_hash=parent))
            assert m.transport.shard_of(k.encode()) == node_shard(nodes[i].encode(), m.shards)
            assert m.describe(k).fields["node"] in (nodes[i], nodes[i].encode())
        assert set(m.get_keys_by_prefix(nodes[i])) == {k.encode() for k in page_keys}
        info = m.describe_radix_node(nodes[i])
        assert info.parent == (nodes[i - 1].encode() if i else None)
        assert info.shard == node_shard(nodes[i].encode(), m.shards)
    m.advance_clock(20_000)
    gone: list[int] = []
    for _ in range(100):
        for shard in range(m.shards):
            m.evict_step(shard, 1)
            m.drain_radix_outbox([shard])
            live = [node_alive(m, n, k) for n, k in zip(nodes, keys)]
            for i in range(1, len(nodes)):
                assert not live[i] or live[i - 1], f"page {i - 1} evicted under its live child"
            gone += [i for i, up in enumerate(live) if not up and i not in gone]
        if len(gone) == len(nodes):
            break
    assert gone == [3, 2, 1, 0]
    assert fsck(m).ok


@pytest.mark.parametrize("name", ["sglang-mha-tp2-tag-model", "sglang-mla-tag-model", "vllm-tp2", "lmcache-ws2"])
@pytest.mark.parametrize("radix_on", [False, True], ids=["index-off", "index-on"])
def test_expire_guaranteed_by_page_hash_ends_every_key_of_that_page(new_master, name, radix_on):
    profile, node_of, keys_of = DEPLOYMENTS[name]
    m = new_master(enable_radix_tree=radix_on, eviction_high_watermark_ratio=0.000001, eviction_ratio=0.000001,
                   **profile_config(profile))
    mount(m, "seg", 256 * 1024)
    pages = [f"{name}-g{i}" for i in range(2)]
    for i, p in enumerate(pages):
        parent = node_of(pages[i - 1]) if i and radix_on else None
        for k in keys_of(p):
            put(m, k, SMALL, config=ReplicateConfig(guaranteed_ttl_ms=600_000, parent_block_hash=parent))
    m.advance_clock(20_000)
    m.run_eviction()
    assert all(alive(m, k) for p in pages for k in keys_of(p))  # guaranteed: nothing evicted
    # the first page's node has a live child with the index on: end the leaf's guarantee
    target = pages[-1] if radix_on else pages[0]
    assert m.expire_guaranteed([node_of(target)]) == [len(keys_of(target))]
    m.run_eviction()
    for p in pages:
        assert all(alive(m, k) == (p != target) for k in keys_of(p)), p


def test_the_pattern_of_an_existing_store_is_kept(new_master):
    """A store written with the former default ("hash-first") keeps it: reopened without a
    config, or with one that names no profile or pattern, it routes by it; with a config of
    another profile, a store of several shards is refused (its keys would move), one of one
    shard takes it for the keys written from now on."""
    m = new_master(key_profile="hash-first")
    for k in m.transport.keys:  # a store written before key_profile existed: no such field
        m.redis.hdel(k.config, "key_profile")
    reopened = Master._open(m.redis, None)
    assert reopened.config.key_profile == "hash-first"
    tagged = sglang_keys(sha("p"), model=MODEL)[0].encode()
    assert prefix_of(tagged, reopened.transport.key_pattern) == tagged
    assert Master._open(m.redis, MasterConfig(shards=m.shards)).config.key_profile == "hash-first"
    if m.shards > 1:
        with raises_code(ErrorCode.INVALID_PARAMS):
            Master._open(m.redis, MasterConfig(shards=m.shards, key_profile="sglang"))
        assert Master._open(m.redis, MasterConfig(shards=m.shards, key_profile="hash-first")).config == m.config
    else:
        assert Master._open(m.redis, MasterConfig(shards=1, key_profile="sglang")).config.key_profile == "sglang"
        assert Master._open(m.redis, None).config.key_profile == "sglang"


# ---- the invariant under eviction pressure, SGLang's tagged keys -----------------------------

N_NODES = 8
TREE_KEYS = ("prod", "fp8")  # two deployments' tags: 2 TP ranks x K/V each
op_st = st.one_of(
    st.tuples(st.just("put"), st.integers(0, N_NODES - 1), st.integers(0, 7)),
    st.tuples(st.just("read"), st.integers(0, N_NODES - 1)),
    st.tuples(st.just("remove"), st.integers(0, N_NODES - 1)),
    st.tuples(st.just("advance"), st.sampled_from([1_000, 6_000, 20_000])),
    st.tuples(st.just("evict"), st.integers(0, 3), st.integers(1, 3)),
    st.tuples(st.just("drain"), st.integers(0, 3)),
)


def tagged_page_keys(h: str) -> list[str]:
    return [k for tag in TREE_KEYS for r in (0, 1) for k in sglang_keys(h, tag=tag, model=MODEL, tp_rank=r)]


@settings(max_examples=examples(20), deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=st.lists(op_st, min_size=5, max_size=40))
def test_no_page_of_tagged_keys_is_evicted_while_a_child_is_alive(new_master, ops):
    """The default configuration with SGLang's tagged keys (two tags, two TP ranks, K and V: 8
    keys a page), pages in a binary tree (page i's parent is (i - 1) // 2): after every step a
    page whose keys went without a remove had no live child, and fsck is clean at the end."""
    m = radix(new_master, DEFAULT_KEY_PROFILE)
    hashes = [sha(f"tree{i}") for i in range(N_NODES)]
    keys = [tagged_page_keys(h) for h in hashes]
    parent = {i: (i - 1) // 2 if i else None for i in range(N_NODES)}
    live: set[int] = set()
    for op in ops:
        kind = op[0]
        if kind == "put":
            i, j = op[1], op[2]
            p = hashes[parent[i]] if parent[i] is not None else None
            try:
                put(m, keys[i][j], SMALL, config=ReplicateConfig(parent_block_hash=p))
            except MasterError as exc:
                assert exc.code in (ErrorCode.OBJECT_ALREADY_EXISTS, ErrorCode.NO_AVAILABLE_HANDLE), exc
        elif kind == "read":
            try:
                m.get_replica_list(keys[op[1]][0])
            except MasterError as exc:
                assert exc.code == ErrorCode.OBJECT_NOT_FOUND
        elif kind == "remove":
            for k in keys[op[1]]:
                try:
                    m.remove(k, force=True)
                except MasterError as exc:
                    assert exc.code == ErrorCode.OBJECT_NOT_FOUND
        elif kind == "advance":
            m.advance_clock(op[1])
        elif kind == "evict":
            if op[1] < m.shards:
                m.evict_step(op[1], op[2])
        elif op[1] < m.shards:
            m.drain_radix_outbox([op[1]])
        now_live = {i for i in range(N_NODES) if node_alive(m, hashes[i], keys[i])}
        if kind != "remove":
            for i in live - now_live:
                kids = [c for c in range(N_NODES) if parent[c] == i]
                assert not any(c in now_live for c in kids), f"page {i} evicted with a live child ({op})"
        live = now_live
    m.drain_radix_outbox()
    m.reconcile_radix_all(grace_ms=0)
    report = fsck(m)
    assert report.ok, report.summary()


# ---- serve --key-profile -----------------------------------------------------------------------

def test_serve_key_profile_for_a_new_store_and_an_existing_one(valkey):
    """`serve --key-profile` configures a new store; an existing store of one shard takes a new
    profile, one of several shards refuses it (as a different --shards)."""
    from mooncake_redis.cli.serve import _connect_for_serve

    for ns, shards in (("kp1", 1), ("kp4", 4)):
        m = _connect_for_serve(valkey.url, ns, shards, "vllm")
        assert (m.shards, m.config.key_profile) == (shards, "vllm")
        assert m.config.radix_key_pattern == KEY_PROFILES["vllm"]
        m.close()
        m = _connect_for_serve(valkey.url, ns, None, None)  # a restart keeps it
        assert m.config.key_profile == "vllm"
        m.close()
        if shards > 1:
            with raises_code(ErrorCode.INVALID_PARAMS):
                _connect_for_serve(valkey.url, ns, None, "lmcache")
        else:
            m = _connect_for_serve(valkey.url, ns, None, "lmcache")
            assert m.config.key_profile == "lmcache"
            m.close()
    m = _connect_for_serve(valkey.url, "kpdefault", None, None)
    assert m.config.key_profile == DEFAULT_KEY_PROFILE
    m.close()
