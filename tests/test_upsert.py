"""Upsert: insert, or replace an object's bytes in place when it is the same size and unleased,
else reallocate; readers never see a half-written object; pins, guarantees, groups, the radix
index and task references keep their rules."""
from __future__ import annotations

import hashlib

import pytest
from helpers import WRITER, examples, mount, present, put, raises_code, store_snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mooncake_redis import ErrorCode, ReplicateConfig
from mooncake_redis.config import SoftPinAction
from mooncake_redis.fsck import fsck
from mooncake_redis.worker import Worker

PER_SHARD = 1 << 16
OTHER = "other-writer"


def offsets(m, key) -> list[tuple[str, int]]:
    return [(r.segment, r.offset) for r in m.get_replica_list(key).replicas]


@pytest.fixture
def m(master):
    mount(master, "seg", PER_SHARD)
    return master


def test_an_absent_key_is_put(m):
    got = m.upsert_start(WRITER, "k", 100)
    assert len(got) == 1 and got[0].size == 100
    assert m.batch_get_replica_list(["k"]) == [ErrorCode.REPLICA_IS_NOT_READY]
    m.upsert_end(WRITER, "k")
    assert offsets(m, "k") == [(got[0].segment, got[0].offset)]
    assert fsck(m).ok


def test_the_same_size_unleased_is_rewritten_in_place_and_unreadable_meanwhile(m):
    put(m, "k", 100)
    before = m.describe("k").replicas
    got = m.upsert_start(OTHER, "k", 100)
    assert [(r.segment, r.offset) for r in got] == [(r.segment, r.offset) for r in before]
    assert m.batch_get_replica_list(["k"]) == [ErrorCode.REPLICA_IS_NOT_READY]  # never half written
    assert not m.exist_key("k")
    assert m.usage().used_bytes == 100 and m.usage().objects == 1
    assert fsck(m).ok
    with raises_code(ErrorCode.ILLEGAL_CLIENT):
        m.put_end(WRITER, "k")  # the upsert's writer ends it
    m.upsert_end(OTHER, "k", checksum="c2")
    got = m.get_replica_list("k")
    assert [(r.segment, r.offset) for r in got.replicas] == [(r.segment, r.offset) for r in before]
    assert got.checksum == "c2"
    assert fsck(m).ok


def test_a_leased_object_is_reallocated_and_its_old_extent_held_until_the_lease_ends(m):
    put(m, "k", 100)
    old = offsets(m, "k")  # a read: leased for default_kv_lease_ttl
    got = m.upsert_start(WRITER, "k", 100)
    assert [(r.segment, r.offset) for r in got] != old
    assert m.usage().used_bytes == 200  # the old bytes stay allocated for the reader
    m.upsert_end(WRITER, "k")
    assert m.usage().objects == 1
    m.advance_clock(m.config.default_kv_lease_ttl)
    Worker(m).run_once()
    assert m.usage().used_bytes == 100
    assert fsck(m).ok


def test_another_size_is_reallocated_and_keeps_the_pins_and_the_group(new_master):
    m = new_master()
    mount(m, "seg", PER_SHARD)
    group = ReplicateConfig(group_id="g", with_hard_pin=True, soft_pin_action=SoftPinAction.ENABLE,
                            soft_pin_ttl_ms=600_000)
    m.put_start(WRITER, "{g}k", 100, group)
    m.put_end(WRITER, "{g}k")
    m.advance_clock(100_000)
    got = m.upsert_start(WRITER, "{g}k", 300)  # no config: what the object had stays
    assert got[0].size == 300
    m.upsert_end(WRITER, "{g}k")
    info = m.describe("{g}k")
    assert info.size == 300 and info.hard_pinned and info.group_id == "g"
    assert info.soft_pin_until_ms == m.now_ms() + 500_000  # what was left of it
    assert fsck(m).ok


def test_group_membership_is_immutable(m):
    put(m, "{g}k", 100, config=ReplicateConfig(group_id="g"))
    put(m, "plain", 100)
    assert m.batch_upsert_start(WRITER, ["{g}k"], [100], ReplicateConfig(group_id="h")) == [ErrorCode.INVALID_PARAMS]
    assert m.batch_upsert_start(WRITER, ["plain"], [100], ReplicateConfig(group_id="g")) == [ErrorCode.INVALID_PARAMS]
    assert m.describe("{g}k").status.value == "complete" and m.exist_key("plain")


def test_a_guarantee_stays_in_place_and_is_inherited_on_reallocation(new_master):
    m = new_master()
    mount(m, "seg", PER_SHARD)
    m.put_start(WRITER, "k", 100, ReplicateConfig(guaranteed_ttl_ms=60_000))
    m.put_end(WRITER, "k")
    until = m.describe("k").guaranteed_until_ms
    m.upsert_start(WRITER, "k", 100)
    m.upsert_end(WRITER, "k")
    assert m.describe("k").guaranteed_until_ms == until  # in place: untouched
    m.advance_clock(10_000)
    m.upsert_start(WRITER, "k", 400)
    m.upsert_end(WRITER, "k")
    assert m.describe("k").guaranteed_until_ms == until  # reallocated: what was left of it
    assert m.usage().guaranteed_bytes == 400
    assert fsck(m).ok


def test_a_task_reference_refuses_the_upsert(m):
    put(m, "k", 100)
    m.add_task_ref("k")
    assert m.batch_upsert_start(WRITER, ["k"], [100]) == [ErrorCode.OBJECT_HAS_REPLICATION_TASK]
    assert m.batch_upsert_start(WRITER, ["k"], [200]) == [ErrorCode.OBJECT_HAS_REPLICATION_TASK]
    m.release_task_ref("k")
    assert m.batch_upsert_start(WRITER, ["k"], [100]) != [ErrorCode.OBJECT_HAS_REPLICATION_TASK]


def test_a_put_in_progress_is_preempted_at_once(m):
    m.put_start(OTHER, "k", 100)
    got = m.upsert_start(WRITER, "k", 100)
    m.upsert_end(WRITER, "k")
    assert m.describe("k").writer == WRITER
    assert m.usage().used_bytes == 200  # the preempted writer's extent is held until its release timeout
    assert got[0].offset != 0 or got[0].segment != "seg"
    with raises_code(ErrorCode.ILLEGAL_CLIENT):
        m.put_end(OTHER, "k")
    m.advance_clock(m.config.put_start_release_timeout)
    Worker(m).run_once()
    assert m.usage().used_bytes == 100
    assert fsck(m).ok


def test_a_revoked_in_place_upsert_drops_the_object(m):
    put(m, "k", 100)
    m.upsert_start(WRITER, "k", 100)
    m.upsert_revoke(WRITER, "k")
    assert not m.exist_key("k") and m.usage().used_bytes == 0
    assert fsck(m).ok


def test_an_abandoned_in_place_upsert_is_discarded_like_a_put(m):
    put(m, "k", 100)
    m.upsert_start(WRITER, "k", 100)
    m.advance_clock(m.config.put_start_discard_timeout + m.config.put_start_release_timeout)
    Worker(m).run_once()
    Worker(m).run_once()
    assert not m.exist_key("k") and m.usage().objects == 0
    assert fsck(m).ok


def test_a_batch_mixes_the_cases(m):
    put(m, "same", 100)
    put(m, "bigger", 100)
    results = m.batch_upsert_start(WRITER, ["same", "bigger", "new", ""], [100, 300, 50, 10])
    assert [len(r) if isinstance(r, list) else r for r in results] == [1, 1, 1, ErrorCode.INVALID_PARAMS]
    assert m.batch_put_end(WRITER, ["same", "bigger", "new"]) == [ErrorCode.OK] * 3
    assert [m.describe(k).size for k in ("same", "bigger", "new")] == [100, 300, 50]
    assert fsck(m).ok


def test_with_no_room_the_old_object_is_gone_as_in_mooncake(m):
    put(m, "k", 100)
    assert m.batch_upsert_start(WRITER, ["k"], [PER_SHARD + 1]) == [ErrorCode.NO_AVAILABLE_HANDLE]
    assert not m.exist_key("k")
    assert fsck(m).ok


def test_refusals_write_nothing(m):
    put(m, "k", 100)
    before = store_snapshot(m)
    t = m.transport
    for argv in ((1, "client_id", ""), (2, "client_id", WRITER, "soft_pin_action", "sometimes"),
                 (2, "client_id", WRITER, "soft_pin_ttl_ms", "5"), (2, "client_id", WRITER, "group", "\0g")):
        with raises_code(ErrorCode.INVALID_PARAMS):
            t.call("mc_upsert_start", t.shard_of(b"k"), *argv, 2, "key", "size", "k", "100")
    assert t.call("mc_upsert_start", t.shard_of(b"k"), 1, "client_id", WRITER, 2, "key", "size", "k", "0") == [
        ErrorCode.INVALID_PARAMS]
    with raises_code(ErrorCode.INVALID_PARAMS):
        m.batch_upsert_start(WRITER, ["k"], [1, 2])
    assert store_snapshot(m) == before


def test_radix_membership_stays_in_place_and_follows_a_reallocation(new_master):
    m = new_master(enable_radix_tree=True)
    mount(m, "seg", PER_SHARD)
    parent, child = (hashlib.sha256(n).hexdigest() for n in (b"parent", b"child"))
    put(m, f"{parent}_0", 100)
    key = f"{child}_0"
    put(m, key, 100, config=ReplicateConfig(parent_block_hash=parent))
    m.upsert_start(WRITER, key, 100, ReplicateConfig(parent_block_hash=parent))
    assert m.get_keys_by_prefix(child) == [key.encode()]
    m.upsert_end(WRITER, key)
    m.upsert_start(WRITER, key, 300, ReplicateConfig(parent_block_hash=parent))
    m.upsert_end(WRITER, key)
    m.drain_radix_outbox()
    assert m.get_keys_by_prefix(child) == [key.encode()] and m.describe(key).size == 300
    assert m.describe_radix_node(child).parent == parent.encode()
    assert fsck(m).ok


# ---- random mixes: the books stay right (fsck) and a readable object has its last bytes ----------

KEYS = ["a", "b", "{g}c", "{g}d"]
op_st = st.one_of(
    st.tuples(st.just("upsert"), st.sampled_from(KEYS), st.sampled_from([100, 200, 1000])),
    st.tuples(st.just("end"), st.sampled_from(KEYS)),
    st.tuples(st.just("revoke"), st.sampled_from(KEYS)),
    st.tuples(st.just("put"), st.sampled_from(KEYS), st.sampled_from([100, 200])),
    st.tuples(st.just("read"), st.sampled_from(KEYS)),
    st.tuples(st.just("remove"), st.sampled_from(KEYS), st.booleans()),
    st.tuples(st.just("evict")),
    st.tuples(st.just("advance"), st.sampled_from([1, 5_000, 20_000, 700_000])),
)


def _gone(m, key: str) -> bool:
    return not present(m, [key])[0]


def _group(key: str) -> ReplicateConfig | None:
    return ReplicateConfig(group_id="g") if key.startswith("{g}") else None


class Mix:
    """The model: each key's size as last ended (while it exists), and the upserts left open."""

    def __init__(self, m):
        self.m, self.sizes, self.open = m, {}, {}

    def upsert(self, key, size):
        got = self.m.batch_upsert_start(WRITER, [key], [size], _group(key))[0]
        if isinstance(got, list):
            assert all(r.size == size for r in got)
            self.sizes.pop(key, None)  # unreadable (in place) or gone (reallocated) until it ends
            self.open[key] = size
        elif got == ErrorCode.NO_AVAILABLE_HANDLE:
            self.sizes.pop(key, None)  # as Mooncake: the old object went first
            self.open.pop(key, None)

    def end(self, key):
        if key in self.open and self.m.batch_put_end(WRITER, [key])[0] == ErrorCode.OK:
            self.sizes[key] = self.open[key]
        self.open.pop(key, None)

    def revoke(self, key):
        if key in self.open:
            self.m.batch_put_revoke(WRITER, [key])
            self.open.pop(key)

    def put(self, key, size):
        if self.m.batch_put_start(WRITER, [key], [size], _group(key))[0] not in (
                ErrorCode.OBJECT_ALREADY_EXISTS, ErrorCode.NO_AVAILABLE_HANDLE):
            self.open.pop(key, None)  # an open upsert past its discard timeout was preempted
            self.m.put_end(WRITER, key)
            self.sizes[key] = size

    def read(self, key):
        got = self.m.batch_get_replica_list([key])[0]
        if key in self.open:
            assert isinstance(got, ErrorCode)  # never half written
        elif not isinstance(got, ErrorCode):
            assert self.sizes.get(key) == got.replicas[0].size  # never another write's bytes

    def remove(self, key, force):
        if self.m.batch_remove([key], force)[0] == ErrorCode.OK:
            self.sizes.pop(key, None)
            self.open.pop(key, None)

    def evict(self):
        self.m.run_eviction()

    def advance(self, ms):
        self.m.advance_clock(ms)

    def settle(self):
        for k in list(self.sizes):  # what eviction took (describe: an inspection, no lease)
            if _gone(self.m, k):
                self.sizes.pop(k)
        report = fsck(self.m)
        assert report.ok, report.findings


@settings(max_examples=examples(40), deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=st.lists(op_st, min_size=5, max_size=30))
def test_random_upserts_puts_reads_removes_and_evictions_keep_the_books(new_master, ops):
    m = new_master()
    mount(m, "seg", 4000)  # a few objects fill a shard: eviction and NO_AVAILABLE_HANDLE happen
    mix = Mix(m)
    for op in ops:
        getattr(mix, op[0])(*op[1:])
        mix.settle()
