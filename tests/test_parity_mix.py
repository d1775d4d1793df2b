"""Mooncake's parity operations mixed under eviction pressure (Hypothesis): puts (some hard-pinned),
reads, upserts (ended, revoked or left open), replica copies and moves (ended, revoked or left to
their deadline), removes, eviction and the clock in any order. After every step the allocation
and accounting books hold (fsck: no overlapping extents, used bytes equal to the live replicas
and held extents, every index and counter), a hard-pinned object and an object a replication
runs on are still there after eviction, and once every deadline has passed no object keeps a
task reference."""
from __future__ import annotations

from helpers import WATERMARKS, examples
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from mooncake_redis import ErrorCode, MasterError, ReplicateConfig
from mooncake_redis.fsck import fsck

MASTER_CONFIG = WATERMARKS
KIB = 1024
SEGS = ("s0", "s1", "s2")
KEYS = [f"k{i}" for i in range(6)]
CLIENT = "client-1"

key_st = st.integers(0, len(KEYS) - 1)
op_st = st.one_of(
    st.tuples(st.just("put"), key_st, st.sampled_from([KIB, 3 * KIB, 5 * KIB]), st.integers(0, 2), st.booleans()),
    st.tuples(st.just("read"), key_st),
    st.tuples(st.just("upsert"), key_st, st.sampled_from([KIB, 3 * KIB]), st.sampled_from(["end", "revoke", "open"])),
    st.tuples(st.just("upsert_end"), key_st),
    st.tuples(st.just("copy"), key_st, st.integers(1, 2)),
    st.tuples(st.just("move"), key_st, st.integers(0, 2)),
    st.tuples(st.just("end"), key_st),
    st.tuples(st.just("revoke"), key_st),
    st.tuples(st.just("remove"), key_st, st.booleans()),
    st.tuples(st.just("evict"),),
    st.tuples(st.just("clock"), st.sampled_from([1_000, 30_000])),
)


def _segments(m, key):
    return [r.segment for r in m.get_replica_list(key).replicas]


def _step(m, op, running: dict[str, str]) -> None:
    """One operation; a refusal (MasterError) is part of the run."""
    kind, k = op[0], KEYS[op[1]] if len(op) > 1 and op[0] != "clock" else None
    if kind == "put":
        _, _, size, seg, pin = op
        m.put_start(CLIENT, k, size, ReplicateConfig(preferred_segments=(SEGS[seg],), with_hard_pin=pin))
        m.put_end(CLIENT, k)
    elif kind == "read":
        m.get_replica_list(k)
    elif kind == "upsert":
        m.upsert_start(CLIENT, k, op[2])
        if op[3] != "open":
            (m.upsert_end if op[3] == "end" else m.upsert_revoke)(CLIENT, k)
    elif kind == "upsert_end":
        m.upsert_end(CLIENT, k)
    elif kind == "copy":
        src = _segments(m, k)[0]
        m.replica_copy_start(CLIENT, k, src, [s for s in SEGS if s != src][:op[2]])
        running[k] = "copy"
    elif kind == "move":
        src = _segments(m, k)[0]
        m.replica_move_start(CLIENT, k, src, SEGS[op[2]])
        running[k] = "move"
    elif kind in ("end", "revoke"):  # of a replication started before, when there is one
        k = sorted(running)[op[1] % len(running)] if running else k
        kind_of = running.pop(k, "copy")
        (m.replica_end if kind == "end" else m.replica_revoke)(CLIENT, k, kind_of)
    elif kind == "remove":
        m.remove(k, force=op[2])
    elif kind == "evict":
        m.run_eviction()
    elif kind == "clock":
        m.advance_clock(op[1])
        for shard in range(m.shards):
            m.transport.call("mc_discard_puts", shard, 64)


def _exists(m, k) -> bool:
    """The object is there (readable, or being rewritten by an upsert)."""
    try:
        m.describe(k)
        return True
    except MasterError as e:
        assert e.code == ErrorCode.OBJECT_NOT_FOUND, e
        return False


def _protected(m, k) -> bool:
    """Hard-pinned, or with a task reference (a replication in flight): eviction must keep it."""
    try:
        return m.task_refs(k) > 0 or m.describe(k).hard_pinned
    except MasterError:
        return False


@settings(max_examples=examples(10), deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
# a move under pressure, evicted around, ended after an upsert was refused
@example(ops=[("put", 0, 5 * KIB, 0, False), ("put", 1, 5 * KIB, 0, False), ("move", 0, 1),
              ("put", 2, 5 * KIB, 1, False), ("upsert", 0, KIB, "end"), ("evict",), ("end", 0), ("evict",)])
# a copy left to its deadline, an open upsert, a pinned object under eviction
@example(ops=[("put", 3, 3 * KIB, 2, True), ("put", 4, KIB, 2, False), ("copy", 4, 2), ("upsert", 3, 3 * KIB, "open"),
              ("evict",), ("clock", 30_000), ("upsert_end", 3), ("evict",)])
@given(ops=st.lists(op_st, min_size=5, max_size=30))
def test_parity_operations_keep_the_books(new_master, ops):
    m = new_master(evict_on_put=False)
    for i, s in enumerate(SEGS):
        m.mount_segment(s, 12 * KIB * m.shards, CLIENT, base=(i + 1) << 30)
    for i, k in enumerate(KEYS):  # every key starts as an object: the operations have one to act on
        _step(m, ("put", i, KIB, i % len(SEGS), False), {})
    running: dict[str, str] = {}
    for step, op in enumerate(ops):
        kept = [k for k in KEYS if op[0] == "evict" and _protected(m, k)]
        try:
            _step(m, op, running)
            event(f"{op[0]} succeeded")
        except MasterError:
            pass
        for k in kept:
            assert _exists(m, k), (step, op, k)
        report = fsck(m)
        assert report.ok, (step, op, report)
    m.advance_clock(10 * m.config.put_start_discard_timeout)
    for shard in range(m.shards):
        m.transport.call("mc_discard_puts", shard, 64)
    for k in KEYS:
        try:
            assert m.task_refs(k) == 0, k
        except MasterError as e:
            assert e.code == ErrorCode.OBJECT_NOT_FOUND
    assert fsck(m).ok
