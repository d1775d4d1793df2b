"""The SSD offload tier's disk space and file removals, master side: used_bytes per client disk
and shard kept exact by every path that adds or drops a disk replica, the reported capacity split
over the shards and enforced at hand-out (a task that does not fit stays queued), the per-client
removal queue (handed out, acknowledged, redelivered, never for a file a live replica points at,
bounded), fsck of the new counters, and both invariants under random operations."""
from __future__ import annotations

import random

import pytest

from mooncake_redis import ErrorCode, ReplicateConfig
from mooncake_redis.fsck import fsck
from mooncake_redis.keys import shard_of
from mooncake_redis.models import DiskRemoval
from mooncake_redis.worker import Worker

from helpers import keys_on_shard, raises_code, shard_keys, watched_silence
from test_offload import DISK, HIGH, WRITER, offload_master, put

pytestmark = pytest.mark.cluster


def offload(m, keys, where=lambda k: f"/d/{k}"):
    """Hand out the keys' tasks and report them done at `where(key)`."""
    tasks = m.offload_object_heartbeat(DISK, 1024)
    got = {t.key.decode() for t in tasks}
    assert set(keys) <= got, (keys, got)
    assert m.notify_offload_success(DISK, list(keys), [where(k) for k in keys]) == [ErrorCode.OK] * len(keys)


def disk_field(m, shard, field, client=DISK):
    return int(m.redis.hget(shard_keys(m, shard).disk(client), field) or 0)


def used(m, client=DISK):
    return sum(disk_field(m, s, "used_bytes", client) for s in range(m.shards))


def removals(m, n=1024):
    """The removals handed out now, acknowledged."""
    got = m.remove_object_heartbeat(DISK, n)
    assert m.ack_remove_object_heartbeat(DISK, got) == [ErrorCode.OK] * len(got)
    return sorted((r.key.decode(), r.location) for r in got)


def test_used_bytes_follow_every_path_that_adds_or_drops_a_disk_replica(new_master):
    m = offload_master(new_master)
    m.mount_segment("mem2", (1 << 20) * m.shards, DISK)
    put(m, "a", 1000, ReplicateConfig(preferred_segments=("mem",)))
    put(m, "b", 3000, ReplicateConfig(preferred_segments=("mem2",)))
    put(m, "c", 500, ReplicateConfig(preferred_segments=("mem",)))
    offload(m, ["a", "b", "c"])
    assert used(m) == 4500 and m.offload_clients()[0].used_bytes == 4500
    # a repeat success changes nothing; a success at another location moves the replica (the old
    # file is queued for removal), its bytes stay counted once
    assert m.notify_offload_success(DISK, ["a", "a"], ["/d/a", "/d/a"]) == [ErrorCode.OK] * 2
    assert m.notify_offload_success(DISK, ["c"], ["/d/c2"]) == [ErrorCode.OK]
    assert used(m) == 4500
    assert removals(m) == [("c", "/d/c")]
    # eviction frees memory, never disk: b becomes disk-only when its memory segment goes
    assert m.unmount_segment("mem2", DISK) == 0
    assert used(m) == 4500
    m.advance_clock(60_000)
    m.remove("b")  # a disk-only object removed
    m.remove("a")
    assert used(m) == 500
    assert removals(m) == [("a", "/d/a"), ("b", "/d/b")]
    assert fsck(m).ok
    # the disk unmounted: its bytes and its removal queue go with it
    m.unmount_local_disk_segment(DISK)
    assert used(m) == 0 and m.offload_clients() == []
    m.mount_local_disk_segment(DISK)  # a new mount starts from 0; c's old replica is dead
    assert used(m) == 0 and [r.kind for r in m.get_replica_list("c").replicas] == ["memory"]
    assert fsck(m).ok


def test_client_expiry_and_sweeps_keep_used_bytes_exact(new_master):
    m = offload_master(new_master)
    put(m, "k")
    offload(m, ["k"])
    assert used(m) == 1000
    watched_silence(m, m.config.client_ttl + 1)
    Worker(m).run_once()
    assert used(m) == 0 and not m.exist_key("k")
    assert fsck(m).ok


def test_capacity_is_split_over_the_shards(new_master, shards):
    m = offload_master(new_master)
    m.report_ssd_capacity(DISK, 10 * shards + 3)
    got = [disk_field(m, s, "capacity_bytes") for s in range(shards)]
    assert sum(got) == 10 * shards + 3 and max(got) - min(got) <= 1
    assert got == sorted(got, reverse=True)  # the first shards take the remainder
    assert m.offload_clients()[0].capacity_bytes == 10 * shards + 3


def test_a_task_that_does_not_fit_stays_queued_and_nothing_overtakes_it(new_master, shards):
    m = offload_master(new_master)
    m.report_ssd_capacity(DISK, 2500 * shards)  # 2500 bytes per shard
    g1, g2, low = keys_on_shard(m, 0, 3)
    put(m, g1, 1500, HIGH)
    put(m, g2, 1500, HIGH)
    put(m, low, 100)
    tasks = m.offload_object_heartbeat(DISK)
    assert [t.key.decode() for t in tasks] == [g1]  # g2 does not fit beside g1: it waits, low too
    assert disk_field(m, 0, "inflight_bytes") == 1500
    counters = m.offload_counters()
    assert counters["deferred"] >= 1 and counters["dropped_high"] == counters["dropped_low"] == 0
    assert m.offload_clients()[0].queued == {"high": 1, "normal": 0, "low": 1}
    m.notify_offload_success(DISK, [g1], ["/d/g1"])
    assert m.offload_object_heartbeat(DISK) == []  # 1500 used: still no room for g2
    m.advance_clock(60_000)
    m.remove(g1)  # room again: g2 goes first, then low
    assert [t.key.decode() for t in m.offload_object_heartbeat(DISK)] == [g2, low]
    assert fsck(m).ok


def test_an_entry_larger_than_the_whole_share(new_master, shards):
    m = offload_master(new_master)
    m.report_ssd_capacity(DISK, 1000 * shards)
    big_low, big_high, small = keys_on_shard(m, 0, 3)
    put(m, big_low, 2000)
    put(m, small, 100)
    # a LOW entry that can never fit is dropped and counted; the next one goes
    assert [t.key.decode() for t in m.offload_object_heartbeat(DISK)] == [small]
    assert m.offload_counters()["dropped_low"] == 1
    # a HIGH one waits (never silently lost) until the client reports more room
    put(m, big_high, 2000, HIGH)
    assert m.offload_object_heartbeat(DISK) == []
    assert m.offload_clients()[0].queued["high"] == 1
    m.report_ssd_capacity(DISK, 4000 * shards)
    assert [t.key.decode() for t in m.offload_object_heartbeat(DISK)] == [big_high]


def test_no_capacity_reported_means_no_bound(new_master):
    m = offload_master(new_master)
    put(m, "k", 5000)
    assert [t.key for t in m.offload_object_heartbeat(DISK)] == [b"k"]
    assert m.offload_clients()[0].capacity_bytes is None


def test_removals_are_handed_out_acknowledged_and_redelivered(new_master):
    m = offload_master(new_master, offload_task_timeout=5_000)
    put(m, "k")
    offload(m, ["k"])
    m.advance_clock(60_000)
    m.remove("k")
    (r,) = m.remove_object_heartbeat(DISK)
    assert (r.key, r.tenant_id, r.location) == (b"k", "default", "/d/k")
    assert m.remove_object_heartbeat(DISK) == []  # handed out: not again before the timeout
    m.advance_clock(5_000)
    assert m.remove_object_heartbeat(DISK) == [r]  # not acknowledged: handed out again
    assert m.ack_remove_object_heartbeat(DISK, [r, r]) == [ErrorCode.OK, ErrorCode.OBJECT_NOT_FOUND]
    m.advance_clock(5_000)
    assert m.remove_object_heartbeat(DISK) == []
    assert m.offload_clients()[0].removals == 0
    with raises_code(ErrorCode.SEGMENT_NOT_FOUND):
        m.remove_object_heartbeat("nobody")


def test_a_file_a_live_replica_points_at_again_is_never_handed_out(new_master):
    m = offload_master(new_master)
    put(m, "k")
    offload(m, ["k"])
    m.advance_clock(60_000)
    m.remove("k")  # /d/k is queued for removal
    put(m, "k")    # the key comes back and is offloaded to the same location
    offload(m, ["k"])
    assert m.remove_object_heartbeat(DISK) == []  # the success withdrew the removal
    # a removal queued for a location and then pointed at again by hand is dropped at hand-out
    k = shard_keys(m, shard_of(b"k", m.shards))
    entry = b"default 1 k /d/k"
    m.redis.zadd(k.disk_removals(DISK), {entry: 0})
    assert m.remove_object_heartbeat(DISK) == []
    assert m.redis.zcard(k.disk_removals(DISK)) == 0
    assert m.disk_referenced(DISK, [DiskRemoval(b"k", "default", "/d/k"),
                                    DiskRemoval(b"k", "default", "/d/other")]) == [True, False]


def test_a_full_removal_queue_counts_orphans(new_master, shards):
    m = offload_master(new_master, disk_removal_queue_limit=2 * shards)
    keys = keys_on_shard(m, 0, 3)
    for key in keys:
        put(m, key)
    offload(m, keys)
    m.advance_clock(60_000)
    for key in keys:
        m.remove(key)
    assert len(m.remove_object_heartbeat(DISK)) == 2
    (stats,) = m.offload_clients()
    assert stats.orphaned == 1 and m.offload_counters()["orphaned"] == 1
    # removals not handed out when the disk is unmounted are orphans too
    put(m, "x")
    offload(m, ["x"])
    m.advance_clock(60_000)
    m.remove("x")
    m.unmount_local_disk_segment(DISK)
    # 1 (full) + x: queued (1 more orphan at the unmount) or found shard 0's queue full (1 more
    # orphan at once) + shard 0's 2 handed-out removals, orphaned by the unmount
    assert m.offload_counters()["orphaned"] == 4


def test_bad_removal_arguments_are_refused(new_master):
    m = offload_master(new_master)
    with raises_code(ErrorCode.INVALID_PARAMS):
        m.remove_object_heartbeat(DISK, 0)
    with raises_code(ErrorCode.INVALID_PARAMS):
        m.ack_remove_object_heartbeat(DISK, [DiskRemoval(b"k", "default", "")])
    with raises_code(ErrorCode.INVALID_PARAMS):
        m.ack_remove_object_heartbeat(DISK, [DiskRemoval(b"k", "bad tenant", "/d")])
    k = shard_keys(m, 0)
    for argv in ([1, "client_id", DISK], [2, "client_id", DISK, "max_items", "2000"],
                 [2, "client_id", DISK, "max_items", "01"]):
        with pytest.raises(Exception, match="INVALID_PARAMS"):
            m.redis.execute_command("FCALL", "mc_disk_removal_heartbeat", 1, k.P, *argv)
    for argv in (["c", "1", "0"], ["c", "x", "0", "5"], ["c", "1", "0", "-5"]):
        with pytest.raises(Exception, match="INVALID_PARAMS"):
            m.redis.execute_command("FCALL", "mc_fsck_disk_used", 1, k.P, *argv)


def test_fsck_finds_and_repairs_disk_counter_drift(new_master):
    m = offload_master(new_master)
    put(m, "a")
    put(m, "b", 2000)
    offload(m, ["a"])
    m.offload_object_heartbeat(DISK)  # b in flight
    ka, kb = (shard_keys(m, shard_of(x, m.shards)) for x in (b"a", b"b"))
    m.redis.hincrby(ka.disk(DISK), "used_bytes", 777)
    m.redis.hset(kb.disk(DISK), "inflight_bytes", 5)
    report = fsck(m)
    assert sorted(f.kind for f in report.findings) == ["disk_used_bytes", "offload_inflight_count"]
    repaired = fsck(m, repair=True).repaired
    assert sorted(f.kind for f in repaired) == ["disk_used_bytes", "offload_inflight_count"]
    assert fsck(m).ok
    assert used(m) == 1000 and disk_field(m, kb.shard, "inflight_bytes") == 2000


def test_fsck_repairs_malformed_disk_figures(new_master):
    """A disk's used bytes or in-flight count stored malformed is set to the recomputed value."""
    m = offload_master(new_master)
    put(m, "a")
    put(m, "b", 2000)
    offload(m, ["a"])
    m.offload_object_heartbeat(DISK)  # b in flight
    ka, kb = (shard_keys(m, shard_of(x, m.shards)) for x in (b"a", b"b"))
    m.redis.hset(ka.disk(DISK), "used_bytes", "many")
    m.redis.hset(kb.disk(DISK), "inflight", "1.0")
    report = fsck(m, repair=True)
    assert sorted((f.kind, f.repaired) for f in report.findings) == [("disk_used_bytes", True),
                                                                     ("offload_inflight_count", True)], report.summary()
    assert all("malformed" in f.found for f in report.findings)
    assert fsck(m).ok
    assert used(m) == 1000 and disk_field(m, kb.shard, "inflight") == 1


def test_fsck_disk_used_is_compare_and_add(new_master):
    m = offload_master(new_master)
    k = shard_keys(m, 0)
    mount = int(m.redis.hget(k.disk(DISK), "mount"))
    m.redis.hset(k.disk(DISK), "used_bytes", 10)
    fc = lambda *a: m.redis.execute_command("FCALL", "mc_fsck_disk_used", 1, k.P, *a)  # noqa: E731
    assert fc(DISK, mount, 9, 5) == [0, 10]         # it moved since read: nothing written
    assert fc(DISK, mount + 1, 10, -10) == [0, 10]  # another mount: nothing written
    assert fc(DISK, mount, 10, -10) == [1, 0]


@pytest.mark.parametrize("seed", [0, *(pytest.param(s, marks=pytest.mark.slow) for s in (1, 2))])  # more: the full run
def test_disk_books_hold_under_random_operations(new_master, shards, seed):
    """used_bytes == the sizes of the live disk replicas and inflight_bytes == the sizes of the
    tasks in flight, per client and shard, after every step; a task is handed out only while it
    fits; and no file is ever removed while a live disk replica points at it (a simulated disk:
    every live replica's file exists), whatever the order of puts, heartbeats, successes at
    reused locations, failures, timeouts, evictions, removals, unmounts and removal heartbeats."""
    m = offload_master(new_master, per_shard=12_000, offload_task_timeout=3_000, offload_queue_limit=4 * shards,
                       disk_removal_queue_limit=6 * shards)
    share = 6000
    m.report_ssd_capacity(DISK, share * shards)
    rnd = random.Random(seed)
    files: set[str] = set()              # the simulated disk
    handed: dict[str, int] = {}          # key -> time its task was handed out
    now = removed = 0
    offloaded: list[str] = []            # keys reported on disk (some since removed)
    for step in range(200):
        op = rnd.random()
        if op < 0.25:
            key = f"r{rnd.randrange(20)}"
            if not m.exist_key(key):
                try:
                    put(m, key, rnd.choice([500, 1000, 2500]), rnd.choice([None, HIGH]))
                except Exception:
                    pass
        elif op < 0.4:
            for t in m.offload_object_heartbeat(DISK, rnd.randrange(1, 5)):
                handed[t.key.decode()] = now
        elif op < 0.57 and handed:
            key = rnd.choice(sorted(handed))
            location = f"/d/{key}/{rnd.randrange(2)}"  # reused locations on purpose
            files.add(location)
            m.notify_offload_success(DISK, [key], [location])
            handed.pop(key)
            offloaded.append(key)
        elif op < 0.6 and handed:
            m.notify_offload_failure(DISK, [handed.popitem()[0]])
        elif op < 0.66:
            now += 3_000
            m.advance_clock(3_000)
            m.redeliver_offload_tasks()
            handed = {k: t for k, t in handed.items() if now - t < 3_000}
        elif op < 0.71:
            for shard in range(m.shards):
                m.redis.hset(m.transport.keys[shard].P, "put_failed", 1)
                m.evict_step(shard)
        elif op < 0.86:
            key = rnd.choice(offloaded) if offloaded and rnd.random() < 0.7 else f"r{rnd.randrange(20)}"
            try:
                m.remove(key, force=True)
            except Exception:
                pass
            handed.pop(key, None)
        elif op < 0.98:
            got = m.remove_object_heartbeat(DISK, rnd.randrange(1, 6))
            for r in got:
                assert not m.disk_referenced(DISK, [r])[0]
                files.discard(r.location)
                removed += 1
            if rnd.random() < 0.8:
                m.ack_remove_object_heartbeat(DISK, got)
        else:
            m.unmount_local_disk_segment(DISK)
            m.mount_local_disk_segment(DISK)
            m.report_ssd_capacity(DISK, share * shards)
            handed.clear()  # their tasks end at their deadline; a late success would be refused
            files.clear()   # the client starts over (offload-gc collects such files)
        _check_disk_books(m, share, files)
    counters = m.offload_counters()
    assert removed > 0 and counters["done"] > 0  # the run exercised both
    assert fsck(m).ok


def _check_disk_books(m, share, files):
    for k in m.transport.keys:
        mount = m.redis.hget(k.disk(DISK), "mount")
        want_used = want_inflight = 0
        for okey in m.redis.scan_iter(match=k.prefix("object") + b"*"):
            h = m.redis.hgetall(okey)
            size = int(h.get(b"size", 0))
            rep = h.get(b"disk:" + DISK.encode())
            if rep is not None and rep.split(b" ", 1)[0] == mount:
                want_used += size
                assert rep.split(b" ", 1)[1].decode() in files, "a live replica's file was removed"
            if h.get(b"offload_client") == DISK.encode() and h.get(b"offload_mount") == mount:
                want_inflight += size
        row = m.redis.hmget(k.disk(DISK), "used_bytes", "inflight_bytes")
        assert (int(row[0] or 0), int(row[1] or 0)) == (want_used, want_inflight)
        assert want_used + want_inflight <= share


def test_a_bad_stored_removal_limit_orphans_instead_of_failing_a_remove(new_master):
    # the limit is read only when a removal is queued, inside calls (remove, eviction) that must
    # not fail half way: a missing or bad value is a share of 0
    m = offload_master(new_master)
    put(m, "k")
    offload(m, ["k"])
    for k in m.transport.keys:
        m.redis.hset(k.config, "disk_removal_queue_limit", "nan")
    m.advance_clock(60_000)
    m.remove("k")
    assert m.remove_object_heartbeat(DISK) == [] and m.offload_counters()["orphaned"] == 1
    assert used(m) == 0
