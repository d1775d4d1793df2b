"""Marked-after-unmarked prefixes: guarantee_cached starts a guarantee on objects already in the
store (reads stay renew-only), bounded by the guaranteed-capacity limit of put_start; an active
one is extended without counting its bytes twice; a grouped radix key's guarantee protects its
node until expire_guaranteed of its page hash; cache_control's put_start_pages guarantees a
marked page that was cached unmarked."""
from __future__ import annotations

import pytest

from helpers import T0, WRITER, keys_on_shard, mount, present, put, raises_code, shard_of_key
from mooncake_redis import ErrorCode, ReplicateConfig
from mooncake_redis.cache_control import guarantee_cached_pages, prompt_marks, prompt_pages, put_start_pages
from mooncake_redis.fsck import fsck
from test_engine_keys import MODEL, sglang_keys, sha

pytestmark = pytest.mark.cluster  # these API tests run on the test cluster too (conftest)

TTL = 60_000


def gone(m, key: str) -> bool:
    return not present(m, [key])[0]


def pressure(new_master, **config):
    m = new_master(eviction_high_watermark_ratio=0.000001, eviction_ratio=0.000001, **config)
    mount(m, "seg", 1 << 16)
    return m


def test_a_cached_object_becomes_guaranteed_and_its_guarantee_ends_as_any(new_master):
    m = pressure(new_master)
    put(m, "k", 100)
    m.get_replica_list("k", guaranteed_ttl_ms=TTL)  # a read never starts one
    assert m.describe("k").guaranteed_until_ms is None
    assert m.guarantee_cached(["k", "missing"], TTL) == [T0 + TTL, ErrorCode.OBJECT_NOT_FOUND]
    assert m.describe("k").guaranteed_until_ms == T0 + TTL
    assert m.usage().shards[shard_of_key(m, "k")].guaranteed_bytes == 100
    m.run_eviction()
    assert not gone(m, "k")
    assert fsck(m).ok
    m.advance_clock(TTL)
    m.run_eviction()  # the sweep ends it; the object is ordinary again, and goes
    assert gone(m, "k") and m.usage().guaranteed_bytes == 0
    assert fsck(m).ok


def test_an_active_guarantee_is_extended_and_counted_once(new_master):
    m = pressure(new_master)
    put(m, "k", 100, config=ReplicateConfig(guaranteed_ttl_ms=TTL))
    m.advance_clock(1_000)
    assert m.guarantee_cached(["k"], 10) == [T0 + TTL]  # an earlier deadline never shortens it
    assert m.guarantee_cached(["k"], TTL) == [T0 + 1_000 + TTL]
    assert m.describe("k").guaranteed_until_ms == T0 + 1_000 + TTL and m.usage().guaranteed_bytes == 100
    assert fsck(m).ok


def test_the_capacity_limit_of_put_start_bounds_it(new_master):
    m = new_master(guaranteed_capacity_ratio=0.5)
    mount(m, "seg", 4000)
    a, b, c = keys_on_shard(m, 0, 3)
    assert m.usage().shards[0].guaranteed_limit_bytes == 2000
    put(m, a, 1500)
    put(m, b, 501)
    put(m, c, 500)
    assert m.guarantee_cached([a, b, c], TTL) == [T0 + TTL, ErrorCode.GUARANTEED_CAPACITY_EXCEEDED, T0 + TTL]
    assert m.describe(b).guaranteed_until_ms is None and "special" not in m.describe(b).fields
    assert m.usage().shards[0].guaranteed_bytes == 2000  # exactly at the limit, as for put_start
    assert fsck(m).ok


def test_a_put_in_progress_and_bad_calls(new_master):
    m = pressure(new_master)
    m.put_start(WRITER, "p", 100)
    assert m.guarantee_cached(["p", b"", "x" * 5000], TTL) == [
        ErrorCode.REPLICA_IS_NOT_READY, ErrorCode.INVALID_PARAMS, ErrorCode.INVALID_PARAMS]
    for ttl in (0, 24 * 3600 * 1000 + 1, True):
        with raises_code(ErrorCode.INVALID_PARAMS):
            m.guarantee_cached(["p"], ttl)
    assert fsck(m).ok


def test_a_grouped_radix_page_guaranteed_in_place_holds_its_node_and_parent(new_master):
    m = pressure(new_master, enable_radix_tree=True)
    parent, child = sha("parent"), sha("child")
    pk, ck = sglang_keys(parent, tag="t", model=MODEL), sglang_keys(child, tag="t", model=MODEL)
    for h, ks, p in ((parent, pk, None), (child, ck, parent)):
        cfg = ReplicateConfig(group_id=f"sglang-hicache:t_{MODEL.replace('/', '-')}_{h}", parent_block_hash=p)
        m.batch_put_start(WRITER, ks, [100] * len(ks), cfg)
        m.batch_put_end(WRITER, ks)
    assert all(isinstance(r, int) and r == T0 + TTL for r in m.guarantee_cached(ck, TTL))
    m.run_eviction()
    assert m.describe_radix_node(child).why == "guaranteed" and not any(gone(m, k) for k in pk + ck)
    assert fsck(m).ok
    assert m.expire_guaranteed([child]) == [len(ck)]
    m.run_eviction()
    assert all(gone(m, k) for k in pk + ck)
    assert fsck(m).ok


def test_put_start_pages_guarantees_a_marked_page_cached_unmarked(new_master):
    m = new_master()
    mount(m, "seg", 1 << 20)
    tokenize = lambda text: list(text.encode())  # noqa: E731
    plain = prompt_marks([{"role": "user", "content": "S" * 32}], tokenize)
    marked = prompt_marks([{"role": "user", "content": [
        {"type": "text", "text": "S" * 32, "cache_control": {"type": "ephemeral"}}]}], tokenize)
    first = prompt_pages(plain.token_ids, plain.marks, 8, suffixes=("_0_k", "_0_v"))
    again = prompt_pages(marked.token_ids, marked.marks, 8, suffixes=("_0_k", "_0_v"))
    put_start_pages(m, WRITER, first, 64)
    m.batch_put_end(WRITER, first.keys)
    marked_keys = [k for k, t in zip(again.keys, again.ttl_ms) if t]
    assert marked_keys and all(m.describe(k).guaranteed_until_ms is None for k in marked_keys)
    results = put_start_pages(m, WRITER, again, 64)
    assert all(r == ErrorCode.OBJECT_ALREADY_EXISTS for k, r in zip(again.keys, results) if k in marked_keys)
    assert all(m.describe(k).guaranteed_until_ms == T0 + 300_000 for k in marked_keys)
    # the helper alone, and a key outside the marks
    assert guarantee_cached_pages(m, again) == [T0 + 300_000 if t else None for t in again.ttl_ms]
    assert fsck(m).ok
