"""Group retention (retain_groups): fixed, tenant-scoped group deadlines, declared before or after
members exist; a retained tier in eviction; bounded admission. The RFC's testing plan, on every
backend, shards 1 and 4, frozen store clock.

Groups and their members share a hash tag ("{t}...") so that with 4 shards they sit on one
shard together with the ordinary objects they are compared with (members must share their
group's shard)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from mooncake_redis import ErrorCode, Master, MasterConfig, MasterError, ReplicateConfig, SoftPinAction
from mooncake_redis.fsck import fsck
from mooncake_redis.keys import shard_of
from mooncake_redis.server import EmbeddedValkey

from helpers import T0, WATERMARKS, raises_code, shard_keys

MASTER_CONFIG = WATERMARKS  # new_master's defaults in this module (conftest)

pytestmark = pytest.mark.cluster  # these API tests run on the test cluster too (conftest)

OWNER, W = "owner", "writer"
OBJ = 1000
CAP = 100_000          # bytes per shard slice
TTL = 10_000           # default lease
HOUR = 3600 * 1000


def mount(m: Master, per_shard: int = CAP) -> None:
    m.mount_segment("seg", per_shard * m.shards, OWNER)


def member(m: Master, group: str, key: str, config: ReplicateConfig | None = None, size: int = OBJ,
           tenant: str = "default") -> None:
    c = config or ReplicateConfig()
    cfg = ReplicateConfig(group_id=group, soft_pin_action=c.soft_pin_action, soft_pin_ttl_ms=c.soft_pin_ttl_ms,
                          with_hard_pin=c.with_hard_pin)
    m.put_start(W, key, size, cfg, tenant_id=tenant)
    m.put_end(W, key, tenant_id=tenant)


def put(m: Master, key: str, config: ReplicateConfig | None = None, size: int = OBJ) -> None:
    m.put_start(W, key, size, config)
    m.put_end(W, key)


def alive(m: Master, key: str, tenant: str = "default") -> bool:
    try:
        m.describe(key, tenant)
        return True
    except MasterError as exc:
        assert exc.code == ErrorCode.OBJECT_NOT_FOUND
        return False


def retained_until(m: Master, group: str, tenant: str = "default") -> int | None:
    return m.describe_group(group, tenant).retained_until_ms


def admitted(result) -> bool:
    """A retain_groups result is a deadline (an int) or an ErrorCode (an IntEnum: check it first)."""
    return not isinstance(result, ErrorCode) and isinstance(result, int)


def shard_of_str(m: Master, key: str) -> int:
    return shard_of(key.encode(), m.shards)


# ---- admission, extension, pre-declaration ---------------------------------------------------------

def test_retention_before_members_exist_covers_later_members_for_the_remaining_lifetime(master):
    m = master
    mount(m)
    assert m.retain_groups(["{t}g"], 60_000) == [T0 + 60_000]
    info = m.describe_group("{t}g")
    assert (info.members, info.retained_until_ms, info.why, info.tier) == (0, T0 + 60_000, "no_members", "")
    m.advance_clock(40_000)
    member(m, "{t}g", "{t}g/a")
    info = m.describe_group("{t}g")
    assert (info.members, info.retained_until_ms, info.tier) == (1, T0 + 60_000, "retained")
    assert m.describe("{t}g/a").soft_pin_until_ms is None  # never copied into members
    m.advance_clock(20_000)  # exactly the deadline: no longer active
    info = m.describe_group("{t}g")
    assert info.retained_until_ms is None and info.tier == "ordinary"  # the rule drops it at once
    assert fsck(m).ok


def test_repeated_calls_extend_but_never_shorten(master):
    m = master
    assert m.retain_groups(["g"], 10_000) == [T0 + 10_000]
    m.advance_clock(1_000)
    assert m.retain_groups(["g"], 2_000) == [T0 + 10_000]       # shorter: kept
    assert m.retain_groups(["g"], 20_000) == [T0 + 21_000]      # longer: extended
    assert retained_until(m, "g") == T0 + 21_000
    assert sum(s.held for s in m.retention_usage()) == 1        # counted once


def test_ttl_out_of_range_raises_and_bad_group_ids_fail_alone(new_master):
    m = new_master(max_group_retention=HOUR)
    for ttl in (0, -1, HOUR + 1, 1.5, True, "10"):
        with raises_code(ErrorCode.INVALID_PARAMS):
            m.retain_groups(["g"], ttl)
    with raises_code(ErrorCode.INVALID_PARAMS):
        m.retain_groups("g", 1000)  # a string, not a list of ids
    got = m.retain_groups(["", "x" * 257, 7, None, "ok", b"raw\xff", "x" * 256], HOUR)
    bad = ErrorCode.INVALID_PARAMS
    assert got == [bad, bad, bad, bad, T0 + HOUR, T0 + HOUR, T0 + HOUR]
    assert retained_until(m, b"raw\xff") == T0 + HOUR
    with raises_code(ErrorCode.INVALID_PARAMS):
        m.retain_groups(["g"], 1000, tenant_id="bad tenant")


def test_describe_group_not_found_without_members_or_active_retention(master):
    m = master
    with raises_code(ErrorCode.OBJECT_NOT_FOUND):
        m.describe_group("nothing")
    m.retain_groups(["g"], 1_000)
    m.advance_clock(1_000)
    with raises_code(ErrorCode.OBJECT_NOT_FOUND):
        m.describe_group("g")  # expired, memberless (its record waits for the sweep)


# ---- nothing else moves the deadline ---------------------------------------------------------------

def test_reads_exist_checks_put_ends_and_pins_never_move_it(master):
    m = master
    mount(m)
    member(m, "{t}g", "{t}g/a")
    member(m, "{t}g", "{t}g/b", ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=5 * HOUR))
    [deadline] = m.retain_groups(["{t}g"], HOUR)
    leases = m.describe_group("{t}g").lease_until_ms
    assert leases == T0  # retain_groups leased nothing
    m.advance_clock(1_000)
    m.get_replica_list("{t}g/a")
    m.batch_get_replica_list(["{t}g/a", "{t}g/b"])
    assert m.exist_key("{t}g/b")
    m.put_end(W, "{t}g/a")                       # a repeated put_end
    member(m, "{t}g", "{t}g/c")                  # another member completes
    member(m, "{t}g", "{t}g/d", ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=9 * HOUR))
    m.add_task_ref("{t}g/a")
    m.release_task_ref("{t}g/a")
    info = m.describe_group("{t}g")
    assert info.retained_until_ms == deadline == T0 + HOUR
    assert info.lease_until_ms == T0 + 1_000 + TTL  # the reads leased the group, not the retention
    assert info.tier == "soft_retained"
    assert m.describe("{t}g/a").soft_pin_until_ms is None
    assert fsck(m).ok


def test_soft_pins_and_retention_never_renew_or_clear_each_other(master):
    m = master
    mount(m)
    soft = ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=30_000)
    member(m, "{t}g", "{t}g/a", soft)
    m.retain_groups(["{t}g"], 60_000)
    assert m.describe_group("{t}g").tier == "soft_retained"
    m.advance_clock(30_000)  # the soft pin ends; the retention goes on
    m.evict_step(shard_of_str(m, "{t}g"))  # sweeps the deadline indexes
    info = m.describe_group("{t}g")
    assert (info.tier, info.retained_until_ms) == ("retained", T0 + 60_000)
    assert m.describe("{t}g/a").soft_pin_until_ms == T0 + 30_000
    member(m, "{t}g", "{t}g/b", ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=HOUR))
    m.advance_clock(30_000)  # the retention ends; b's soft pin goes on
    m.evict_step(shard_of_str(m, "{t}g"))
    info = m.describe_group("{t}g")
    assert (info.tier, info.retained_until_ms) == ("soft", None)
    assert m.describe("{t}g/b").soft_pin_until_ms == T0 + 30_000 + HOUR
    assert fsck(m).ok


# ---- eviction ----------------------------------------------------------------------------------------

def _scenario(m: Master) -> dict[str, list[str]]:
    """On the shard of tag {t}: a hard-pinned filler keeps the shard over its high watermark, then
    units are written (and read) at increasing times: soft-pinned s0, retained group ga, ordinary
    o0, soft-pinned s1, retained group gb, ordinary o1, and group gc, both retained and
    soft-pinned. Every lease then runs out. Returns unit -> its keys."""
    mount(m)
    put(m, "{t}filler", ReplicateConfig(with_hard_pin=True), size=88_000)
    soft = ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=HOUR)
    m.retain_groups(["{t}ga", "{t}gb", "{t}gc"], HOUR)
    units = {"s0": ["{t}s0"], "ga": ["{t}ga/1"], "o0": ["{t}o0"], "s1": ["{t}s1"], "gb": ["{t}gb/1", "{t}gb/2"],
             "o1": ["{t}o1"], "gc": ["{t}gc/1"]}
    for unit, keys in units.items():
        for key in keys:
            if unit.startswith("g"):
                member(m, "{t}" + unit, key, soft if unit == "gc" else None)
            else:
                put(m, key, soft if unit.startswith("s") else None)
            m.get_replica_list(key)
        m.advance_clock(10)
    m.advance_clock(TTL + 100)
    return units


def _eviction_order(m: Master, units: dict[str, list[str]]) -> list[str]:
    """Evict in one-unit steps until the shard is blocked; the units in the order they went."""
    sh = shard_of_str(m, "{t}")
    order: list[str] = []
    for _ in range(20):
        step = m.evict_step(sh, max_units=1)
        for unit, keys in units.items():
            if unit not in order and not any(alive(m, k) for k in keys):
                order.append(unit)
        if step.state in ("blocked", "idle", "target"):
            break
    assert alive(m, "{t}filler")
    return order


def test_fallback_order_ordinary_first_then_retained_and_soft_by_lease(master):
    m = master
    units = _scenario(m)
    assert _eviction_order(m, units) == ["o0", "o1", "s0", "ga", "s1", "gb", "gc"]
    assert fsck(m).ok


def test_retained_groups_stay_when_not_allowed(new_master):
    m = new_master(allow_evict_retained_groups=False)
    units = _scenario(m)
    assert _eviction_order(m, units) == ["o0", "o1", "s0", "s1"]  # gc needs both flags
    assert m.evict_step(shard_of_str(m, "{t}")).state == "blocked"


def test_soft_pinned_units_stay_when_not_allowed_and_a_both_unit_needs_both_flags(new_master):
    m = new_master(allow_evict_soft_pinned_objects=False)
    units = _scenario(m)
    assert _eviction_order(m, units) == ["o0", "o1", "ga", "gb"]


def test_the_step_rechecks_the_retention_when_it_evicts(new_master):
    """A stale index (the group left in the ordinary tier) cannot get a retained group evicted
    while retained groups may not be: the step re-checks the rule and re-places it instead."""
    m = new_master(allow_evict_retained_groups=False)
    mount(m)
    put(m, "{t}filler", ReplicateConfig(with_hard_pin=True), size=95_000)
    member(m, "{t}g", "{t}g/1")
    m.retain_groups(["{t}g"], HOUR)
    k = shard_keys(m, shard_of_str(m, "{t}"))
    m.redis.zrem(k.tier_retained, "g:default:{t}g")
    m.redis.zadd(k.tier_ordinary, {"g:default:{t}g": T0})
    step = m.evict_step(shard_of_str(m, "{t}"))
    assert step.units == 0 and alive(m, "{t}g/1")
    assert m.describe_group("{t}g").tier == "retained" and m.redis.zscore(k.tier_retained, "g:default:{t}g") == T0
    m.advance_clock(HOUR)  # expired: the same step now finds it ordinary
    m.evict_step(shard_of_str(m, "{t}"))
    assert not alive(m, "{t}g/1")


def test_expired_retention_makes_the_group_ordinary_again(master):
    m = master
    units = _scenario(m)
    m.advance_clock(HOUR)  # retentions and soft pins are over: everything is ordinary, by lease
    assert _eviction_order(m, units) == ["s0", "ga", "o0", "s1", "gb", "o1", "gc"]


def test_leases_hard_pins_and_puts_in_progress_stay_authoritative(master):
    m = master
    mount(m)
    put(m, "{t}filler", ReplicateConfig(with_hard_pin=True), size=95_000)
    m.retain_groups(["{t}leased", "{t}hard", "{t}busy"], HOUR)
    member(m, "{t}leased", "{t}leased/1")
    member(m, "{t}hard", "{t}hard/1", ReplicateConfig(with_hard_pin=True))
    m.put_start(W, "{t}busy/1", OBJ, ReplicateConfig(group_id="{t}busy"))
    m.get_replica_list("{t}leased/1")  # leased until now + TTL
    step = m.evict_step(shard_of_str(m, "{t}"))
    assert step.state == "blocked" and step.units == 0
    m.advance_clock(TTL)
    m.evict_step(shard_of_str(m, "{t}"))
    assert not alive(m, "{t}leased/1") and alive(m, "{t}hard/1") and alive(m, "{t}busy/1")


def test_a_guaranteed_member_protects_its_retained_group_until_the_guarantee_ends(master):
    m = master
    mount(m)
    put(m, "{t}filler", ReplicateConfig(with_hard_pin=True), size=95_000)
    m.retain_groups(["{t}g"], HOUR)
    m.put_start(W, "{t}g/1", OBJ, ReplicateConfig(group_id="{t}g", guaranteed_ttl_ms=5 * TTL))
    m.put_end(W, "{t}g/1")
    assert m.describe_group("{t}g").why == "guaranteed"
    m.advance_clock(TTL + 1)
    assert m.evict_step(shard_of_str(m, "{t}")).state == "blocked" and alive(m, "{t}g/1")
    m.advance_clock(4 * TTL)  # the guarantee ends; the retention goes on, and the fallback tier may go
    m.evict_step(shard_of_str(m, "{t}"))
    assert not alive(m, "{t}g/1")
    assert m.describe_group("{t}g").retained_until_ms == T0 + HOUR  # the record outlives its members
    assert fsck(m).ok


def test_evicting_every_member_keeps_the_retention_for_new_members(master):
    m = master
    units = _scenario(m)
    _eviction_order(m, units)
    info = m.describe_group("{t}gb")
    assert (info.members, info.retained_until_ms, info.why) == (0, T0 + HOUR, "no_members")
    m.remove("{t}filler", force=True)
    member(m, "{t}gb", "{t}gb/3")
    assert m.describe_group("{t}gb").tier == "retained"
    assert fsck(m).ok


# ---- cleanup -------------------------------------------------------------------------------------

def test_sweep_deletes_expired_memberless_records_and_frees_their_slots(new_master):
    m = new_master(max_retained_groups=16)
    mount(m)
    sh = shard_of_str(m, "{t}")
    share = m.retention_usage()[sh].share  # 16 with one shard, 4 with four
    tags = [f"{{t}}g{i}" for i in range(share)]
    assert all(admitted(x) for x in m.retain_groups(tags, 1_000))
    member(m, tags[0], "{t}g0/a")
    assert m.retain_groups(["{t}late"], 1_000) == [ErrorCode.RETENTION_LIMIT_EXCEEDED]
    m.advance_clock(1_000)
    m.evict_step(sh)  # the worker's step sweeps due deadlines
    k = shard_keys(m, sh)
    assert m.redis.zcard(k.deadline_retention) == 0 and not m.redis.exists(k.retained_tenants)
    assert [m.redis.exists(k.group("default", t)) for t in tags] == [1] + [0] * (share - 1)  # g0 has a member
    assert m.describe_group(tags[0]).retained_until_ms is None
    assert m.retention_usage()[sh].held == 0
    assert all(admitted(x) for x in m.retain_groups([f"{{t}}n{i}" for i in range(share)], 1_000))
    assert fsck(m).ok


def test_retain_groups_itself_frees_expired_slots_first(new_master):
    m = new_master(max_retained_groups=16)
    share = m.retention_usage()[shard_of_str(m, "{t}")].share
    m.retain_groups([f"{{t}}g{i}" for i in range(share)], 1_000)
    assert m.retain_groups(["{t}late"], 1_000) == [ErrorCode.RETENTION_LIMIT_EXCEEDED]
    m.advance_clock(1_000)
    assert all(admitted(x) for x in m.retain_groups([f"{{t}}n{i}" for i in range(share)], 1_000))


# ---- limits --------------------------------------------------------------------------------------

def test_store_wide_limit_is_never_exceeded_and_reached_when_every_shard_fills(new_master):
    m = new_master(max_retained_groups=10)
    got = m.retain_groups([f"g{i}" for i in range(400)], HOUR)
    ok = [g for g in got if admitted(g)]
    assert len(ok) == 10  # 400 ids fill every shard's share; the shares add up to the limit
    assert set(got) - set(ok) == {ErrorCode.RETENTION_LIMIT_EXCEEDED}
    usage = m.retention_usage()
    assert sum(s.share for s in usage) == 10 and all(s.active <= s.share for s in usage)
    # repeats never count twice, and still succeed at the limit
    again = m.retain_groups([f"g{i}" for i, g in enumerate(got) if admitted(g)], HOUR)
    assert all(admitted(x) for x in again)
    assert sum(s.held for s in m.retention_usage()) == 10


def test_per_tenant_limit(new_master):
    m = new_master(max_retained_groups=100, max_retained_groups_per_tenant=4)
    for tenant in ("a", "b"):
        got = m.retain_groups([f"g{i}" for i in range(200)], HOUR, tenant_id=tenant)
        assert sum(admitted(g) for g in got) == 4
    assert sum(s.active for s in m.retention_usage()) == 8


def test_per_tenant_limit_defaults_to_the_store_wide_one():
    assert MasterConfig(max_retained_groups=7).max_retained_groups_per_tenant == 7
    assert MasterConfig().max_retained_groups_per_tenant == 65_536
    with pytest.raises(MasterError):
        MasterConfig(max_retained_groups_per_tenant=-1)


ADMIT = textwrap.dedent("""
    import sys
    from mooncake_redis import Master
    m = Master.connect(sys.argv[1])
    got = [m.retain_groups([g], 3_600_000)[0] for g in sys.argv[3:]]
    print(sum(int(g) > 0 for g in got))
""")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["valkey"])
def test_concurrent_admission_from_several_processes_never_exceeds_the_limit(new_master):
    m = new_master(max_retained_groups=24, max_retained_groups_per_tenant=24)
    url = m.redis.connection_pool.connection_kwargs
    url = f"redis://{url['host']}:{url['port']}"
    procs = [subprocess.Popen([sys.executable, "-c", ADMIT, url, "default", *[f"p{p}-g{i}" for i in range(60)]],
                              stdout=subprocess.PIPE, text=True) for p in range(4)]
    admitted = [int(p.communicate(timeout=120)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    usage = m.retention_usage()
    assert sum(admitted) == sum(s.held for s in usage) == 24  # 240 tries fill every share
    assert all(s.held <= s.share for s in usage)
    assert fsck(m).ok


# ---- tenants -------------------------------------------------------------------------------------

def test_the_same_group_id_in_two_tenants_is_two_groups(master):
    m = master
    mount(m)
    assert m.retain_groups(["{t}g"], 1_000, tenant_id="a") == [T0 + 1_000]
    assert m.retain_groups(["{t}g"], 5_000, tenant_id="b") == [T0 + 5_000]
    member(m, "{t}g", "{t}g/x", tenant="a")
    assert (retained_until(m, "{t}g", "a"), retained_until(m, "{t}g", "b")) == (T0 + 1_000, T0 + 5_000)
    assert m.describe_group("{t}g", "a").members == 1 and m.describe_group("{t}g", "b").members == 0
    with raises_code(ErrorCode.OBJECT_NOT_FOUND):
        m.describe_group("{t}g", "c")
    m.advance_clock(1_000)
    assert m.describe_group("{t}g", "a").tier == "ordinary" and retained_until(m, "{t}g", "b") == T0 + 5_000


# ---- wire contract ---------------------------------------------------------------------------------

def test_raw_calls_with_bad_values_get_an_error_and_write_nothing(master):
    m = master
    p0 = shard_keys(m, 0).P

    def keys() -> set:
        return {k for k in m.redis.scan_iter(match=p0 + b"*")}

    before = keys()
    for argv in ([2, "ttl_ms", "0", "tenant", "t", 1, "group", "g"],
                 [1, "ttl_ms", "-5", 1, "group", "g"],
                 [1, "ttl_ms", "1.5", 1, "group", "g"],
                 [1, "ttl_ms", str(24 * HOUR + 1), 1, "group", "g"],
                 [0, 1, "group", "g"],
                 [2, "ttl_ms", "10", "color", "red", 1, "group", "g"],
                 [2, "ttl_ms", "10", "tenant", "a b", 1, "group", "g"],
                 [1, "ttl_ms", "10", 1, "key", "g"],
                 [1, "ttl_ms", "10"],
                 ["x"]):
        with raises_code(ErrorCode.INVALID_PARAMS):
            m.transport.call("mc_retain_groups", 0, *argv)
    assert keys() == before
    assert m.transport.call("mc_retain_groups", 0, 1, "ttl_ms", "10", 1, "group", "x" * 257) == [-600]
    assert keys() == before
    for argv in ([1, "group", ""], [0], [2, "group", "g", "x", "y"]):
        with raises_code(ErrorCode.INVALID_PARAMS):
            m.transport.call("mc_describe_group", 0, *argv)
    for fn, argv in (("mc_fsck_retention", ["bad tenant", "g"]), ("mc_fsck_retention_counts", ["t", "1"]),
                     ("mc_fsck_retention_counts", ["t", "-1", "2"])):
        with raises_code(ErrorCode.INVALID_PARAMS):
            m.transport.call(fn, 0, *argv)
    assert keys() == before


# ---- fsck ----------------------------------------------------------------------------------------

def test_fsck_audits_and_repairs_the_retention_index_and_counts(master):
    m = master
    mount(m)
    m.retain_groups(["{t}a", "{t}b", "{t}c"], HOUR)
    m.retain_groups(["{t}a"], HOUR, tenant_id="other")
    member(m, "{t}a", "{t}a/1")
    k = shard_keys(m, shard_of_str(m, "{t}"))
    m.redis.zrem(k.deadline_retention, "g:default:{t}a")            # lost entry of a retained group
    m.redis.zadd(k.deadline_retention, {"g:default:{t}b": T0 + 5})  # wrong score
    m.redis.zadd(k.deadline_retention, {"g:default:{t}ghost": T0 + HOUR})  # no record
    m.redis.hset(k.retained_tenants, "default", 7)
    m.redis.hset(k.retained_tenants, "nobody", 2)
    m.redis.hdel(k.retained_tenants, "other")
    m.redis.zrem(k.tier_retained, "g:default:{t}a")                 # the retained unit lost its tier
    report = fsck(m)
    kinds = report.kinds()
    assert kinds.get("retention_deadline") == 2 and kinds.get("retention_counts") == 3, report.summary()
    assert kinds.get("stray_unit") == 1 and kinds.get("unit_missing") == 1, report.summary()
    repaired = fsck(m, repair=True)
    assert not repaired.unrepaired, repaired.summary()
    after = fsck(m)
    assert after.ok, after.summary()
    assert m.describe_group("{t}a").tier == "retained"
    assert m.redis.hget(k.retained_tenants, "default") == b"3"
    assert m.redis.zscore(k.deadline_retention, "g:default:{t}b") == T0 + HOUR


def test_fsck_tolerates_a_due_retention_the_sweep_has_not_reached(master):
    m = master
    mount(m)
    member(m, "{t}a", "{t}a/1")
    m.retain_groups(["{t}a", "{t}b"], 1_000)
    m.advance_clock(5_000)
    assert fsck(m).ok  # the index lags the rule until the next sweep: not drift


# ---- persistence ---------------------------------------------------------------------------------

def test_retention_survives_a_valkey_restart_with_aof(tmp_path):
    server = EmbeddedValkey(data_dir=str(tmp_path), appendonly=True, extra_args=("--appendfsync", "always")).start()
    try:
        m = Master.connect(server.url, MasterConfig(shards=4, max_retained_groups=8))
        m.freeze_clock(T0)
        m.mount_segment("seg", 4 * CAP, OWNER)
        assert m.retain_groups(["{t}early"], HOUR) == [T0 + HOUR]
        member(m, "{t}g", "{t}g/1")
        m.retain_groups(["{t}g"], 2 * HOUR)
        m.close()
        server.stop()
        server.start()  # same port and data directory: the store comes back from the AOF
        m = Master.connect(server.url)
        assert retained_until(m, "{t}early") == T0 + HOUR
        info = m.describe_group("{t}g")
        assert (info.retained_until_ms, info.tier, info.members) == (T0 + 2 * HOUR, "retained", 1)
        assert sum(s.held for s in m.retention_usage()) == 2
        assert fsck(m).ok
        m.close()
    finally:
        server.stop()


# ---- invariants under random traffic -----------------------------------------------------------------

@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.slow)])  # more seeds: the full run
def test_random_traffic_keeps_limits_rule_and_records_consistent(new_master, seed):
    """Random retains (two tenants), member puts and removals, reads, evictions and clock moves;
    after every step: no shard holds more records than its shares allow, every active retention
    the API reports is the latest deadline retain_groups answered, and fsck finds nothing."""
    import random

    rnd = random.Random(seed)
    m = new_master(max_retained_groups=12, max_retained_groups_per_tenant=8)
    mount(m, per_shard=20 * OBJ)
    groups = [f"{{t}}g{i}" for i in range(8)] + [f"h{i}" for i in range(8)]  # half on one shard
    latest: dict[tuple[str, str], int] = {}
    n = 0
    outcomes: set = set()
    for _ in range(60):
        op = rnd.random()
        tenant = rnd.choice(["default", "b"])
        if op < 0.35:
            picked = rnd.sample(groups, 3)
            for g, got in zip(picked, m.retain_groups(picked, rnd.choice([500, 2_000, 9_000]), tenant_id=tenant)):
                outcomes.add(got if not admitted(got) else "admitted")
                if admitted(got):
                    assert got >= latest.get((tenant, g), 0) or got > m.now_ms()
                    latest[(tenant, g)] = got
        elif op < 0.6:
            g = rnd.choice(groups)
            n += 1
            try:
                member(m, g, (g if "{" in g else "{" + g + "}") + f"/m{n}", tenant=tenant)  # on g's shard
            except MasterError as exc:
                assert exc.code == ErrorCode.NO_AVAILABLE_HANDLE
        elif op < 0.7:
            g = rnd.choice(groups)
            for key in m.redis.smembers(shard_keys(m, shard_of_str(m, g)).group_members(tenant, g)):
                m.remove(key, force=True, tenant_id=tenant)
                break
        elif op < 0.85:
            m.advance_clock(rnd.choice([100, 700, 3_000]))
        else:
            m.run_eviction()
        now = m.now_ms()
        for s in m.retention_usage():
            assert s.held <= s.share
            k = shard_keys(m, s.shard)
            counts = {t: int(v) for t, v in m.redis.hgetall(k.retained_tenants).items()}
            assert all(v <= s.tenant_share for v in counts.values())
        for (tenant, g), deadline in latest.items():
            try:
                info = m.describe_group(g, tenant)
            except MasterError as exc:
                assert exc.code == ErrorCode.OBJECT_NOT_FOUND and deadline <= now
                continue
            assert info.retained_until_ms == (deadline if deadline > now else None)
        report = fsck(m)
        assert report.ok, report.summary()
    assert outcomes == {"admitted", ErrorCode.RETENTION_LIMIT_EXCEEDED}  # the run reached the limits
