"""Soft pins (ENABLE / PRESERVE / DISABLE, committed at the first readable put_end) and hard pins."""
from __future__ import annotations

import pytest

from helpers import WRITER, mount, put, raises_code
from mooncake_redis import ErrorCode, ReplicateConfig, SoftPinAction

HOUR = 3600 * 1000


def soft(action: SoftPinAction, ttl: int | None = None, **kw) -> ReplicateConfig:
    return ReplicateConfig(soft_pin_action=action, soft_pin_ttl_ms=ttl, **kw)


@pytest.fixture
def m(master):
    mount(master, "seg", 1 << 16)
    return master


# ---- parameters ----------------------------------------------------------------------------

@pytest.mark.parametrize("action", [SoftPinAction.PRESERVE, SoftPinAction.DISABLE])
def test_ttl_without_enable_is_invalid_params(m, action):
    with raises_code(ErrorCode.INVALID_PARAMS):
        m.put_start(WRITER, "k", 10, soft(action, 60_000))
    assert m.usage().objects == 0 and m.usage().used_bytes == 0


def test_enable_ttl_is_bounded_by_max_kv_soft_pin_ttl(m):
    assert m.config.max_kv_soft_pin_ttl == 24 * HOUR  # the default
    with raises_code(ErrorCode.INVALID_PARAMS):
        m.put_start(WRITER, "k", 10, soft(SoftPinAction.ENABLE, 24 * HOUR + 1))
    assert m.usage().objects == 0
    put(m, "k", 10, config=soft(SoftPinAction.ENABLE, 24 * HOUR))  # the maximum itself is fine
    assert m.describe("k").soft_pin_until_ms == m.now_ms() + 24 * HOUR


def test_configured_max_soft_pin_ttl_is_enforced(new_master):
    m = new_master(max_kv_soft_pin_ttl=60_000, default_kv_soft_pin_ttl=60_000)
    mount(m, "seg", 1 << 16)
    with raises_code(ErrorCode.INVALID_PARAMS):
        m.put_start(WRITER, "k", 10, soft(SoftPinAction.ENABLE, 60_001))
    put(m, "k", 10, config=soft(SoftPinAction.ENABLE, 60_000))
    assert m.describe("k").soft_pin_until_ms == m.now_ms() + 60_000


# ---- the pin itself ------------------------------------------------------------------------

def test_enable_default_ttl_is_committed_at_put_end(m):
    assert m.config.default_kv_soft_pin_ttl == 30 * 60 * 1000
    m.put_start(WRITER, "k", 10, soft(SoftPinAction.ENABLE))
    assert m.describe("k").soft_pin_until_ms is None  # not readable yet: not pinned yet
    m.advance_clock(5_000)
    ended = m.now_ms()
    m.put_end(WRITER, "k")
    assert m.describe("k").soft_pin_until_ms == ended + 30 * 60 * 1000  # put_end time, not put_start


def test_enable_uses_configured_default_ttl(new_master):
    m = new_master(default_kv_soft_pin_ttl=12_345)
    mount(m, "seg", 1 << 16)
    put(m, "k", 10, config=soft(SoftPinAction.ENABLE))
    assert m.describe("k").soft_pin_until_ms == m.now_ms() + 12_345


def test_enable_with_explicit_ttl(m):
    m.put_start(WRITER, "k", 10, soft(SoftPinAction.ENABLE, 90_000))
    m.advance_clock(1_234)
    m.put_end(WRITER, "k")
    assert m.describe("k").soft_pin_until_ms == m.now_ms() + 90_000


def test_enable_with_ttl_zero_is_not_pinned(m):
    put(m, "k", 10, config=soft(SoftPinAction.ENABLE, 0))
    assert m.describe("k").soft_pin_until_ms is None


@pytest.mark.parametrize("action", [SoftPinAction.PRESERVE, SoftPinAction.DISABLE])
def test_preserve_and_disable_leave_a_new_object_unpinned(m, action):
    put(m, "k", 10, config=soft(action))
    assert m.describe("k").soft_pin_until_ms is None
    put(m, "default-config", 10)  # no config at all = PRESERVE
    assert m.describe("default-config").soft_pin_until_ms is None


def test_preempted_put_does_not_pass_its_pin_on(new_master):
    """PRESERVE keeps the object's pin; an object that replaces an abandoned put is a new object."""
    m = new_master(put_start_discard_timeout=1_000)
    mount(m, "seg", 1 << 16)
    m.put_start("c1", "k", 10, soft(SoftPinAction.ENABLE, 60_000))
    m.advance_clock(1_000)
    m.put_start("c2", "k", 10, soft(SoftPinAction.PRESERVE))
    m.put_end("c2", "k")
    assert m.describe("k").soft_pin_until_ms is None


def test_soft_pin_is_never_extended_by_reads_or_repeated_put_end(m):
    put(m, "k", 10, config=soft(SoftPinAction.ENABLE, 60_000))
    pinned_until = m.describe("k").soft_pin_until_ms
    assert pinned_until == m.now_ms() + 60_000
    for step in range(3):
        m.advance_clock(10_000)
        m.get_replica_list("k")
        m.exist_key("k")
        m.batch_get_replica_list(["k"])
        m.put_end(WRITER, "k")
        assert m.describe("k").soft_pin_until_ms == pinned_until, step


def test_hard_pin_is_fixed_at_creation(m):
    put(m, "pinned", 10, config=ReplicateConfig(with_hard_pin=True))
    put(m, "plain", 10)
    assert m.describe("pinned").hard_pinned is True
    assert m.describe("plain").hard_pinned is False
    m.advance_clock(48 * HOUR)
    m.get_replica_list("pinned")
    m.put_end(WRITER, "pinned")
    assert m.describe("pinned").hard_pinned is True  # no TTL, reads and put_end do not change it
    m.put_start(WRITER, "busy", 10, ReplicateConfig(with_hard_pin=True))
    assert m.describe("busy").hard_pinned is True  # set at put_start already


# ---- the fields an object keeps ------------------------------------------------------------

def test_an_object_keeps_only_the_pin_fields_it_uses(m):
    put(m, "plain", 10)
    put(m, "hard", 10, config=ReplicateConfig(with_hard_pin=True))
    put(m, "soft", 10, config=soft(SoftPinAction.ENABLE, HOUR))
    put(m, "off", 10, config=soft(SoftPinAction.DISABLE))
    fields = {k: m.describe(k).fields for k in ("plain", "hard", "soft", "off")}
    for k in ("plain", "off"):
        assert "hard_pin" not in fields[k] and "soft_pin_until" not in fields[k], fields[k]
    assert fields["hard"]["hard_pin"] == "1" and "soft_pin_until" not in fields["hard"]
    assert int(fields["soft"]["soft_pin_until"]) == m.now_ms() + HOUR and "hard_pin" not in fields["soft"]


def test_objects_with_the_zero_pin_fields_of_older_stores_behave_the_same(m):
    """Stores written before the default-valued fields were left out hold hard_pin 0 and
    soft_pin_until 0 on every object: they read, evict, audit and remove as unpinned."""
    from mooncake_redis.fsck import fsck
    from helpers import keys_of
    for k in ("old-done", "old-busy"):
        m.put_start(WRITER, k, 10)
        m.redis.hset(keys_of(m, k).object("default", k.encode()), mapping={"hard_pin": "0", "soft_pin_until": "0"})
    m.put_end(WRITER, "old-done")
    m.put_end(WRITER, "old-busy")
    for k in ("old-done", "old-busy"):
        info = m.describe(k)
        assert info.hard_pinned is False and info.soft_pin_until_ms is None
        assert info.fields["soft_pin_until"] == "0"  # put_end leaves the old field as it was
        assert m.exist_key(k)
        unit = f"o:default:{k}"
        why, expected, actual, _, _, mark, _ = m.redis.execute_command("FCALL_RO", "mc_unit_state", 1, keys_of(m, k).P,
                                                                    unit)
        assert mark == 0  # hard_pin 0 and soft_pin_until 0 need no read mark
        assert why == b"" and expected == actual and list(expected[::2]) == [b":evict:ordinary"], (k, expected)
    assert fsck(m).ok
    m.advance_clock(HOUR)
    for k in ("old-done", "old-busy"):
        m.remove(k)
    assert m.usage().objects == 0
