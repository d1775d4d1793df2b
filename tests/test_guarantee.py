"""Explicit context caching: guaranteed_until at put_start, renew-only reads, the guaranteed-bytes
limits (shard and tenant) with fallback, expire_guaranteed by prefix hash, expiry back to an
ordinary object, and the books through every path that ends a guarantee."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from helpers import T0, OWNER, WRITER, examples, keys_on_shard, mount, put, raises_code, shard_keys, shard_of_key
from mooncake_redis import ErrorCode, MasterError, ReplicateConfig, SoftPinAction
from mooncake_redis.fsck import fsck

pytestmark = pytest.mark.cluster  # these API tests run on the test cluster too (conftest)

TTL = 60_000
G = ReplicateConfig(guaranteed_ttl_ms=TTL)
H1, H2 = "ab" * 32, "cd" * 32  # prefix hashes: keys "<hash>_<n>" share their prefix's shard


def gkeys(prefix: str, n: int) -> list[str]:
    return [f"{prefix}_{i}" for i in range(n)]


def guaranteed_bytes(m, shard: int | None = None) -> int:
    u = m.usage()
    return u.guaranteed_bytes if shard is None else u.shards[shard].guaranteed_bytes


def gone(m, key: str, tenant_id: str = "default") -> bool:
    """No such object (describe is an inspection: it leases nothing)."""
    try:
        m.describe(key, tenant_id)
    except MasterError as exc:
        assert exc.code == ErrorCode.OBJECT_NOT_FOUND
        return True
    return False


def assert_books(m) -> None:
    """Guaranteed bytes equal the live replicas of the objects that carry a guarantee, and fsck
    finds nothing."""
    report = fsck(m)
    assert report.ok, report.summary()


@pytest.fixture
def m(master):
    mount(master, "seg", 1 << 16)
    return master


# ---- put_start ------------------------------------------------------------------------------

def test_a_guaranteed_put_is_guaranteed_until_put_start_plus_ttl(m):
    m.put_start(WRITER, "k", 100, G)
    m.advance_clock(5_000)
    m.put_end(WRITER, "k")
    assert m.describe("k").guaranteed_until_ms == T0 + TTL  # put_start's clock, not put_end's
    assert guaranteed_bytes(m) == 100 and guaranteed_bytes(m, shard_of_key(m, "k")) == 100
    put(m, "plain", 100)
    assert m.describe("plain").guaranteed_until_ms is None and guaranteed_bytes(m) == 100
    assert_books(m)


def test_replicas_count_each(new_master):
    m = new_master()
    mount(m, "a", 4096)
    mount(m, "b", 4096)
    put(m, "k", 100, config=ReplicateConfig(replica_num=2, guaranteed_ttl_ms=TTL))
    assert guaranteed_bytes(m) == 200
    assert_books(m)


@pytest.mark.parametrize("ttl", [-1, 24 * 3600 * 1000 + 1, 1.5, True])
def test_bad_or_too_long_ttl_is_invalid_params(m, ttl):
    with raises_code(ErrorCode.INVALID_PARAMS):
        m.put_start(WRITER, "k", 10, ReplicateConfig(guaranteed_ttl_ms=ttl))
    with raises_code(ErrorCode.INVALID_PARAMS):
        m.get_replica_list("k", guaranteed_ttl_ms=ttl)
    assert m.usage().objects == 0


def test_the_ttl_limit_is_max_guaranteed_ttl(new_master):
    m = new_master(max_guaranteed_ttl=1000)
    mount(m, "seg", 4096)
    with raises_code(ErrorCode.INVALID_PARAMS):
        m.put_start(WRITER, "k", 10, ReplicateConfig(guaranteed_ttl_ms=1001))
    put(m, "k", 10, config=ReplicateConfig(guaranteed_ttl_ms=1000))
    assert m.describe("k").guaranteed_until_ms == T0 + 1000


def test_a_retried_put_start_does_not_renew(m):
    m.put_start(WRITER, "k", 100, G)
    m.advance_clock(1000)
    m.put_start(WRITER, "k", 100, ReplicateConfig(guaranteed_ttl_ms=TTL))  # the same writer's retry
    m.put_end(WRITER, "k")
    m.put_end(WRITER, "k")  # a repeated put_end
    assert m.describe("k").guaranteed_until_ms == T0 + TTL
    assert guaranteed_bytes(m) == 100


# ---- renew-only reads -----------------------------------------------------------------------

def test_reads_renew_an_active_guarantee_and_never_shorten_it(m):
    put(m, "k", 100, config=G)
    m.advance_clock(10_000)
    m.get_replica_list("k", guaranteed_ttl_ms=TTL)
    assert m.describe("k").guaranteed_until_ms == T0 + 10_000 + TTL
    m.get_replica_list("k", guaranteed_ttl_ms=1000)  # shorter: unchanged
    assert m.describe("k").guaranteed_until_ms == T0 + 10_000 + TTL
    m.batch_get_replica_list(["k"], guaranteed_ttl_ms=2 * TTL)
    assert m.describe("k").guaranteed_until_ms == T0 + 10_000 + 2 * TTL
    assert guaranteed_bytes(m) == 100
    assert_books(m)


def test_reads_never_create_or_revive_a_guarantee(m):
    put(m, "plain", 100)
    m.get_replica_list("plain", guaranteed_ttl_ms=TTL)
    assert m.describe("plain").guaranteed_until_ms is None
    put(m, "k", 100, config=G)
    m.advance_clock(TTL)  # exactly at the deadline: ended
    m.get_replica_list("k", guaranteed_ttl_ms=TTL)
    assert m.describe("k").guaranteed_until_ms is None
    assert guaranteed_bytes(m) == 100  # counted until the sweep ends it
    m.run_eviction()
    assert guaranteed_bytes(m) == 0 and m.describe("k").guaranteed_until_ms is None
    assert_books(m)


def test_nothing_else_renews(m):
    put(m, "k", 100, config=G)
    m.advance_clock(TTL - 1)
    m.exist_key("k")
    m.get_replica_list("k")  # a plain read leases, but does not renew
    m.put_end(WRITER, "k")
    assert m.describe("k").guaranteed_until_ms == T0 + TTL


# ---- protection -----------------------------------------------------------------------------

def full_store(m, n_guaranteed: int, n_plain: int, size: int) -> tuple[list[str], list[str]]:
    """Fill shard 0 (a 4096-byte slice) with guaranteed and plain objects, all unleased."""
    keys = keys_on_shard(m, 0, n_guaranteed + n_plain)
    g, p = keys[:n_guaranteed], keys[n_guaranteed:]
    for k in g:
        put(m, k, size, config=G)
    for k in p:
        put(m, k, size)
    m.advance_clock(m.config.default_kv_lease_ttl)  # leases of put_end run out
    return g, p


@pytest.fixture
def small(new_master):
    m = new_master(default_kv_lease_ttl=1000)
    mount(m, "seg", 4096)
    return m


def test_eviction_never_takes_a_guaranteed_object(small):
    g, p = full_store(small, 4, 12, 256)
    report = small.run_eviction()
    assert report.evicted_objects > 0
    assert not any(gone(small, k) for k in g)
    small.advance_clock(TTL)
    small.remove_all(force=True)  # every plain object gone; the guaranteed ones are ordinary now
    assert small.usage().objects == 0
    assert_books(small)


def test_evict_on_put_skips_guaranteed_objects_and_fails_when_only_they_are_left(small):
    g, p = full_store(small, 8, 8, 256)
    new = keys_on_shard(small, 0, 40, stem="new")[16:]
    for k in new[:8]:
        put(small, k, 256)  # each evicts a plain object
    assert all(gone(small, k) for k in p) and not any(gone(small, k) for k in g)
    small.batch_get_replica_list(new[:8])  # leased: with the guaranteed ones, nothing is evictable
    with raises_code(ErrorCode.NO_AVAILABLE_HANDLE):
        small.put_start(WRITER, new[9], 256)  # only guaranteed objects are left: at once, no lock
    assert not any(gone(small, k) for k in g)


def test_a_guaranteed_soft_pinned_object_stays_out_of_the_soft_tier(small):
    k = keys_on_shard(small, 0, 1)[0]
    put(small, k, 256, config=ReplicateConfig(guaranteed_ttl_ms=TTL, soft_pin_action=SoftPinAction.ENABLE))
    small.advance_clock(1000)
    fill = keys_on_shard(small, 0, 20, stem="f")[:15]
    for f in fill:
        put(small, f, 256)
    small.advance_clock(1000)
    small.run_eviction()
    assert not gone(small, k)


def test_at_the_deadline_the_object_is_ordinary_again(small):
    g, p = full_store(small, 2, 0, 256)
    small.advance_clock(TTL - 1000 - 1)  # full_store advanced 1000
    assert small.run_eviction().evicted_objects == 0
    assert small.describe(g[0]).guaranteed_until_ms == T0 + TTL
    small.advance_clock(1)  # now == guaranteed_until
    assert small.describe(g[0]).guaranteed_until_ms is None
    step = small.evict_step(0)
    assert step.state in ("idle", "target")  # below the watermark: nothing to evict
    assert guaranteed_bytes(small) == 0  # the step's sweep ended both guarantees
    small.remove(g[0])  # an ordinary, unleased object
    assert_books(small)


def test_a_guaranteed_member_protects_its_group(small):
    put(small, "{grp}a", 256, config=ReplicateConfig(group_id="grp", guaranteed_ttl_ms=TTL))
    put(small, "{grp}b", 256, config=ReplicateConfig(group_id="grp"))
    small.advance_clock(1000)
    shard = shard_of_key(small, "{grp}a")
    for f in keys_on_shard(small, shard, 30, stem="f")[:14]:
        put(small, f, 256)
    small.advance_clock(1000)
    small.run_eviction()
    assert not gone(small, "{grp}a") and not gone(small, "{grp}b")
    small.advance_clock(TTL)
    small.run_eviction()  # the sweep ends the guarantee: the group is ordinary again
    assert not small.describe("{grp}a").guaranteed_until_ms
    assert_books(small)


def test_remove_still_wins(m):
    put(m, "k", 100, config=G)
    m.remove("k", force=True)
    assert gone(m, "k") and guaranteed_bytes(m) == 0
    assert_books(m)


# ---- capacity -------------------------------------------------------------------------------

def test_the_shard_limit_at_its_boundary(new_master):
    m = new_master(guaranteed_capacity_ratio=0.5)
    mount(m, "seg", 4000)
    a, b, c, d = keys_on_shard(m, 0, 4)
    assert m.usage().shards[0].guaranteed_limit_bytes == 2000
    put(m, a, 1500, config=G)
    used = m.usage().used_bytes
    with raises_code(ErrorCode.GUARANTEED_CAPACITY_EXCEEDED):
        m.put_start(WRITER, b, 501, G)
    assert m.usage().used_bytes == used and gone(m, b)  # nothing allocated
    put(m, b, 500, config=G)  # exactly at the limit
    assert guaranteed_bytes(m, 0) == 2000
    res = m.batch_put_start(WRITER, [c, d], [1, 1], ReplicateConfig(guaranteed_ttl_ms=TTL, guarantee_fallback=True))
    assert all(isinstance(r, list) for r in res)  # written as ordinary objects
    m.batch_put_end(WRITER, [c, d])
    assert m.describe(c).guaranteed_until_ms is None and guaranteed_bytes(m, 0) == 2000
    assert_books(m)


def test_the_limit_counts_every_replica(new_master):
    m = new_master(guaranteed_capacity_ratio=0.5)
    mount(m, "a", 1000)
    mount(m, "b", 1000)
    k = keys_on_shard(m, 0, 1)[0]
    used = m.usage().used_bytes
    with raises_code(ErrorCode.GUARANTEED_CAPACITY_EXCEEDED):
        m.put_start(WRITER, k, 600, ReplicateConfig(replica_num=2, guaranteed_ttl_ms=TTL))
    assert m.usage().used_bytes == used  # the allocation was undone
    assert_books(m)


def test_a_guaranteed_put_past_the_limit_evicts_nothing(new_master):
    """The limit counts every replica asked for before evict-on-put frees room for the key."""
    m = new_master(guaranteed_capacity_ratio=0.5)
    mount(m, "a", 1000)
    mount(m, "b", 1000)
    k, *fill = keys_on_shard(m, 0, 3)
    for key in fill:
        put(m, key, 500, config=ReplicateConfig(replica_num=2))  # both segments full, all evictable
    objects = m.usage().objects
    with raises_code(ErrorCode.GUARANTEED_CAPACITY_EXCEEDED):  # 2 x 600 > 1000, the shard's limit
        m.put_start(WRITER, k, 600, ReplicateConfig(replica_num=2, guaranteed_ttl_ms=TTL))
    assert m.usage().objects == objects and not any(gone(m, key) for key in fill)  # nothing was evicted
    put(m, k, 600, config=ReplicateConfig(replica_num=1, guaranteed_ttl_ms=TTL))  # one replica fits the limit
    assert guaranteed_bytes(m, 0) == 600
    assert_books(m)


def test_ratio_zero_turns_guarantees_off(new_master):
    m = new_master(guaranteed_capacity_ratio=0)
    mount(m, "seg", 4096)
    with raises_code(ErrorCode.GUARANTEED_CAPACITY_EXCEEDED):
        m.put_start(WRITER, "k", 1, G)
    put(m, "k", 1, config=ReplicateConfig(guaranteed_ttl_ms=TTL, guarantee_fallback=True))
    assert m.describe("k").guaranteed_until_ms is None


def test_a_tenant_holds_at_most_its_share(new_master):
    m = new_master(guaranteed_capacity_ratio=0.5, guaranteed_tenant_ratio=0.5)
    mount(m, "seg", 4000)
    k1, k2 = keys_on_shard(m, 0, 2)
    put(m, k1, 1000, config=G, tenant_id="a")
    with raises_code(ErrorCode.GUARANTEED_CAPACITY_EXCEEDED):
        m.put_start(WRITER, k2, 1, G, tenant_id="a")
    put(m, k1, 1000, config=G, tenant_id="b")  # another tenant still has its share
    assert guaranteed_bytes(m, 0) == 2000
    assert_books(m)


def test_expired_guarantees_free_the_limit_for_the_next_put(new_master):
    m = new_master(guaranteed_capacity_ratio=0.5)
    mount(m, "seg", 4000)
    a, b = keys_on_shard(m, 0, 2)
    put(m, a, 2000, config=G)
    m.advance_clock(TTL)
    put(m, b, 2000, config=G)  # the put's own sweep ends a's guarantee first
    assert m.describe(a).guaranteed_until_ms is None and guaranteed_bytes(m, 0) == 2000
    assert_books(m)


# ---- expire_guaranteed ----------------------------------------------------------------------

def test_expire_guaranteed_ends_exactly_its_prefix_and_tenant(m):
    for k in gkeys(H1, 5) + gkeys(H2, 3):
        put(m, k, 10, config=G)
    put(m, gkeys(H1, 1)[0], 10, config=G, tenant_id="other")
    put(m, f"{H1}_plain", 10)
    assert m.expire_guaranteed([H1, H2[:10], "nothing"]) == [5, 0, 0]
    assert all(m.describe(k).guaranteed_until_ms is None for k in gkeys(H1, 5))
    assert all(m.describe(k).guaranteed_until_ms == T0 + TTL for k in gkeys(H2, 3))
    assert m.describe(gkeys(H1, 1)[0], "other").guaranteed_until_ms == T0 + TTL
    assert guaranteed_bytes(m) == 40
    assert m.expire_guaranteed([H1]) == [0]  # nothing left to end
    m.advance_clock(m.config.default_kv_lease_ttl)
    assert m.remove(gkeys(H1, 1)[0]) is None  # ordinary at once
    assert_books(m)


def test_a_key_without_a_prefix_hash_is_its_own_prefix(m):
    put(m, "plain-key", 10, config=G)
    assert m.expire_guaranteed(["plain-key"]) == [1]
    assert m.describe("plain-key").guaranteed_until_ms is None


def test_expire_guaranteed_of_a_large_prefix_takes_several_calls(new_master):
    m = new_master()
    mount(m, "seg", 1 << 20)
    keys = gkeys(H1, 1500)
    for i in range(0, len(keys), 100):
        m.batch_put_start(WRITER, keys[i:i + 100], [10] * 100, G)
        m.batch_put_end(WRITER, keys[i:i + 100])
    assert m.expire_guaranteed([H1]) == [1500]
    assert guaranteed_bytes(m) == 0
    assert_books(m)


def test_expire_guaranteed_bad_input(m):
    with raises_code(ErrorCode.INVALID_PARAMS):
        m.expire_guaranteed([""])
    with raises_code(ErrorCode.INVALID_PARAMS):
        m.expire_guaranteed(["x" * 257])
    with raises_code(ErrorCode.INVALID_PARAMS):
        m.expire_guaranteed(["a"], tenant_id="bad tenant")


# ---- the books through every path that ends a guarantee -------------------------------------

def test_revoke_and_discard_take_the_bytes_off(new_master):
    m = new_master(put_start_discard_timeout=1000, put_start_release_timeout=2000)
    mount(m, "seg", 4096)
    m.put_start(WRITER, "r", 100, G)
    m.put_revoke(WRITER, "r")
    assert guaranteed_bytes(m) == 0
    m.put_start(WRITER, "d", 100, G)
    m.advance_clock(1000)
    m.transport.call("mc_discard_puts", shard_of_key(m, "d"), 16)  # the worker's discard step
    assert gone(m, "d") and guaranteed_bytes(m) == 0
    assert_books(m)


def test_unmount_takes_the_segment_share_off_at_once(new_master):
    m = new_master()
    mount(m, "a", 4096)
    mount(m, "b", 4096)
    put(m, "k", 100, config=ReplicateConfig(replica_num=2, guaranteed_ttl_ms=TTL), tenant_id="t")
    put(m, "j", 50, config=G)
    assert guaranteed_bytes(m) == 250
    m.transport.each("mc_unmount_segment", 2, "name", "a", "client_id", OWNER)  # no sweep yet
    usage = m.usage()
    assert usage.guaranteed_bytes < 250  # k had a replica on "a"
    # the replicas on "b" still count
    infos = {k: m.describe(k, t) for k, t in (("k", "t"), ("j", "default"))}
    assert usage.guaranteed_bytes == sum(i.size * len(i.replicas) for i in infos.values())
    m.unmount_segment("b", OWNER)  # and the sweep of dead replicas
    assert m.usage().guaranteed_bytes == 0 and gone(m, "k", "t")
    assert_books(m)


def test_fsck_repairs_tampered_books(m):
    for k in gkeys(H1, 3):
        put(m, k, 10, config=G)
    put(m, "x", 10, config=G, tenant_id="t2")
    shard = shard_of_key(m, gkeys(H1, 1)[0])
    P = shard_keys(m, shard)
    r = m.redis
    r.hincrby(P.P, "guaranteed_bytes", 7)
    r.hincrby(P.guaranteed_tenants, "default", 3)
    r.hincrby(P.segment("seg"), "g:default", -5)
    r.zrem(P.guaranteed, f"default:{H1}_0")
    r.srem(P.guarantee_prefix("default", H1), f"{H1}_1")
    r.sadd(P.guarantee_prefix("default", H2), f"{H1}_2")
    report = fsck(m)
    kinds = report.kinds()
    for kind in ("shard_guaranteed_bytes", "tenant_guaranteed_bytes", "segment_guaranteed_bytes",
                 "guarantee_index", "guarantee_prefix_missing", "guarantee_prefix_stray"):
        assert kinds.get(kind), (kind, report.summary())
    assert m.expire_guaranteed([H2]) == [0]  # a stray entry never ends another prefix's guarantee
    assert m.describe(f"{H1}_2").guaranteed_until_ms == T0 + TTL
    fixed = fsck(m, repair=True)
    assert not fixed.unrepaired, fixed.summary()
    assert_books(m)
    assert m.expire_guaranteed([H1]) == [3]


# ---- wire contract --------------------------------------------------------------------------

@pytest.mark.parametrize("option,value", [("guaranteed_ttl_ms", "-1"), ("guaranteed_ttl_ms", "-0"),
                                          ("guaranteed_ttl_ms", "1.5"), ("guaranteed_ttl_ms", "86400001"),
                                          ("guarantee_fallback", "2")])
def test_a_raw_caller_gets_an_error_and_no_write(m, option, value):
    P = shard_keys(m, 0).P
    before = m.usage()
    with pytest.raises(Exception) as info:
        m.redis.fcall("mc_put_start", 1, P, 2, "client_id", WRITER, option, value, 2, "key", "size", "k", 10)
    assert "INVALID_PARAMS" in str(info.value)
    assert m.usage() == before


# ---- invariants under random operations -----------------------------------------------------

KEYS = [f"{H1}_{i}" for i in range(4)] + [f"{H2}_{i}" for i in range(4)] + [f"k{i}" for i in range(4)]
op_strategy = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(KEYS), st.integers(64, 900), st.integers(1, 2),
              st.sampled_from([0, 0, 5_000, 30_000]), st.booleans()),
    st.tuples(st.just("read"), st.sampled_from(KEYS), st.sampled_from([0, 2_000, 40_000])),
    st.tuples(st.just("advance"), st.sampled_from([1, 999, 5_000, 20_000])),
    st.tuples(st.just("evict")),
    st.tuples(st.just("remove"), st.sampled_from(KEYS)),
    st.tuples(st.just("expire"), st.sampled_from([H1, H2, "k0"])),
)


@settings(max_examples=examples(20), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op_strategy, min_size=10, max_size=40))
def test_guarantee_invariants_under_random_operations(new_master, ops):
    m = new_master(default_kv_lease_ttl=1000, guaranteed_capacity_ratio=0.5)
    mount(m, "a", 2048)
    mount(m, "b", 2048)
    until: dict[str, int] = {}  # the model: key -> guaranteed_until of live guaranteed objects
    now = T0
    for op in ops:
        kind = op[0]
        if kind == "put":
            _, key, size, reps, ttl, fallback = op
            cfg = ReplicateConfig(replica_num=reps, guaranteed_ttl_ms=ttl, guarantee_fallback=fallback)
            res = m.batch_put_start(WRITER, [key], [size], cfg)[0]
            if isinstance(res, list):
                m.put_end(WRITER, key)
                info = m.describe(key)
                if ttl and info.guaranteed_until_ms is not None:
                    assert info.guaranteed_until_ms == now + ttl
                    until[key] = now + ttl
                else:
                    assert not ttl or fallback, "a guaranteed put without fallback wrote no guarantee"
                    event("fallback")
            elif res == ErrorCode.GUARANTEED_CAPACITY_EXCEEDED:
                assert ttl and not fallback
            else:
                assert res in (ErrorCode.NO_AVAILABLE_HANDLE, ErrorCode.OBJECT_ALREADY_EXISTS), res
        elif kind == "read":
            _, key, ttl = op
            r = m.batch_get_replica_list([key], guaranteed_ttl_ms=ttl)[0]
            if not isinstance(r, ErrorCode) and key in until and until[key] > now:
                until[key] = max(until[key], now + ttl)
        elif kind == "advance":
            now = m.advance_clock(op[1])
        elif kind == "evict":
            m.run_eviction()
        elif kind == "remove":
            if m._remove([op[1].encode()], True, "default")[0] == ErrorCode.OK:
                until.pop(op[1], None)
        elif kind == "expire":
            ended = m.expire_guaranteed([op[1]])[0]
            mine = [k for k, u in until.items() if (k.split("_")[0] if "_" in k else k) == op[1] and u > now]
            assert ended == len(mine), (ended, mine)
            for k in [k for k in until if (k.split("_")[0] if "_" in k else k) == op[1]]:
                until.pop(k)
        # a live guarantee is never evicted, and describe agrees with the model
        for key, u in list(until.items()):
            if u > now:
                info = m.describe(key)  # raises OBJECT_NOT_FOUND if it was evicted
                assert info.guaranteed_until_ms == u, (key, info.guaranteed_until_ms, u)
            elif gone(m, key):
                until.pop(key)
        for s in m.usage().shards:
            assert s.guaranteed_bytes <= s.guaranteed_limit_bytes
    assert_books(m)


# ---- CLI ------------------------------------------------------------------------------------

def test_cli_shows_and_expires_guarantees(valkey):
    import json
    import re

    import redis
    from click.testing import CliRunner

    from mooncake_redis import Master, MasterConfig
    from mooncake_redis.cli.main import cli

    redis.Redis.from_url(valkey.url).flushall()
    m = Master.connect(valkey.url, MasterConfig(shards=2))
    m.freeze_clock(T0)
    mount(m, "seg", 1 << 16)
    key = gkeys(H1, 1)[0]
    put(m, key, 100, config=G)
    run = lambda *a: CliRunner().invoke(cli, ["--redis", valkey.url, *a], env={"MOONCAKE_REDIS_URL": None})  # noqa: E731
    r = run("status", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["total"]["guaranteed_bytes"] == 100
    assert "guaranteed 100 B" in run("status").stdout
    r = run("inspect", key, "--json")
    assert json.loads(r.stdout)["guaranteed_until_ms"] == T0 + TTL
    assert re.search(r"^guaranteed +.*active, 60.0 s left$", run("inspect", key).stdout, re.M)
    r = run("expire-guaranteed", H1, "nothing")
    assert r.exit_code == 0, r.output
    assert f"{H1}  1 guarantee(s) ended" in r.stdout and "nothing  0 guarantee(s) ended" in r.stdout
    assert m.describe(key).guaranteed_until_ms is None
    assert run("expire-guaranteed").exit_code == 2  # usage: at least one prefix
    put(m, gkeys(H1, 2)[1], 100, config=G)
    r = run("expire-guaranteed", H1, "nothing", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == {"command": "expire-guaranteed", "format": 1, "tenant": "default", "ended": 1,
                                    "prefixes": [{"prefix": H1, "ended": 1}, {"prefix": "nothing", "ended": 0}]}
    m.close()
