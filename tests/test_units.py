"""The evictability rule lives in Lua alone: mc_unit_state tells what a unit's index entries
should be and what they are; composite units (groups) take a member's deadline back when that
member leaves."""
from __future__ import annotations

from helpers import WRITER, mount, put, shard_keys
from mooncake_redis import ReplicateConfig, SoftPinAction

PIN = ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=60_000)


def state(m, key_or_unit: str, shard: int = 0):
    why, expected, actual, deadlines, *_ = m.redis.execute_command("FCALL_RO", "mc_unit_state", 1,
                                                               shard_keys(m, shard).P, key_or_unit)
    pairs = lambda flat: {flat[i].decode(): flat[i + 1].decode() for i in range(0, len(flat), 2)}  # noqa: E731
    return why.decode(), pairs(expected), pairs(actual), [d.decode() for d in deadlines]


def test_unit_state_of_objects_follows_the_rule(new_master):
    m = new_master(shards=1)
    mount(m, "seg", 1 << 16)
    m.put_start(WRITER, "busy", 10)
    put(m, "plain", 10)
    put(m, "pinned", 10, config=PIN)
    put(m, "hard", 10, config=ReplicateConfig(with_hard_pin=True))
    now = m.now_ms()
    assert state(m, "o:default:busy") == ("processing", {}, {}, [":deadline:soft_pin"])
    assert state(m, "o:default:hard")[:3] == ("hard_pin", {}, {})
    assert state(m, "o:default:plain")[:3] == ("", {":evict:ordinary": str(now)}, {":evict:ordinary": str(now)})
    why, expected, actual, _ = state(m, "o:default:pinned")
    assert why == "" and expected == actual == {":evict:soft": str(now), ":deadline:soft_pin": str(now + 60_000)}
    assert state(m, "o:default:nope")[0] == "missing"
    assert state(m, "not a unit")[0] == "missing"
    # once the pin has run out the rule says ordinary; the entries move at the next sweep
    m.advance_clock(60_000)
    why, expected, actual, _ = state(m, "o:default:pinned")
    assert expected == {":evict:ordinary": str(now)} and actual[":deadline:soft_pin"] == str(now + 60_000)
    m.evict_step(0)  # a step sweeps due deadlines first (the store is below its watermark: idle)
    assert state(m, "o:default:pinned")[2] == {":evict:ordinary": str(now)}


def test_a_group_soft_pin_drops_when_its_pinning_member_leaves(new_master):
    m = new_master(shards=1)
    mount(m, "seg", 1 << 16)
    put(m, "a", 10, config=ReplicateConfig(group_id="g", soft_pin_action=SoftPinAction.ENABLE,
                                           soft_pin_ttl_ms=60_000))
    put(m, "b", 10, config=ReplicateConfig(group_id="g"))
    why, expected, actual, _ = state(m, "g:default:g")
    assert why == "" and ":evict:soft" in expected and expected == actual
    assert state(m, "o:default:a")[0] == "grouped"
    m.remove("a", force=True)
    why, expected, actual, _ = state(m, "g:default:g")
    assert list(expected) == [":evict:ordinary"] and expected == actual  # the max was taken back
    m.remove("b", force=True)
    assert state(m, "g:default:g")[0] == "missing"
    assert not m.redis.exists(shard_keys(m, 0).aggregate("soft_pin", "g:default:g"))
