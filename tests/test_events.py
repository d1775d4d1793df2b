"""KV events (kv_events_maxlen > 0): one stream entry per change to the stored objects, written
in the call that makes it; replayed from empty, the events give exactly the readable keys."""
from __future__ import annotations

import random

import pytest

from helpers import WRITER, mount, put, shard_keys
from mooncake_redis import ErrorCode, MasterError
from mooncake_redis.events import Position, live_keys, parse_names

pytestmark = pytest.mark.cluster  # these API tests run on the test cluster too (conftest)

DISK = "agent"


def kinds(events, key):
    return [e.event for e in events if e.key == key.encode()]


def test_events_are_off_by_default_and_cost_no_stream(new_master):
    m = new_master()
    mount(m, "seg", 1 << 20)
    put(m, "k", 100)
    m.remove("k")
    assert m.events() == []
    assert not any(m.redis.exists(k.events) for k in m.transport.keys)


def test_a_put_and_a_remove(new_master):
    m = new_master(kv_events_maxlen=1000)
    mount(m, "seg", 1 << 20)
    m.put_start(WRITER, "k", 100)
    assert m.events() == []  # a put in progress is nobody's cache yet
    m.put_end(WRITER, "k")
    (stored,) = m.events()
    assert (stored.event, stored.tenant, stored.key, stored.size, stored.memory, stored.disk) == \
        ("stored", "default", b"k", 100, ("seg",), ())
    assert stored.ts == m.now_ms()
    m.put_end(WRITER, "k")  # a retried put_end changes nothing: no event
    m.remove("k")
    assert kinds(m.events(), "k") == ["stored", "removed"]
    m.put_start(WRITER, "r", 10)
    m.put_revoke(WRITER, "r")  # nothing readable went
    assert kinds(m.events(), "r") == []


def test_an_upsert_removes_then_stores_again(new_master):
    m = new_master(kv_events_maxlen=1000)
    mount(m, "seg", 1 << 20)
    put(m, "same", 100)
    put(m, "other", 100)
    for key, size in (("same", 100), ("other", 200)):  # in place, and reallocated
        m.upsert_start(WRITER, key, size)
        assert kinds(m.events(), key) == ["stored", "removed"] and not m.exist_key(key)
        m.upsert_end(WRITER, key)
        assert kinds(m.events(), key) == ["stored", "removed", "stored"]
    assert [e.size for e in m.events() if e.key == b"other" and e.event == "stored"] == [100, 200]


def test_reading_from_a_position_returns_only_what_came_after(new_master):
    m = new_master(kv_events_maxlen=1000)
    mount(m, "seg", 1 << 20)
    put(m, "a", 10)
    position = Position()
    assert [e.key for e in m.events(position)] == [b"a"]
    assert m.events(position) == []
    put(m, "b", 10)
    assert [e.key for e in m.events(position)] == [b"b"]
    later = m.events_position_now()
    m.remove("a")
    assert [(e.event, e.key) for e in m.events(later)] == [("removed", b"a")]


def test_eviction_says_evicted(new_master):
    m = new_master(kv_events_maxlen=1000)
    mount(m, "seg", 300)
    for i in range(8 * m.shards):  # puts evict what their shard cannot hold
        m.freeze_clock(m.now_ms() + 20_000)  # the leases of the earlier ones are over
        put(m, f"k{i}", 100)
    evicted = [e for e in m.events() if e.event == "evicted"]
    assert evicted and all(not m.exist_key(e.key) for e in evicted)
    assert len(evicted) == 8 * m.shards - m.usage().objects


@pytest.mark.not_on_cluster("one shard: the second put must evict the first")
def test_offload_and_shed_memory_are_updates(new_master):
    m = new_master(shards=1, kv_events_maxlen=1000, offload_on_put=True)
    m.mount_segment("mem", 1000, DISK)
    m.mount_local_disk_segment(DISK)
    put(m, "k", 600)
    (task,) = m.offload_object_heartbeat(DISK)
    assert m.notify_offload_success(DISK, [task.key], ["/d/k"]) == [ErrorCode.OK]
    *_, update = m.events()
    assert (update.event, update.key, update.memory, update.disk) == ("updated", b"k", ("mem",), (DISK,))
    m.freeze_clock(m.now_ms() + 3_600_000)  # its lease long over
    put(m, "filler", 600)  # evicts k's memory replica: its disk replica keeps it readable
    shed = [e for e in m.events() if e.key == b"k"][-1]
    assert (shed.event, shed.memory, shed.disk) == ("updated", (), (DISK,))
    assert m.exist_key("k")


def test_names_with_spaces_and_colons_survive():
    assert parse_names(b"#3:a b #4:c:d: #0:") == ("a b", "c:d:", "")  # the disk field's clients
    assert parse_names(b"") == ()


def test_count_is_checked(new_master):
    m = new_master(kv_events_maxlen=10)
    for bad in (0, -1, 10_001, 1.5, True):
        with pytest.raises(MasterError) as info:
            m.events(count=bad)
        assert info.value.code == ErrorCode.INVALID_PARAMS


def test_replayed_events_give_the_readable_keys_under_random_work(new_master):
    m = new_master(kv_events_maxlen=100_000, evict_on_put=True)
    rng = random.Random(7)
    mount(m, "seg0", 1500, client="c0")
    mounted = {"seg0": "c0"}
    keys = [f"k{i}" for i in range(40)]
    events = []
    position = Position()
    for step in range(300):
        op = rng.random()
        key = rng.choice(keys)
        try:
            if op < 0.5:
                put(m, key, rng.choice((50, 100, 300)))
            elif op < 0.7:
                m.remove(key, force=True)
            elif op < 0.8:
                m.run_eviction()
            elif op < 0.9 and len(mounted) < 3:
                name = f"seg{step}"
                mount(m, name, 1000, client=f"c{step}")
                mounted[name] = f"c{step}"
            elif len(mounted) > 1:
                name = rng.choice(sorted(mounted))
                m.unmount_segment(name, mounted.pop(name))
            m.freeze_clock(m.now_ms() + rng.choice((0, 1000, 20_000)))
        except MasterError:
            pass  # no space, not found, leased: refusals change nothing
        events += m.events(position)
        readable = {("default", k.encode()) for k in keys if m.exist_key(k)}
        assert live_keys(events) == readable, step
    assert not position.lost


@pytest.mark.not_on_cluster("one shard's stream, trimmed")
def test_a_bounded_stream_is_trimmed_and_a_reader_that_fell_behind_is_told(new_master):
    m = new_master(shards=1, kv_events_maxlen=10)
    mount(m, "seg", 1 << 20)
    position = Position()
    put(m, "first", 10)
    assert [e.id for e in m.events(position)] == ["0-1"] and not position.lost
    for i in range(400):
        put(m, f"k{i}", 10)
    assert m.redis.xlen(shard_keys(m, 0).events) < 400  # trimmed (MAXLEN ~: by whole nodes of the stream)
    got = m.events(position, count=1000)
    assert position.lost == {0: True}
    assert got[-1].id == "0-401" and got[-1].key == b"k399"
