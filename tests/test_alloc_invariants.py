"""The extent allocator: extents never overlap, freed space coalesces, free + allocated extents
tile every segment slice, and used_bytes is exactly what live replicas (and held extents of
preempted puts) occupy. A deterministic walk-through, then random operation sequences."""
from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from helpers import (WRITER, assert_no_overlap, assert_tiles, code_of, examples, free_extents, mount, put,
                     shard_keys, shard_of_key, slice_of)
from mooncake_redis import ErrorCode, MasterError, ReplicaListResult, ReplicaStatus, ReplicateConfig


def test_extents_are_contiguous_and_freed_space_coalesces(master):
    size = mount(master, "seg", 1000)
    shard = shard_of_key(master, "{t}a")
    lo, length = slice_of(master, size, shard)
    assert length == 1000
    a = put(master, "{t}a", 100)[0].offset
    b = put(master, "{t}b", 200)[0].offset
    c = put(master, "{t}c", 300)[0].offset
    assert sorted([(a, 100), (b, 200), (c, 300)]) == [(lo, 100), (lo + 100, 200), (lo + 300, 300)]
    assert free_extents(master, shard, "seg") == [(lo + 600, 400)]

    master.remove("{t}b")
    assert free_extents(master, shard, "seg") == [(b, 200), (lo + 600, 400)]
    master.remove("{t}a" if a < b else "{t}c")  # the neighbour below b: merges with b's hole
    assert free_extents(master, shard, "seg")[0] == (lo, 300)

    d = put(master, "{t}d", 250)[0].offset  # best fit: the 300-byte hole, not the 400-byte one
    assert d == lo
    assert free_extents(master, shard, "seg") == [(lo + 250, 50), (lo + 600, 400)]
    master.remove("{t}c")  # merges with the free extents on both sides
    assert free_extents(master, shard, "seg") == [(lo + 250, 750)]
    master.remove("{t}d")
    assert free_extents(master, shard, "seg") == [(lo, 1000)]
    assert master.usage().used_bytes == 0


def test_after_everything_is_removed_each_slice_is_one_extent(master):
    size_a = mount(master, "a", 4096)
    size_b = mount(master, "b", 2048)
    keys = [f"key-{i}" for i in range(40)]
    for i, k in enumerate(keys):
        master.put_start(WRITER, k, 1 + (i * 37) % 200, ReplicateConfig(replica_num=2))
    for k in keys[::2]:
        master.put_end(WRITER, k)
    for k in keys[1::4]:
        master.put_revoke(WRITER, k)
    for k in keys[::4]:
        master.remove(k)
    for k in keys[3::4]:
        master.put_end(WRITER, k)
    assert master.remove_all() == 20
    for k in keys[2::4]:
        assert code_of(master.describe, k) == ErrorCode.OBJECT_NOT_FOUND
    assert master.usage().used_bytes == 0 and master.usage().objects == 0
    for shard in range(master.shards):
        assert free_extents(master, shard, "a") == [slice_of(master, size_a, shard)]
        assert free_extents(master, shard, "b") == [slice_of(master, size_b, shard)]


# ---- random operation sequences ------------------------------------------------------------

SEG_SLICES = {"s0": 64, "s1": 40}            # bytes per shard slice
KEYS = ["{a}1", "{a}2", "{a}3", "{b}1", "{b}2", "c"]
CLIENTS = ["w1", "w2"]
DISCARD, RELEASE, LEASE = 1_000, 2_500, 2_000

key_st = st.sampled_from(KEYS)
seg_st = st.sampled_from(sorted(SEG_SLICES))
pref_st = st.sampled_from([(), (), ("s0",), ("s1",), ("s1", "s0"), ("s0", "s0"), ("gone",)])
put_st = st.tuples(st.just("put"), key_st, st.integers(1, 48), st.integers(1, 3), st.sampled_from(CLIENTS), pref_st)
small_put_st = st.tuples(st.just("put"), key_st, st.integers(1, 20), st.integers(1, 2), st.sampled_from(CLIENTS),
                         pref_st)
end_st = st.tuples(st.just("end"), key_st, st.sampled_from(CLIENTS))
advance_st = st.tuples(st.just("advance"), st.sampled_from([1, 500, 1_000, 2_500]))
op_st = st.one_of(
    put_st, small_put_st, small_put_st, end_st, end_st, advance_st, advance_st,
    st.tuples(st.just("mount"), seg_st),
    st.tuples(st.just("unmount"), seg_st),
    st.tuples(st.just("revoke"), key_st, st.sampled_from(CLIENTS)),
    st.tuples(st.just("remove"), key_st, st.booleans()),
    st.tuples(st.just("get"), key_st),
)


@dataclass
class Obj:
    size: int
    writer: str
    started: int
    replicas: dict[str, int]           # segment -> absolute offset
    complete: bool = False
    lease_until: int = 0


@dataclass
class Held:
    shard: int
    seg: str
    epoch: int
    off: int
    size: int
    due: int


@dataclass
class Model:
    shards: int
    now: int
    objects: dict[str, Obj] = field(default_factory=dict)
    mounted: dict[str, int] = field(default_factory=dict)  # segment -> mount epoch
    epochs: dict[str, int] = field(default_factory=dict)
    held: list[Held] = field(default_factory=list)

    def live_held(self) -> list[Held]:
        return [h for h in self.held if self.mounted.get(h.seg) == h.epoch]


class Run:
    """Applies one operation to the store and the model and checks the reply."""

    def __init__(self, m, hosts: dict[str, str] | None = None):
        self.m = m
        self.model = Model(m.shards, m.now_ms())
        self.hosts = hosts or {}  # segment -> the host it is mounted with

    def shard(self, key: str) -> int:
        return shard_of_key(self.m, key)

    def slice(self, seg: str, shard: int) -> tuple[int, int]:
        return slice_of(self.m, SEG_SLICES[seg] * self.m.shards, shard)

    def room(self, seg: str, shard: int, size: int) -> bool:
        return any(n >= size for _, n in free_extents(self.m, shard, seg))

    # -- operations --
    def mount(self, seg):
        self.m.mount_segment(seg, SEG_SLICES[seg] * self.m.shards, "owner", host=self.hosts.get(seg))
        if seg not in self.model.mounted:
            self.model.epochs[seg] = self.model.epochs.get(seg, 0) + 1
            self.model.mounted[seg] = self.model.epochs[seg]

    def unmount(self, seg):
        code = code_of(self.m.unmount_segment, seg, "owner")
        if seg not in self.model.mounted:
            assert code == ErrorCode.SEGMENT_NOT_FOUND
            return
        assert code == ErrorCode.OK
        del self.model.mounted[seg]
        for key in list(self.model.objects):
            obj = self.model.objects[key]
            obj.replicas.pop(seg, None)
            if not obj.replicas:
                del self.model.objects[key]

    def put(self, key, size, replica_num, client, preferred, host=None):
        md, shard = self.model, self.shard(key)
        config = ReplicateConfig(replica_num=replica_num, preferred_segments=preferred, host=host,
                                 prefer_same_host=host is not None)
        # a put_start first releases the due held extents of its shard
        kept = [h for h in md.held if not (h.shard == shard and h.due <= md.now)]
        if len(kept) < len(md.held):
            event("held extent released")
        md.held = kept
        old = md.objects.get(key)
        expect_exists = old is not None and (old.complete or md.now - old.started < DISCARD)
        if expect_exists and not old.complete and old.writer == client and old.size == size and old.replicas:
            event("put_start retried by its writer")  # answers the replicas it already has
            replicas = self.m.put_start(client, key, size, config)
            assert {r.segment: r.offset for r in replicas} == old.replicas
            return
        if old is not None and not expect_exists:  # preempted: its extents stay held
            event("abandoned put preempted")
            for seg, off in old.replicas.items():
                md.held.append(Held(shard, seg, md.mounted[seg], off, old.size, old.started + RELEASE))
            del md.objects[key]
        before = dict(md.objects)
        local = [seg for seg in md.mounted if host is not None and self.hosts.get(seg) == host
                 and self.room(seg, shard, size)]
        try:
            replicas = self.m.put_start(client, key, size, config)
        except MasterError as exc:
            if expect_exists:
                assert exc.code == ErrorCode.OBJECT_ALREADY_EXISTS
                return
            assert exc.code == ErrorCode.NO_AVAILABLE_HANDLE, exc
            event("NO_AVAILABLE_HANDLE")
            self.forget_evicted(shard, before)
            for seg in md.mounted:
                assert not self.room(seg, shard, size), f"NO_AVAILABLE_HANDLE but {seg} has room"
            return
        assert not expect_exists, f"put_start {key} should be OBJECT_ALREADY_EXISTS"
        self.forget_evicted(shard, before)
        segs = [r.segment for r in replicas]
        assert 1 <= len(segs) <= replica_num and len(set(segs)) == len(segs)
        for r in replicas:
            assert r.segment in md.mounted and r.size == size
            lo, n = self.slice(r.segment, shard)
            assert lo <= r.offset and r.offset + size <= lo + n
        for seg in preferred:  # a mounted preferred segment with room is always used
            if seg in md.mounted and seg not in segs:
                assert len(segs) == replica_num or not self.room(seg, shard, size)
        if local and not set(preferred) & set(md.mounted):  # a host segment with room gets a replica
            event("placed on the writer's host")
            assert set(segs) & set(local), f"{segs}: none on host {host} ({local} had room)"
        if len(segs) < replica_num:  # best effort: no other segment had room
            event("fewer replicas than asked")
            for seg in md.mounted:
                assert seg in segs or not self.room(seg, shard, size)
        md.objects[key] = Obj(size, client, md.now, {r.segment: r.offset for r in replicas})

    def put_host(self, key, size, replica_num, client, preferred, host):
        self.put(key, size, replica_num, client, preferred, host)

    def forget_evicted(self, shard, before):
        """A put that finds no room may evict; only unprotected objects of its shard may go."""
        for key, obj in before.items():
            if code_of(self.m.describe, key) == ErrorCode.OBJECT_NOT_FOUND:
                assert self.shard(key) == shard and obj.complete and obj.lease_until <= self.model.now, (
                    f"{key} vanished but was protected or on another shard")
                del self.model.objects[key]
                event("evicted to make room")

    def end(self, key, client):
        obj = self.model.objects.get(key)
        code = code_of(self.m.put_end, client, key)
        if obj is None:
            assert code == ErrorCode.OBJECT_NOT_FOUND
        elif obj.writer != client:
            assert code == ErrorCode.ILLEGAL_CLIENT
        else:
            assert code == ErrorCode.OK
            if not obj.complete:
                obj.complete, obj.lease_until = True, max(obj.lease_until, self.model.now)

    def revoke(self, key, client):
        obj = self.model.objects.get(key)
        code = code_of(self.m.put_revoke, client, key)
        if obj is None:
            assert code == ErrorCode.OBJECT_NOT_FOUND
        elif obj.writer != client:
            assert code == ErrorCode.ILLEGAL_CLIENT
        elif obj.complete:
            assert code == ErrorCode.INVALID_WRITE
        else:
            assert code == ErrorCode.OK
            del self.model.objects[key]

    def remove(self, key, force):
        obj = self.model.objects.get(key)
        code = code_of(self.m.remove, key, force=force)
        if obj is None:
            assert code == ErrorCode.OBJECT_NOT_FOUND
        elif not obj.complete:
            assert code == ErrorCode.REPLICA_IS_NOT_READY
        elif obj.lease_until > self.model.now and not force:
            assert code == ErrorCode.OBJECT_HAS_LEASE
        else:
            assert code == ErrorCode.OK
            del self.model.objects[key]

    def get(self, key):
        obj = self.model.objects.get(key)
        result = self.m.batch_get_replica_list([key])[0]
        if obj is None:
            assert result == ErrorCode.OBJECT_NOT_FOUND
        elif not obj.complete:
            assert result == ErrorCode.REPLICA_IS_NOT_READY
        else:
            assert isinstance(result, ReplicaListResult), result
            assert {r.segment: r.offset for r in result.replicas} == obj.replicas
            obj.lease_until = max(obj.lease_until, self.model.now + LEASE)

    def advance(self, ms):
        self.model.now = self.m.advance_clock(ms)

    # -- invariants --
    def check(self):
        m, md = self.m, self.model
        for key in KEYS:
            obj = md.objects.get(key)
            if obj is None:
                assert code_of(m.describe, key) == ErrorCode.OBJECT_NOT_FOUND, key
                continue
            info = m.describe(key)
            assert info.size == obj.size and info.writer == obj.writer
            assert info.status == (ReplicaStatus.COMPLETE if obj.complete else ReplicaStatus.PROCESSING)
            assert {r.segment: r.offset for r in info.replicas} == obj.replicas, key
            assert info.lease_until_ms == obj.lease_until, key
        usage = m.usage()
        total_used = 0
        for shard in range(m.shards):
            shard_used = 0
            for seg in SEG_SLICES:
                if seg not in md.mounted:
                    assert free_extents(m, shard, seg) == [], f"unmounted {seg} has free extents"
                    continue
                used = [(off, obj.size) for key, obj in md.objects.items() if self.shard(key) == shard
                        for s, off in obj.replicas.items() if s == seg]
                held = [(h.off, h.size) for h in md.live_held() if h.shard == shard and h.seg == seg]
                assert_no_overlap(used + held)
                lo, n = self.slice(seg, shard)
                assert_tiles(free_extents(m, shard, seg), used + held, lo, n)
                shard_used += sum(size for _, size in used + held)
            row = usage.shards[shard]
            assert row.used_bytes == shard_used, f"shard {shard}: used_bytes {row.used_bytes} != {shard_used}"
            assert row.capacity_bytes == sum(SEG_SLICES[s] for s in md.mounted)
            assert row.objects == sum(1 for key in md.objects if self.shard(key) == shard)
            total_used += shard_used
        assert usage.used_bytes == total_used
        replica_bytes = sum(obj.size * len(obj.replicas) for obj in md.objects.values())
        held_bytes = sum(h.size for h in md.live_held())
        assert usage.used_bytes == replica_bytes + held_bytes
        for shard in range(m.shards):  # the host index lists exactly the mounted segments of each host
            for host in set(self.hosts.values()):
                listed = m.redis.smembers(shard_keys(m, shard).host_segments(host))
                assert listed == {s.encode() for s in md.mounted if self.hosts.get(s) == host}
        assert {s["name"]: s["used"] for s in m.segments()} == {
            seg: sum(obj.size for obj in md.objects.values() if seg in obj.replicas)
            + sum(h.size for h in md.live_held() if h.seg == seg)
            for seg in md.mounted}


@settings(max_examples=examples(30), deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=st.lists(op_st, min_size=10, max_size=60))
def test_random_operations_keep_the_allocator_consistent(new_master, ops):
    m = new_master(put_start_discard_timeout=DISCARD, put_start_release_timeout=RELEASE,
                   default_kv_lease_ttl=LEASE)
    run = Run(m)
    run.mount("s0")
    run.check()
    for op in ops:
        getattr(run, op[0])(*op[1:])
        run.check()


# The same sequences with the placement options: segments mounted with hosts, puts that prefer
# a host (one with segments, or none), under each allocation strategy.
HOSTS = {"s0": "h0", "s1": "h1"}
host_put_st = st.tuples(st.just("put_host"), key_st, st.integers(1, 48), st.integers(1, 3),
                        st.sampled_from(CLIENTS), pref_st, st.sampled_from(["h0", "h1", "hx"]))
placement_op_st = st.one_of(op_st, host_put_st, host_put_st)


@settings(max_examples=examples(30), deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=st.lists(placement_op_st, min_size=10, max_size=60),
       strategy=st.sampled_from(["most_free", "random", "free_ratio_first"]))
def test_random_operations_with_placement_keep_the_allocator_consistent(new_master, ops, strategy):
    m = new_master(put_start_discard_timeout=DISCARD, put_start_release_timeout=RELEASE,
                   default_kv_lease_ttl=LEASE, allocation_strategy=strategy)
    run = Run(m, HOSTS)
    run.mount("s0")
    run.check()
    for op in ops:
        getattr(run, op[0])(*op[1:])
        run.check()
