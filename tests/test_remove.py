"""remove, remove_by_regex and remove_all."""
from __future__ import annotations

import re

import pytest

from helpers import WRITER, mount, present, put, raises_code
from mooncake_redis import ErrorCode, ReplicateConfig, SoftPinAction


@pytest.fixture
def m(master):
    mount(master, "seg", 1 << 20)
    return master


def test_remove_missing_is_not_found(m):
    with raises_code(ErrorCode.OBJECT_NOT_FOUND):
        m.remove("nope")
    with raises_code(ErrorCode.OBJECT_NOT_FOUND):
        m.remove("nope", force=True)


def test_remove_frees_space_and_the_key(m):
    put(m, "k", 100)
    put(m, "other", 50)
    m.remove("k")
    assert m.usage().used_bytes == 50 and m.usage().objects == 1
    assert not m.exist_key("k")
    with raises_code(ErrorCode.OBJECT_NOT_FOUND):
        m.describe("k")
    put(m, "k", 30)  # the key can be written again
    assert m.get_replica_list("k").replicas[0].size == 30


def test_leased_object_is_kept_unless_forced(m):
    put(m, "k", 100)
    m.get_replica_list("k")
    with raises_code(ErrorCode.OBJECT_HAS_LEASE):
        m.remove("k")
    assert m.exist_key("k") and m.usage().used_bytes == 100
    m.remove("k", force=True)
    assert not m.exist_key("k") and m.usage().used_bytes == 0


def test_in_progress_object_is_not_removed_even_with_force(m):
    m.put_start(WRITER, "k", 100)
    for force in (False, True):
        with raises_code(ErrorCode.REPLICA_IS_NOT_READY):
            m.remove("k", force=force)
    assert m.usage().used_bytes == 100 and m.usage().objects == 1
    m.put_end(WRITER, "k")  # the put can still finish
    assert m.exist_key("k")


def test_pins_do_not_block_remove(m):
    put(m, "soft", 10, config=ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE))
    put(m, "hard", 10, config=ReplicateConfig(with_hard_pin=True))
    put(m, "both", 10, config=ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=60_000,
                                               with_hard_pin=True))
    assert m.describe("soft").soft_pin_until_ms is not None and m.describe("hard").hard_pinned
    for k in ("soft", "hard", "both"):
        m.remove(k)
    assert m.usage().objects == 0 and m.usage().used_bytes == 0


# ---- remove_by_regex / remove_all ----------------------------------------------------------

def test_remove_by_regex_uses_search_semantics(m):
    anchored_hits = ["user/1", "user/42"]
    search_only = ["x/user/1", "user/1/tail", "my-user/7", "user/12x"]  # match r"user/\d+" only with search
    others = ["user/abc", "admin/1"]
    for k in anchored_hits + search_only + others:
        put(m, k, 10)
    assert m.remove_by_regex(r"^user/\d+$") == 2
    assert present(m, anchored_hits) == [False, False]
    assert all(present(m, search_only + others))
    # unanchored: re.search finds the pattern anywhere in the key (re.match would take 2 only)
    assert [k for k in search_only if re.match(r"user/\d+", k)] == ["user/1/tail", "user/12x"]
    assert m.remove_by_regex(r"user/\d+") == len(search_only)
    assert present(m, search_only) == [False] * len(search_only)
    assert present(m, others) == [True, True]
    assert m.remove_by_regex(r"nothing-matches-this") == 0
    assert m.usage().objects == 2 and m.usage().used_bytes == 20


def test_remove_by_regex_and_remove_all_skip_leased_and_in_progress(m):
    for k in ("a/free-1", "a/free-2", "a/leased", "b/free"):
        put(m, k, 10)
    m.get_replica_list("a/leased")
    m.put_start(WRITER, "a/busy", 10)
    assert m.remove_by_regex(r"^a/") == 2
    assert present(m, ["a/free-1", "a/free-2", "a/leased", "b/free"]) == [False, False, True, True]
    assert m.describe("a/busy").writer == WRITER
    assert m.remove_by_regex(r"^a/", force=True) == 1  # the leased one; never the in-progress one
    assert m.describe("a/busy").writer == WRITER
    put(m, "c/leased", 10)
    m.exist_key("c/leased")
    assert m.remove_all() == 1  # b/free
    assert m.remove_all(force=True) == 1  # c/leased
    assert m.remove_all(force=True) == 0
    assert m.usage().objects == 1 and m.usage().used_bytes == 10  # only a/busy is left
    m.put_end(WRITER, "a/busy")
    assert m.remove_all() == 1
    assert m.usage().objects == 0 and m.usage().used_bytes == 0


def test_remove_by_regex_and_remove_all_page_through_many_objects(m):
    """More objects than one SCAN step (1000) and one FCALL batch (512)."""
    users = [f"user/{i}" for i in range(1100)]
    others = [f"doc/{i}" for i in range(150)]
    keys = users + others
    out = m.batch_put_start(WRITER, keys, [16] * len(keys))
    assert all(isinstance(r, list) for r in out)
    assert set(m.batch_put_end(WRITER, keys)) == {ErrorCode.OK}
    m.batch_get_replica_list(["user/5", "doc/5"])  # two leased objects
    m.put_start(WRITER, "user/busy-1", 16)  # matches r"^user/" but is in progress
    assert m.usage().objects == 1251
    assert m.remove_by_regex(r"^user/\d+$") == 1099
    assert m.exist_key("user/5") and m.describe("user/busy-1").writer == WRITER
    assert m.remove_all() == 149
    assert m.remove_all(force=True) == 2
    assert m.usage().objects == 1 and m.usage().used_bytes == 16


def test_remove_is_scoped_to_the_tenant(m):
    for tenant in ("t1", "t2"):
        put(m, "k", 10, tenant_id=tenant)
        put(m, f"only-{tenant}", 10, tenant_id=tenant)
    put(m, "k", 10)  # the default tenant
    m.remove("k", tenant_id="t1")
    assert not present(m, ["k"], tenant_id="t1")[0]
    assert present(m, ["k"], tenant_id="t2") == [True] and present(m, ["k"]) == [True]
    with raises_code(ErrorCode.OBJECT_NOT_FOUND):
        m.remove("only-t1", tenant_id="t2")
    assert m.remove_by_regex(r"^only-", tenant_id="t2") == 1
    assert present(m, ["only-t1"], tenant_id="t1")[0]
    assert m.remove_all(tenant_id="t1") == 1
    assert present(m, ["k"], tenant_id="t2") == [True] and present(m, ["k"]) == [True]
    assert m.remove_all(tenant_id="t2") == 1
    assert m.remove_all() == 1
    assert m.usage().objects == 0


def test_replica_lists_by_regex_are_reads_of_the_readable_matching_keys(m):
    put(m, "page-1", 10)
    put(m, "page-2", 20)
    put(m, "other", 30)
    m.put_start(WRITER, "page-3", 40)  # in progress: matched, not readable
    assert sorted(m.keys_matching("^page-")) == [b"page-1", b"page-2", b"page-3"]
    got = m.get_replica_list_by_regex("^page-")
    assert {k: r.replicas[0].size for k, r in got.items()} == {b"page-1": 10, b"page-2": 20}
    assert m.describe("page-1").lease_until_ms > 0  # each one a read: leased
    assert m.get_replica_list_by_regex(b"^nothing") == {}
    with raises_code(ErrorCode.INVALID_PARAMS):
        m.get_replica_list_by_regex("(")
