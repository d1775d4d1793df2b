"""Eviction: Mooncake's eviction scenarios ported to byte targets on a frozen store clock.

Semantics under test (DESIGN.md "Eviction, the heart of it", lua/lib/40_evict.lua, lua/ops/evict.lua):
a shard starts evicting when used > eviction_high_watermark_ratio (0.90) x capacity and frees units
until used <= (0.90 - eviction_ratio 0.05) = 0.85 x capacity. Ordinary units go first, then (only if
allow_evict_soft_pinned_objects) soft-pinned ones; inside a tier the lowest lease_until goes first.
Never evicted: a unit that is in progress, hard-pinned or leased (lease_until > now).

Each shard evicts its own bytes, so the scenario tests route every key through one hash tag
("{t}/...", "{g}/...") and mount a segment whose slice on every shard is CAP bytes: with shards=1
and shards=4 the tagged keys share one shard and the exact cross-object order is the same.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from mooncake_redis import ErrorCode, Master, MasterError, ReplicateConfig, SoftPinAction
from mooncake_redis.keys import object_key, shard_of

from helpers import T0, WATERMARKS, examples, shard_keys

MASTER_CONFIG = WATERMARKS  # new_master's defaults in this module (conftest)

pytestmark = pytest.mark.cluster  # these API tests run on the test cluster too (conftest)

OWNER = "owner"     # mounts the segment
W = "writer"        # writes the objects
OBJ = 1000          # bytes per object
CAP = 100_000       # bytes of segment per shard: 100 objects
HIGH = 90_000       # 0.90 x CAP: eviction starts above this
TARGET = 85_000     # 0.85 x CAP: eviction frees down to this
TTL = 10_000        # default_kv_lease_ttl
SOFT = ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE)
HARD = ReplicateConfig(with_hard_pin=True)


# ---- helpers -----------------------------------------------------------------------------------

@contextlib.contextmanager
def raises_code(code: ErrorCode) -> Iterator[None]:
    with pytest.raises(MasterError) as info:
        yield
    assert info.value.code == code, f"expected {code.name}, got {info.value.code.name}: {info.value}"


def mount(m: Master, per_shard: int = CAP, name: str = "seg") -> None:
    """One segment whose slice on every shard is `per_shard` bytes."""
    m.mount_segment(name, per_shard * m.shards, OWNER)


def shard(m: Master, key: str) -> int:
    return shard_of(key.encode(), m.shards)


def put(m: Master, key: str, size: int = OBJ, config: ReplicateConfig | None = None) -> None:
    m.put_start(W, key, size, config)
    m.put_end(W, key)


def alive(m: Master, key: str) -> bool:
    """Whether the object exists; describe is an inspection and grants no lease."""
    try:
        m.describe(key)
        return True
    except MasterError as exc:
        assert exc.code == ErrorCode.OBJECT_NOT_FOUND
        return False


def gone(m: Master, keys: list[str]) -> list[str]:
    return [k for k in keys if not alive(m, k)]


def used(m: Master, key: str) -> int:
    """Used bytes of the shard `key` routes to."""
    return m.usage().shards[shard(m, key)].used_bytes


def tiers(m: Master, sh: int) -> dict[str, dict[str, float]]:
    out = {}
    for name, key in zip(("ordinary", "soft"), shard_keys(m, sh).tiers):
        rows = m.redis.zrange(key, 0, -1, withscores=True)
        out[name] = {u.decode(): s for u, s in rows}
    return out


def tier_of(m: Master, key: str, unit: str | None = None) -> str | None:
    unit = unit or f"o:default:{key}"
    found = [name for name, members in tiers(m, shard(m, key)).items() if unit in members]
    assert len(found) <= 1, f"{unit} sits in several tiers: {found}"
    return found[0] if found else None


def evict_one(m: Master, key_on_shard: str):
    """One mc_evict step limited to one unit on the shard of `key_on_shard`."""
    return m.evict_step(shard(m, key_on_shard), max_units=1)


def fill(m: Master, keys: list[str], config: ReplicateConfig | None = None, read: bool = True,
         gap_ms: int = 1) -> None:
    """Put (and read, i.e. lease) each key at its own, increasing time."""
    for k in keys:
        put(m, k, config=config)
        if read:
            m.get_replica_list(k)
        m.advance_clock(gap_ms)


def step_order(m: Master, candidates: list[str], steps: int) -> list[str]:
    """Run `steps` one-unit eviction steps; returns the evicted keys, in eviction order."""
    order = []
    left = list(candidates)
    for _ in range(steps):
        step = evict_one(m, candidates[0])
        assert step.units == 1, step
        went = gone(m, left)
        assert len(went) == step.objects, (went, step)
        order += went
        left = [k for k in left if k not in went]
    return order


# ---- trigger, target, exact order ----------------------------------------------------------------

def test_trigger_target_and_exact_oldest_first_order(master):
    m = master
    mount(m)
    keys = [f"{{t}}/k{i:02d}" for i in range(95)]
    sh = shard(m, keys[0])
    fill(m, keys[:90])
    m.advance_clock(TTL + 100)  # every lease over
    # exactly at the watermark (90 000 of 100 000): nothing to do
    report = m.run_eviction()
    assert report.evicted_units == 0 and report.final[sh].state == "idle"
    assert used(m, keys[0]) == HIGH

    fill(m, keys[90:])
    assert used(m, keys[0]) == 95_000
    m.advance_clock(TTL + 100)  # over the watermark, every lease over
    # reads renew the lease to now + ttl: k00..k04 become the most recently leased
    for k in keys[:5]:
        assert m.get_replica_list(k).lease_ttl_ms == TTL
        assert m.describe(k).lease_until_ms == m.now_ms() + TTL
    m.advance_clock(TTL + 100)
    assert tiers(m, sh)["ordinary"][f"o:default:{keys[0]}"] > tiers(m, sh)["ordinary"][f"o:default:{keys[94]}"]

    # one unit per step: the exact order is the lease order k05, k06, ... (k00..k04 were renewed)
    order = step_order(m, keys, 3)
    assert order == keys[5:8]
    report = m.run_eviction()
    assert report.evicted_units == 7 and report.evicted_bytes == 7 * OBJ
    assert report.final[sh].state == "target"
    assert report.final[sh].used_bytes == TARGET == report.final[sh].target_bytes
    assert gone(m, keys) == keys[5:15]
    assert used(m, keys[0]) == TARGET
    # at the target: idle again
    assert m.run_eviction().evicted_units == 0


def test_run_eviction_reaches_the_target_when_it_takes_several_steps(master):
    """Once started (used > 0.90 x capacity), eviction frees down to 0.85 x capacity even when one
    step's max_units is not enough: run_eviction promises "until every shard is at its target"."""
    m = master
    mount(m)
    keys = [f"{{t}}/k{i:02d}" for i in range(95)]
    sh = shard(m, keys[0])
    fill(m, keys, read=False)
    m.advance_clock(1)
    report = m.run_eviction(max_units_per_step=4)
    assert gone(m, keys) == keys[:10]
    assert used(m, keys[0]) == TARGET
    assert report.final[sh].state == "target"


def test_leased_objects_block_eviction_until_their_lease_ends(master):
    m = master
    mount(m)
    keys = [f"{{t}}/k{i:02d}" for i in range(95)]
    sh = shard(m, keys[0])
    fill(m, keys)  # each leased until its put time + ttl
    report = m.run_eviction()
    assert report.evicted_units == 0 and report.final[sh].state == "blocked"
    assert gone(m, keys) == []
    # the leases of k00..k12 have ended: eviction takes exactly the 10 oldest of them
    m.advance_clock(TTL - 95 + 12)
    report = m.run_eviction()
    assert report.final[sh].state == "target"
    assert gone(m, keys) == keys[:10]


# ---- soft pins -----------------------------------------------------------------------------------

def test_soft_pinned_units_go_only_after_ordinary_ones_in_lease_order(master):
    m = master
    mount(m)
    soft = [f"{{t}}/s{i:02d}" for i in range(90)]
    ordinary = [f"{{t}}/o{i}" for i in range(5)]
    sh = shard(m, soft[0])
    fill(m, soft, SOFT)      # older
    fill(m, ordinary)        # newer, but ordinary
    m.advance_clock(TTL + 100)
    assert all(tier_of(m, k) == "soft" for k in soft)
    assert all(tier_of(m, k) == "ordinary" for k in ordinary)
    # ordinary first (despite being the most recently leased), then soft in lease order
    assert step_order(m, soft + ordinary, 7) == ordinary + soft[:2]
    report = m.run_eviction()
    assert report.final[sh].state == "target"
    assert gone(m, soft + ordinary) == soft[:5] + ordinary


def test_soft_pinned_units_are_never_evicted_when_not_allowed(new_master):
    m = new_master(allow_evict_soft_pinned_objects=False)
    mount(m)
    soft = [f"{{t}}/s{i:02d}" for i in range(90)]
    ordinary = [f"{{t}}/o{i}" for i in range(5)]
    sh = shard(m, soft[0])
    fill(m, soft, SOFT)
    fill(m, ordinary)
    m.advance_clock(TTL + 100)
    report = m.run_eviction()
    assert report.final[sh].state == "blocked"
    assert report.evicted_units == 5
    assert gone(m, soft + ordinary) == ordinary
    assert used(m, soft[0]) == HIGH
    # still blocked on the next run, nothing else goes
    report = m.run_eviction()
    assert report.evicted_units == 0
    # evict-on-put may not take soft-pinned units either: fill up, then a put fails
    fill(m, [f"{{t}}/x{i}" for i in range(10)])  # leased
    assert used(m, soft[0]) == CAP
    with raises_code(ErrorCode.NO_AVAILABLE_HANDLE):
        m.put_start(W, "{t}/late", OBJ)
    assert gone(m, soft) == []


def test_expired_soft_pin_makes_the_unit_ordinary_again(new_master):
    m = new_master(allow_evict_soft_pinned_objects=False)
    mount(m)
    pin = ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=60_000)
    keys = [f"{{t}}/s{i:02d}" for i in range(95)]
    sh = shard(m, keys[0])
    fill(m, keys, pin)
    pinned_until = m.describe(keys[0]).soft_pin_until_ms
    assert pinned_until == T0 + 60_000  # committed by put_end at T0
    m.advance_clock(TTL + 100)  # leases over, soft pins still on
    report = m.run_eviction()
    assert report.evicted_units == 0 and report.final[sh].state == "blocked"
    assert tier_of(m, keys[0]) == "soft"
    # past the soft pin of s00..s19: they are ordinary units now and go, oldest first
    m.advance_clock(pinned_until + 19 - m.now_ms())
    report = m.run_eviction()
    assert report.final[sh].state == "target"
    assert gone(m, keys) == keys[:10]
    assert all(tier_of(m, k) == "ordinary" for k in keys[10:20])
    assert all(tier_of(m, k) == "soft" for k in keys[20:])


def test_expired_soft_pin_competes_with_ordinary_units_by_lease(master):
    m = master
    mount(m)
    pin = ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=60_000)
    soft = [f"{{t}}/s{i}" for i in range(10)]
    ordinary = [f"{{t}}/o{i:02d}" for i in range(85)]
    fill(m, soft, pin)
    fill(m, ordinary)
    m.advance_clock(60_000 + TTL)
    # the soft pins are over and they were leased longest ago: they go before any ordinary unit
    report = m.run_eviction()
    assert report.evicted_units == 10
    assert gone(m, soft + ordinary) == soft


# ---- groups --------------------------------------------------------------------------------------

def _group_setup(m: Master) -> tuple[list[str], list[str]]:
    mount(m)
    members = [f"{{g}}/{i}" for i in range(5)]
    g = ReplicateConfig(group_id="g")
    for k in members:
        put(m, k, config=g)
    m.get_replica_list(members[0])  # leases the whole group until now + ttl
    m.advance_clock(1)
    others = [f"{{g}}/a{i:02d}" for i in range(90)]
    fill(m, others)
    m.advance_clock(TTL + 100)
    return members, others


def test_a_group_is_evicted_as_one_unit(master):
    m = master
    members, others = _group_setup(m)
    sh = shard(m, members[0])
    assert shard(m, "g") == sh
    assert tier_of(m, members[0], "g:default:g") == "ordinary"
    assert all(tier_of(m, k) is None for k in members)  # members are not units of their own
    report = m.run_eviction()
    # the group (5 objects, the least recently leased unit) is one unit, then 5 single objects
    assert (report.evicted_units, report.evicted_objects, report.evicted_bytes) == (6, 10, 10 * OBJ)
    assert report.final[sh].state == "target"
    assert gone(m, members + others) == members + others[:5]
    assert tier_of(m, members[0], "g:default:g") is None
    assert not m.redis.exists(shard_keys(m, sh).group_members("default", "g"))
    assert not m.redis.exists(shard_keys(m, sh).group("default", "g"))


def test_a_leased_member_keeps_its_group_and_the_next_candidate_goes(master):
    m = master
    members, others = _group_setup(m)
    m.get_replica_list(members[3])  # one member read: the whole group is leased
    for k in members:
        assert m.describe(k).lease_until_ms == m.now_ms() + TTL
    report = m.run_eviction()
    assert report.evicted_units == 10
    assert gone(m, members + others) == others[:10]


def test_a_group_with_a_hard_pinned_or_unfinished_member_is_protected(master):
    m = master
    mount(m)
    g1, g2 = ReplicateConfig(group_id="{t}g1"), ReplicateConfig(group_id="{t}g2")
    pinned = ReplicateConfig(group_id="{t}g1", with_hard_pin=True)
    hp = ["{t}/h0", "{t}/h1"]
    put(m, hp[0], config=g1)
    put(m, hp[1], config=pinned)
    wip = ["{t}/w0", "{t}/w1"]
    put(m, wip[0], config=g2)
    m.put_start(W, wip[1], OBJ, g2)  # never ended
    others = [f"{{t}}/a{i:02d}" for i in range(91)]
    fill(m, others)
    m.advance_clock(TTL + 100)
    sh = shard(m, hp[0])
    assert tier_of(m, hp[0], "g:default:{t}g1") is None
    assert tier_of(m, wip[0], "g:default:{t}g2") is None
    report = m.run_eviction()
    assert report.evicted_units == 10 and report.final[sh].state == "target"
    assert gone(m, hp + wip + others) == others[:10]
    # with every other unit gone (or leased) the two groups still stay
    for k in others[10:]:
        m.remove(k)
    fill(m, [f"{{t}}/b{i:02d}" for i in range(92)])
    report = m.run_eviction()
    assert report.evicted_units == 0 and report.final[sh].state == "blocked"
    assert gone(m, hp + wip) == []


def test_a_group_with_a_soft_pinned_member_is_a_soft_unit(master):
    m = master
    mount(m)
    members = ["{g}/0", "{g}/1"]
    put(m, members[0], config=ReplicateConfig(group_id="g", soft_pin_action=SoftPinAction.ENABLE))
    put(m, members[1], config=ReplicateConfig(group_id="g"))
    m.advance_clock(1)
    others = [f"{{g}}/a{i:02d}" for i in range(93)]
    fill(m, others, read=False)  # newer than the group
    m.advance_clock(1)
    assert tier_of(m, members[0], "g:default:g") == "soft"
    report = m.run_eviction()
    assert report.evicted_units == 10
    assert gone(m, members + others) == others[:10]


def test_an_unread_group_is_ordered_by_its_completion_like_an_object(master):
    """Oldest-first across unit kinds: put_end counts as a touch at `now` for an object
    (lease_until = now, Mooncake's GrantLease(0) at PutEnd). A group completed later than an
    object, neither read, must therefore be evicted after it."""
    m = master
    mount(m)
    old = "{g}/old"
    put(m, old)                          # completed at T0, never read
    m.advance_clock(1000)
    members = [f"{{g}}/{i}" for i in range(3)]
    for k in members:                    # completed at T0 + 1000, never read
        put(m, k, config=ReplicateConfig(group_id="g"))
    m.advance_clock(1000)
    fill(m, [f"{{g}}/a{i:02d}" for i in range(91)], read=False)   # 95 000 bytes used
    m.advance_clock(1)
    step = evict_one(m, old)
    assert step.units == 1
    assert not alive(m, old), "the object completed first should be evicted first"
    assert gone(m, members) == []


# ---- protections ---------------------------------------------------------------------------------

def test_leased_hard_pinned_and_in_progress_objects_survive_any_pressure(master):
    m = master
    mount(m)
    leased = [f"{{t}}/l{i:02d}" for i in range(30)]
    hard = [f"{{t}}/h{i:02d}" for i in range(30)]
    wip = [f"{{t}}/w{i:02d}" for i in range(30)]
    plain = [f"{{t}}/p{i}" for i in range(5)]
    sh = shard(m, plain[0])
    fill(m, plain, read=False)
    fill(m, hard, HARD, read=False)
    for k in wip:
        m.put_start(W, k, OBJ)
    fill(m, leased)  # read: leased until now + ttl
    assert used(m, plain[0]) == 95_000
    report = m.run_eviction()
    assert report.final[sh].state == "blocked"
    assert gone(m, leased + hard + wip + plain) == plain
    # store 100% full of protected objects: evict-on-put finds nothing to take
    fill(m, [f"{{t}}/q{i}" for i in range(10)], HARD, read=False)
    assert used(m, plain[0]) == CAP
    with raises_code(ErrorCode.NO_AVAILABLE_HANDLE):
        m.put_start(W, "{t}/new", OBJ)
    assert m.run_eviction().final[sh].state == "blocked"
    # an hour later the leases are over (the leased go), hard pins and unfinished puts never
    m.advance_clock(3_600_000)
    report = m.run_eviction()
    assert report.final[sh].state == "target"
    assert set(gone(m, leased + hard + wip)) == set(leased[:15])
    m.remove_all()  # removes what remove may (leased none now; in-progress never)
    assert set(gone(m, hard + wip)) == set(hard)
    assert used(m, plain[0]) == 30 * OBJ


# ---- evict-on-put --------------------------------------------------------------------------------

def test_evict_on_put_lets_a_put_succeed_in_a_full_store(master):
    m = master
    mount(m)
    keys = [f"{{t}}/k{i:03d}" for i in range(100)]
    fill(m, keys, read=False)
    assert used(m, keys[0]) == CAP
    put(m, "{t}/new1")                    # evicts the oldest one, takes its place
    assert gone(m, keys) == keys[:1]
    put(m, "{t}/new2", size=3 * OBJ)      # needs three adjacent extents: the next three oldest
    assert gone(m, keys) == keys[:4]
    assert used(m, keys[0]) == CAP
    assert alive(m, "{t}/new1") and alive(m, "{t}/new2")


def test_evict_on_put_makes_room_for_every_key_of_a_batch(master):
    """Each key of a batch that finds no space evicts what it needs (not 16 units for the whole
    call): a full store takes a batch of 32 new objects with no worker running."""
    m = master
    mount(m)
    keys = [f"{{t}}/k{i:03d}" for i in range(100)]
    fill(m, keys, read=False)
    assert used(m, keys[0]) == CAP
    new = [f"{{t}}/new{i:02d}" for i in range(32)]
    out = m.batch_put_start(W, new, [OBJ] * len(new))
    assert all(isinstance(r, list) for r in out), out
    assert gone(m, keys) == keys[:32]  # the 32 least recently used, oldest first


@pytest.mark.parametrize("protection", ["leased", "hard_pinned", "in_progress", "soft_not_allowed"])
def test_evict_on_put_fails_when_everything_is_protected(new_master, protection):
    m = new_master(allow_evict_soft_pinned_objects=protection != "soft_not_allowed")
    mount(m)
    keys = [f"{{t}}/k{i:03d}" for i in range(100)]
    for k in keys:
        if protection == "in_progress":
            m.put_start(W, k, OBJ)
        else:
            put(m, k, config={"hard_pinned": HARD, "soft_not_allowed": SOFT}.get(protection))
            if protection == "leased":
                m.get_replica_list(k)
    if protection != "leased":
        m.advance_clock(TTL + 1)
    with raises_code(ErrorCode.NO_AVAILABLE_HANDLE):
        m.put_start(W, "{t}/new", OBJ)
    assert gone(m, keys) == []
    assert used(m, keys[0]) == CAP
    assert not alive(m, "{t}/new")


def test_without_evict_on_put_a_failed_put_starts_eviction_below_the_watermark(new_master):
    m = new_master(evict_on_put=False)
    mount(m)
    keys = [f"{{t}}/k{i:02d}" for i in range(80)]
    sh = shard(m, keys[0])
    fill(m, keys, read=False)
    P = shard_keys(m, sh).P
    assert m.run_eviction().final[sh].state == "idle"  # 80 000 < 90 000
    with raises_code(ErrorCode.NO_AVAILABLE_HANDLE):
        m.put_start(W, "{t}/big", 30 * OBJ)            # 20 000 free: does not fit
    assert gone(m, keys) == []                          # nothing was evicted by the put
    assert m.redis.hget(P, "put_failed") is not None
    report = m.run_eviction()
    assert report.evicted_units >= 1
    assert gone(m, keys) == keys[:report.evicted_units]
    assert m.redis.hget(P, "put_failed") is None
    assert m.run_eviction().evicted_units == 0           # the flag is consumed
    # and in a full store a same-sized put fails too, without evicting
    fill(m, [f"{{t}}/x{i:02d}" for i in range(100 - 80 + report.evicted_units)], read=False)
    assert used(m, keys[0]) == CAP
    with raises_code(ErrorCode.NO_AVAILABLE_HANDLE):
        m.put_start(W, "{t}/one", OBJ)
    assert gone(m, keys) == keys[:report.evicted_units]


# ---- shards --------------------------------------------------------------------------------------

def test_each_shard_evicts_its_own_bytes(master):
    m = master
    if m.shards == 1:
        pytest.skip("needs several shards")
    tags = {}
    i = 0
    while len(tags) < 2:  # two tags on two different shards
        tag = f"x{i}"
        tags.setdefault(shard(m, tag), tag)
        i += 1
    (sa, ta), (sb, tb) = sorted(tags.items())
    mount(m)
    hot = [f"{{{ta}}}/k{i:02d}" for i in range(95)]   # over the watermark of shard sa
    cool = [f"{{{tb}}}/k{i:02d}" for i in range(89)]  # under it on shard sb
    fill(m, cool, read=False)                          # older than every hot object
    fill(m, hot, read=False)
    m.advance_clock(1)
    report = m.run_eviction()
    states = {s.shard: s.state for s in report.final}
    assert states[sa] == "target"
    assert all(state == "idle" for s, state in states.items() if s != sa)
    assert gone(m, hot) == hot[:10]
    assert gone(m, cool) == []
    u = m.usage().shards
    assert (u[sa].used_bytes, u[sb].used_bytes) == (TARGET, 89_000)


# ---- invariants under random sequences -----------------------------------------------------------

PLAIN_KEYS = [(f"k{i}", None) for i in range(8)]
GROUP_KEYS = [(f"{{{g}}}/m{i}", g) for g in ("ga", "gb") for i in range(3)]
ALL_KEYS = PLAIN_KEYS + GROUP_KEYS
INV_TTL_SOFT = 20_000     # soft pin ttl used by the random puts
SEG = 5_000               # per-shard slice of each of the two segments

_put = st.tuples(st.just("put"), st.sampled_from(ALL_KEYS), st.sampled_from([1000, 2000, 3000]),
                 st.sampled_from([1, 1, 2]), st.sampled_from(["none", "none", "none", "soft", "soft", "hard"]),
                 st.sampled_from([True] * 5 + [False]))  # put_end right away (else: left in progress)
op_strategy = st.one_of(
    _put, _put, _put,
    st.tuples(st.just("end"), st.sampled_from(ALL_KEYS)),
    st.tuples(st.just("read"), st.sampled_from(ALL_KEYS)),
    st.tuples(st.just("remove"), st.sampled_from(ALL_KEYS)),
    st.tuples(st.just("revoke"), st.sampled_from(ALL_KEYS)),
    st.tuples(st.just("advance"), st.sampled_from([1, 1000, 5000, TTL + 1, INV_TTL_SOFT + 1, 3_600_000])),
    st.tuples(st.just("evict")), st.tuples(st.just("evict")),
)


class Model:
    """What the store should hold: objects, their protections, and the groups' shared state."""

    def __init__(self, m: Master, allow_soft: bool):
        self.m, self.allow_soft, self.now = m, allow_soft, m.now_ms()
        self.objs: dict[str, dict[str, Any]] = {}
        self.groups: dict[str, dict[str, int]] = {}   # group -> {lease, soft}

    def group(self, g: str) -> dict[str, int]:
        return self.groups.setdefault(g, {"lease": 0})

    def members(self, g: str) -> list[str]:
        return [k for k, o in self.objs.items() if o["group"] == g]

    def unit_of(self, key: str) -> str:
        g = self.objs[key]["group"]
        return f"g:default:{g}" if g else f"o:default:{key}"

    def units(self) -> dict[str, dict[str, Any]]:
        """unit id -> {keys, shard, placed (complete, not hard-pinned), lease, soft, evictable}."""
        out: dict[str, dict[str, Any]] = {}
        for k, o in self.objs.items():
            u = self.unit_of(k)
            e = out.setdefault(u, {"keys": [], "shard": o["shard"], "grouped": bool(o["group"])})
            e["keys"].append(k)
        for u, e in out.items():
            objs = [self.objs[k] for k in e["keys"]]
            e["placed"] = all(o["status"] == "complete" and not o["hard"] for o in objs)
            if e["grouped"]:
                # a group's soft pin is its latest complete member's: it drops when that member leaves
                g = self.group(objs[0]["group"])
                e["lease"] = g["lease"]
                e["soft"] = max((o["soft"] for o in objs if o["status"] == "complete"), default=0)
            else:
                e["lease"], e["soft"] = objs[0]["lease"], objs[0]["soft"]
            e["soft_tier"] = e["soft"] > self.now
            e["evictable"] = e["placed"] and e["lease"] <= self.now and (self.allow_soft or not e["soft_tier"])
        return out

    def effective_lease(self, key: str) -> int:
        o = self.objs[key]
        return max(o["lease"], self.group(o["group"])["lease"]) if o["group"] else o["lease"]

    def drop(self, key: str) -> None:
        g = self.objs.pop(key)["group"]
        if g and not self.members(g):
            self.groups.pop(g, None)  # the last member gone: the group's record is retired


def _exists(m: Master, keys: list[str]) -> dict[str, bool]:
    pipe = m.redis.pipeline(transaction=False)
    for k in keys:
        b = k.encode()
        pipe.exists(object_key(m.ns, shard_of(b, m.shards), "default", b))
    return dict(zip(keys, (bool(x) for x in pipe.execute())))


def _check_evictions(model: Model, before: dict[str, dict[str, Any]], vanished: set[str], op: str,
                     may_evict: bool, final_states: dict[int, str] | None) -> None:
    assert may_evict or not vanished, f"{op} made objects vanish: {sorted(vanished)}"
    evicted_units = set()
    for k in vanished:
        u = model.unit_of(k)
        evicted_units.add(u)
    for u in evicted_units:
        e = before[u]
        assert e["evictable"], f"{op} evicted protected unit {u}: {e}"
        assert set(e["keys"]) <= vanished, f"{op} evicted part of unit {u}: {e['keys']} vs {sorted(vanished)}"
    survivors = {u: e for u, e in before.items() if u not in evicted_units and e["evictable"]}
    for u in evicted_units:
        e = before[u]
        same_shard = [s for s in survivors.values() if s["shard"] == e["shard"]]
        if e["soft_tier"]:
            assert not [s for s in same_shard if not s["soft_tier"]], \
                f"{op} evicted soft-pinned {u} while an ordinary unit was evictable"
        if not e["grouped"]:
            older = [s for s in same_shard if not s["grouped"] and s["soft_tier"] == e["soft_tier"]
                     and s["lease"] < e["lease"]]
            assert not older, f"{op} evicted {u} (lease {e['lease']}) before older {older}"
    if final_states is not None:
        for sh, state in final_states.items():
            if state == "blocked":
                left = [u for u, e in survivors.items() if e["shard"] == sh]
                assert not left, f"eviction blocked on shard {sh} with evictable units {left}"


def _check_state(m: Master, model: Model) -> None:
    # bytes: the store's counters, the objects as described, the model
    usage = m.usage()
    described = [0] * m.shards
    for k, o in model.objs.items():
        info = m.describe(k)
        assert info.size == o["size"] and len(info.replicas) == o["reps"], (k, info, o)
        assert info.hard_pinned == o["hard"] and info.group_id == o["group"]
        described[o["shard"]] += info.size * len(info.replicas)
    assert [s.used_bytes for s in usage.shards] == described
    assert usage.used_bytes == sum(described)
    assert usage.objects == len(model.objs)
    # candidate tiers: every placed unit in exactly one tier, nothing else in any
    units = model.units()
    for sh in range(m.shards):
        t = tiers(m, sh)
        P = shard_keys(m, sh)
        deadlines = {u.decode(): s for u, s in m.redis.zrange(P.deadline_soft_pin, 0, -1, withscores=True)}
        mine = {u: e for u, e in units.items() if e["shard"] == sh}
        for u, e in mine.items():
            where = [name for name in ("ordinary", "soft") if u in t[name]]
            if not e["placed"]:
                assert where == [], f"protected unit {u} is a candidate in {where}"
                continue
            assert len(where) == 1, f"unit {u} in tiers {where}: {e}"
            if e["soft_tier"]:
                assert where == ["soft"], f"soft-pinned {u} is in the ordinary tier"
            if where == ["soft"]:
                assert e["soft"] > 0 and deadlines.get(u) == e["soft"], (u, e, deadlines.get(u))
            score = t[where[0]][u]
            if e["grouped"]:
                g = u.split(":", 2)[2]
                stored = int(m.redis.hget(P.group("default", g), "lease_until") or 0)
                assert score == stored and score >= e["lease"], (u, score, stored, e)
            else:
                assert score == e["lease"], (u, score, e)
        strays = (set(t["ordinary"]) | set(t["soft"]) | set(deadlines)) - set(mine)
        assert not strays, f"units of no live object in the indexes: {strays}"


def _put_end(m: Master, model: Model, key: str) -> None:
    o = model.objs.get(key)
    code = m.batch_put_end(W, [key])[0]
    if o is None:
        assert code == ErrorCode.OBJECT_NOT_FOUND
        return
    assert code == ErrorCode.OK
    if o["status"] == "processing":
        o["status"], o["lease"] = "complete", max(o["lease"], model.now)
        o["soft"] = model.now + INV_TTL_SOFT if o["pin"] == "soft" else 0


@pytest.mark.not_on_cluster("25 random runs over 16 shards take ~25 s there; the same functions run "
                            "on every other backend")
@settings(max_examples=examples(25), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op_strategy, min_size=20, max_size=60), allow_soft=st.booleans(),
       evict_on_put=st.booleans())
def test_eviction_invariants_under_random_operations(new_master, ops, allow_soft, evict_on_put):
    m = new_master(allow_evict_soft_pinned_objects=allow_soft, evict_on_put=evict_on_put)
    m.mount_segment("s0", SEG * m.shards, OWNER)
    m.mount_segment("s1", SEG * m.shards, OWNER)
    model = Model(m, allow_soft)
    for op in ops:
        kind = op[0]
        before = model.units()
        final_states = None
        if kind == "put":
            _, (key, group), size, reps, pin, end = op
            if key in model.objs:
                continue  # never a second put of a live key (preempting an abandoned put holds bytes)
            cfg = ReplicateConfig(replica_num=reps, group_id=group,
                                  with_hard_pin=pin == "hard",
                                  soft_pin_action=SoftPinAction.ENABLE if pin == "soft" else SoftPinAction.PRESERVE,
                                  soft_pin_ttl_ms=INV_TTL_SOFT if pin == "soft" else None)
            result = m.batch_put_start(W, [key], [size], cfg)[0]
        elif kind == "evict":
            report = m.run_eviction()
            final_states = {s.shard: s.state for s in report.final}
        elif kind == "advance":
            model.now = m.advance_clock(op[1])
        else:
            key = op[1][0]
            o = model.objs.get(key)
            if kind == "end":
                _put_end(m, model, key)
            elif kind == "read":
                r = m.batch_get_replica_list([key])[0]
                if o is None:
                    assert r == ErrorCode.OBJECT_NOT_FOUND
                elif o["status"] != "complete":
                    assert r == ErrorCode.REPLICA_IS_NOT_READY
                else:
                    assert not isinstance(r, ErrorCode), r
                    until = model.now + TTL
                    holder = model.group(o["group"]) if o["group"] else o
                    holder["lease"] = max(holder["lease"], until)
                    assert r.lease_ttl_ms == model.effective_lease(key) - model.now
            elif kind == "remove":
                code = m._remove([key.encode()], False, "default")[0]
                if o is None:
                    assert code == ErrorCode.OBJECT_NOT_FOUND
                elif o["status"] != "complete":
                    assert code == ErrorCode.REPLICA_IS_NOT_READY
                elif model.effective_lease(key) > model.now:
                    assert code == ErrorCode.OBJECT_HAS_LEASE
                else:
                    assert code == ErrorCode.OK
                    model.drop(key)
            elif kind == "revoke":
                code = m.batch_put_revoke(W, [key])[0]
                if o is None:
                    assert code == ErrorCode.OBJECT_NOT_FOUND
                elif o["status"] == "complete":
                    assert code == ErrorCode.INVALID_WRITE
                else:
                    assert code == ErrorCode.OK
                    model.drop(key)
        # which objects vanished without being removed: evictions
        present = _exists(m, list(model.objs))
        vanished = {k for k, here in present.items() if not here}
        may_evict = kind == "evict" or (kind == "put" and evict_on_put)
        _check_evictions(model, before, vanished, str(op), may_evict, final_states)
        if vanished:
            event(f"{kind} evicted objects")
        for k in vanished:
            model.drop(k)
        if kind == "put":
            if isinstance(result, ErrorCode):
                assert result == ErrorCode.NO_AVAILABLE_HANDLE, result
                event("put failed: NO_AVAILABLE_HANDLE")
            else:
                assert 1 <= len(result) <= reps
                model.objs[key] = {"size": size, "reps": len(result), "status": "processing", "hard": pin == "hard",
                                   "pin": pin, "group": group, "lease": 0, "soft": 0,
                                   "shard": shard_of(key.encode(), m.shards)}
                if group:
                    model.group(group)
                if end:
                    _put_end(m, model, key)
        if final_states is not None:
            for sh, state in final_states.items():
                u = m.usage().shards[sh]
                assert state in ("idle", "target", "blocked"), state
                event(f"run_eviction final state {state}")
                if state == "target":
                    assert u.used_bytes <= int(u.capacity_bytes * 0.85)
                if state == "idle":
                    assert u.used_bytes <= u.capacity_bytes * 0.90
        _check_state(m, model)
