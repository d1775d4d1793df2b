"""The engine-side helpers of explicit context caching against a real store: pages inside a
cache_control prefix are written guaranteed for the mark's TTL and the rest ordinary, reads of
marked pages renew an active guarantee, and the hit count is the leading run of whole pages."""
from __future__ import annotations

import pytest

from mooncake_redis import ErrorCode, ReplicateConfig


from mooncake_redis.cache_control import prompt_marks, prompt_pages, put_start_pages, read_pages  # noqa: E402

from helpers import T0, WRITER, mount  # noqa: E402

FIVE_MIN, ONE_HOUR = 300_000, 3_600_000
PAGE, PAGE_BYTES = 8, 1024
SUFFIXES = ("_0_k", "_0_v")

# A 1h system prompt (tokens [0, 20)) and a 5m document (up to 41) in a 50-token prompt of
# one-byte tokens: with 8-token pages, pages 0-1 are 1h, 2-4 are 5m, 5 is ordinary (it ends at 48,
# past the last mark); the 2 trailing tokens make no page.
SYSTEM = [{"type": "text", "text": "S" * 20, "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
MESSAGES = [{"role": "user", "content": [{"type": "text", "text": "D" * 21, "cache_control": {"type": "ephemeral"}},
                                         {"type": "text", "text": "question?"}]}]
PAGE_TTLS = [ONE_HOUR, ONE_HOUR, FIVE_MIN, FIVE_MIN, FIVE_MIN, 0]


def the_pages(scheme="sglang", suffixes=SUFFIXES):
    prompt = prompt_marks(MESSAGES, lambda text: list(text.encode()), system=SYSTEM)
    return prompt_pages(prompt.token_ids, prompt.marks, PAGE, scheme=scheme, suffixes=suffixes)


def write(m, pages, tenant_id="default", **kwargs):
    results = put_start_pages(m, WRITER, pages, PAGE_BYTES, tenant_id=tenant_id, **kwargs)
    ok = [k for k, r in zip(pages.keys, results) if not isinstance(r, ErrorCode)]
    assert all(code == ErrorCode.OK for code in m.batch_put_end(WRITER, ok, tenant_id=tenant_id))
    return results


def guarantees(m, pages, tenant_id="default"):
    return [m.describe(k, tenant_id).guaranteed_until_ms for k in pages.keys]


def expected(deadlines):
    """Per key: the page's deadline, or None for an ordinary page."""
    return [d for d in deadlines for _ in SUFFIXES]


@pytest.mark.parametrize("scheme", ["sglang", "blake3"])
def test_marked_pages_are_guaranteed_the_rest_ordinary(new_master, scheme):
    m = new_master()
    mount(m, "seg", 1 << 20)
    pages = the_pages(scheme)
    results = write(m, pages)
    assert all(isinstance(r, list) and r for r in results)
    assert guarantees(m, pages) == expected([T0 + t if t else None for t in PAGE_TTLS])


def test_read_renews_active_guarantees_of_marked_pages(new_master):
    m = new_master()
    mount(m, "seg", 1 << 20)
    pages = the_pages()
    write(m, pages)
    m.advance_clock(60_000)
    read = read_pages(m, pages)
    assert read.hit_pages == 6
    now = T0 + 60_000
    assert guarantees(m, pages) == expected([now + t if t else None for t in PAGE_TTLS])


def test_read_does_not_revive_an_expired_guarantee(new_master):
    m = new_master()
    mount(m, "seg", 1 << 20)
    pages = the_pages()
    write(m, pages)
    m.advance_clock(FIVE_MIN)  # the 5m pages' deadline: expired from here on
    read = read_pages(m, pages)
    assert read.hit_pages == 6
    now = T0 + FIVE_MIN
    assert guarantees(m, pages) == expected([now + ONE_HOUR] * 2 + [None] * 4)


def test_hits_stop_at_the_first_page_missing_a_part(new_master):
    m = new_master()
    mount(m, "seg", 1 << 20)
    pages = the_pages()
    write(m, pages)
    m.remove(pages.keys[2 * 2 + 1], force=True)  # page 2's V part: a guarantee does not stop remove
    read = read_pages(m, pages)
    assert read.hit_pages == 2
    assert read.results[5] == ErrorCode.OBJECT_NOT_FOUND
    assert not isinstance(read.results[4], ErrorCode)


def test_tenant_scope(new_master):
    m = new_master()
    mount(m, "seg", 1 << 20)
    pages = the_pages()
    write(m, pages, tenant_id="t1")
    assert read_pages(m, pages, tenant_id="t1").hit_pages == 6
    assert read_pages(m, pages).hit_pages == 0
    assert guarantees(m, pages, "t1") == expected([T0 + t if t else None for t in PAGE_TTLS])


def test_expire_guaranteed_by_page_hash_reaches_every_part_of_the_page(new_master):
    """Untagged keys start with their page hash, which is their prefix hash in the store."""
    m = new_master()
    mount(m, "seg", 1 << 20)
    pages = the_pages()
    write(m, pages)
    first_hash = pages.keys[0][:-len(SUFFIXES[0])]
    assert m.expire_guaranteed([first_hash]) == [2]
    assert guarantees(m, pages)[:4] == [None, None, T0 + ONE_HOUR, T0 + ONE_HOUR]


def test_guarantee_fallback_is_passed_to_the_put(new_master):
    """guaranteed_capacity_ratio=0 turns guarantees off: a guaranteed put is refused with
    guarantee_fallback=False, and written ordinary by default (RFC 000: the write falls back to a
    normal put); ordinary pages are written either way."""
    m = new_master(guaranteed_capacity_ratio=0.0)
    mount(m, "seg", 1 << 20)
    pages = the_pages()
    results = put_start_pages(m, WRITER, pages, PAGE_BYTES, guarantee_fallback=False)
    assert [r == ErrorCode.GUARANTEED_CAPACITY_EXCEEDED for r in results] == [t > 0 for t in pages.ttl_ms]
    m.batch_put_revoke(WRITER, pages.keys[-2:])
    write(m, pages)
    assert guarantees(m, pages) == [None] * len(pages.keys)
    assert read_pages(m, pages).hit_pages == 6


def test_at_the_guaranteed_limit_the_helper_falls_back_by_default(new_master):
    """A shard's guaranteed share holds a few pages: by default every key is still written, the
    pages within the limit guaranteed and the rest ordinary; none is refused."""
    m = new_master(guaranteed_capacity_ratio=0.125)
    mount(m, "seg", 16 * PAGE_BYTES)  # room for every key; 2 guaranteed keys per shard at most
    pages = the_pages()
    results = write(m, pages)
    assert not any(isinstance(r, ErrorCode) for r in results), results
    until = guarantees(m, pages)
    marked = [t > 0 for t in pages.ttl_ms]
    assert 0 < sum(u is not None for u in until) < sum(marked)
    assert all(u is None for u, g in zip(until, marked) if not g)
    assert m.usage().guaranteed_bytes <= m.usage().guaranteed_limit_bytes
    assert read_pages(m, pages).hit_pages == 6
