"""Background workers: discard of abandoned puts, client-TTL expiry, eviction, shard claims and
stopping. The store clock is frozen; time only moves through advance_clock (no sleeps)."""
from __future__ import annotations

import os
import signal
import threading

import pytest

from mooncake_redis import ErrorCode, MasterError, ReplicateConfig
from mooncake_redis.keys import shard_of
from mooncake_redis.worker import STEPS, Step, Worker, WorkerPass, evict, stop_on_signals

from helpers import T0, WATERMARKS, all_shard_keys, replicas_in, shard_keys, watched_silence

MASTER_CONFIG = WATERMARKS  # new_master's defaults in this module (conftest)

pytestmark = pytest.mark.cluster  # these API tests run on the test cluster too (conftest)

KIB = 1024
LONG = 10**12  # a client_ttl that never runs out in these tests (writers that stop pinging are tested apart)


def metrics(master, shard):
    raw = master.redis.hgetall(shard_keys(master, shard).metrics)
    return {k.decode(): v.decode() for k, v in raw.items()}


# ---- abandoned puts ------------------------------------------------------------------------
def test_abandoned_put_is_discarded_then_its_space_released(new_master):
    master = new_master(client_ttl=LONG)
    cfg = master.config
    master.mount_segment("seg-a", 1 << 20, "client-1")
    master.put_start("client-1", "k1", 4 * KIB)
    worker = Worker(master)

    master.advance_clock(cfg.put_start_discard_timeout - 1)
    assert worker.run_once().discarded_puts == 0
    assert master.describe("k1").status == "processing"

    master.advance_clock(1)  # the put is now discard_timeout old
    done = worker.run_once()
    assert (done.discarded_puts, done.released_extents) == (1, 0)
    with pytest.raises(MasterError) as e:
        master.describe("k1")
    assert e.value.code == ErrorCode.OBJECT_NOT_FOUND
    assert master.usage().objects == 0
    assert master.usage().used_bytes == 4 * KIB  # held: the old writer may still write into it

    # held until put_started + release_timeout
    master.advance_clock(cfg.put_start_release_timeout - cfg.put_start_discard_timeout - 1)
    assert worker.run_once().released_extents == 0
    assert master.usage().used_bytes == 4 * KIB
    master.advance_clock(1)
    done = worker.run_once()
    assert (done.discarded_puts, done.released_extents) == (0, 1)
    assert master.usage().used_bytes == 0
    assert int(metrics(master, shard_of(b"k1", master.shards))["discarded_puts_total"]) == 1

    # the key is free again, and the whole segment can be allocated once more
    master.put_start("client-2", "k1", 4 * KIB)
    master.put_end("client-2", "k1")
    assert master.exist_key("k1")


def test_completed_puts_are_not_discarded(new_master):
    master = new_master(client_ttl=LONG)
    master.mount_segment("seg-a", 1 << 20, "client-1")
    master.put_start("client-1", "done", KIB)
    master.put_end("client-1", "done")
    master.put_start("client-1", "open", KIB)
    master.advance_clock(master.config.put_start_discard_timeout)
    done = Worker(master).run_once()
    assert done.discarded_puts == 1
    assert master.exist_key("done")
    assert master.usage().objects == 1


def test_discard_runs_in_batches_until_done(new_master):
    m = new_master(client_ttl=LONG)
    m.mount_segment("seg-a", 1 << 20, "client-1")
    keys = [f"k{i}" for i in range(20)]
    assert all(isinstance(r, list) for r in m.batch_put_start("client-1", keys, [KIB] * 20))
    m.advance_clock(m.config.put_start_release_timeout)  # discard and release due at once
    done = Worker(m, batch=3).run_once()
    assert (done.discarded_puts, done.released_extents) == (20, 20)
    assert m.usage().used_bytes == 0 and m.usage().objects == 0


def test_maintenance_functions_reject_bad_arguments(master):
    for fn, args in [("mc_discard_puts", ["0"]), ("mc_discard_puts", ["1025"]),
                     ("mc_expire_clients", ["x"]), ("mc_claim", ["w", "0"]), ("mc_claim", ["", "10"])]:
        with pytest.raises(MasterError) as e:
            master.transport.call(fn, 0, *args)
        assert e.value.code == ErrorCode.INVALID_PARAMS


# ---- client TTL ----------------------------------------------------------------------------
def test_client_ttl_expiry_unmounts_segments_and_hides_replicas(master):
    ttl = master.config.client_ttl
    size = 1 << 20
    master.mount_segment("seg-a", size, "client-1")
    master.mount_segment("seg-a2", size, "client-1")
    master.mount_segment("seg-b", size, "client-2")
    for key, prefs, n in [("only-a", ("seg-a",), 1), ("only-b", ("seg-b",), 1), ("both", ("seg-a", "seg-b"), 2)]:
        master.put_start("client-1", key, KIB, ReplicateConfig(replica_num=n, preferred_segments=prefs))
        master.put_end("client-1", key)
    worker = Worker(master)
    assert worker.run_once().clients_expired == 0  # a worker now watches the clients' silence

    master.advance_clock(ttl // 2)
    assert master.ping("client-2") == "OK"
    assert worker.run_once().clients_expired == 0
    master.advance_clock(ttl - ttl // 2)  # client-1 is exactly client_ttl old: still alive
    assert worker.run_once().clients_expired == 0
    master.advance_clock(1)
    done = worker.run_once()
    assert done.clients_expired == master.shards  # one per shard
    assert done.segments_unmounted == 2 * master.shards
    assert done.swept_objects == 1  # only-a had no other replica

    assert not master.exist_key("only-a")
    with pytest.raises(MasterError) as e:
        master.get_replica_list("only-a")
    assert e.value.code == ErrorCode.OBJECT_NOT_FOUND
    assert [r.segment for r in master.get_replica_list("both").replicas] == ["seg-b"]
    assert [r.segment for r in master.describe("both").replicas] == ["seg-b"]
    assert "seg-a" not in replicas_in(master.describe("both").fields)  # swept out of the hash
    assert master.exist_key("only-b")
    assert [s["name"] for s in master.segments()] == ["seg-b"]
    usage = master.usage()
    assert (usage.capacity_bytes, usage.used_bytes, usage.objects) == (size, 2 * KIB, 2)

    assert master.ping("client-1") == "NEED_REMOUNT"
    assert master.ping("client-2") == "OK"
    # the client remounts under the same name: a new mount, empty
    master.mount_segment("seg-a", size, "client-1")
    assert master.ping("client-1") == "OK"
    assert not master.exist_key("only-a")
    assert master.usage().capacity_bytes == 2 * size


def test_sweep_owed_by_a_crashed_worker_is_done_by_the_next_pass(master):
    master.mount_segment("seg-a", 1 << 20, "client-1")
    master.mount_segment("seg-b", 1 << 20, "client-2")
    master.put_start("client-1", "k1", KIB, ReplicateConfig(preferred_segments=("seg-a",)))
    master.put_end("client-1", "k1")
    watched_silence(master, master.config.client_ttl + 1, ping=("client-2",))
    master.ping("client-2")
    # a worker expired the client on every shard, then died before sweeping
    for shard in range(master.shards):
        assert master.transport.call("mc_expire_clients", shard, 16) == [1, 1]
    owed = [master.redis.get(p.sweep_pending) for p in all_shard_keys(master)]
    assert all(owed)
    assert master.describe("k1").replicas == []  # hidden at once (mount id), still in its hash
    done = Worker(master).run_once()
    assert (done.clients_expired, done.segments_unmounted, done.swept_objects) == (0, 0, 1)
    assert all(master.redis.get(p.sweep_pending) is None for p in all_shard_keys(master))
    assert master.usage().objects == 0


def test_sweep_done_keeps_a_marker_moved_on_by_a_newer_unmount(master):
    master.redis.set(shard_keys(master, 0).sweep_pending, 2)
    assert master.transport.call("mc_sweep_done", 0, "1") == 0
    assert master.transport.call("mc_sweep_done", 0, "2") == 1
    assert master.redis.get(shard_keys(master, 0).sweep_pending) is None


def test_expired_client_puts_in_flight_lose_their_space(master):
    master.mount_segment("seg-a", 1 << 20, "client-1")
    master.put_start("client-1", "open", 4 * KIB)
    watched_silence(master, master.config.client_ttl + 1)
    done = Worker(master).run_once()
    assert done.clients_expired == master.shards
    assert master.usage().used_bytes == 0 and master.usage().objects == 0


def test_client_expiry_without_segments_only_forgets_the_client(master):
    master.mount_segment("seg-a", 1 << 20, "client-1")
    master.unmount_segment("seg-a", "client-1")
    assert master.ping("client-1") == "OK"  # known, with no segment left
    watched_silence(master, master.config.client_ttl + 1)
    done = Worker(master).run_once()
    assert (done.clients_expired, done.segments_unmounted, done.swept_objects) == (master.shards, 0, 0)
    assert master.ping("client-1") == "NEED_REMOUNT"


# ---- eviction ------------------------------------------------------------------------------
def test_worker_evicts_each_shard_to_target(new_master):
    m = new_master(evict_on_put=False)
    slice_size = 64 * KIB
    m.mount_segment("seg-a", slice_size * m.shards, "client-1")
    # 60 objects of 1 KiB per shard: 93.75% > the 90% high watermark
    per_shard = {s: [] for s in range(m.shards)}
    i = 0
    while any(len(v) < 60 for v in per_shard.values()):
        key = f"k{i}"
        i += 1
        bucket = per_shard[shard_of(key.encode(), m.shards)]
        if len(bucket) < 60:
            bucket.append(key)
    keys = [k for v in per_shard.values() for k in v]
    assert all(isinstance(r, list) for r in m.batch_put_start("client-1", keys, [KIB] * len(keys)))
    assert all(c == ErrorCode.OK for c in m.batch_put_end("client-1", keys))

    worker = Worker(m)
    done = worker.run_once()
    target = int(slice_size * (m.config.eviction_high_watermark_ratio - m.config.eviction_ratio))
    for s in m.usage().shards:
        assert target - KIB < s.used_bytes <= target
    evicted = 60 * m.shards - m.usage().objects
    assert done.evicted_objects == done.evicted_units == evicted
    assert done.evicted_bytes == evicted * KIB
    assert sum(int(metrics(m, s)["evicted_objects_total"]) for s in range(m.shards)) == evicted
    assert all(int(metrics(m, s)["last_pass_ms"]) == T0 for s in range(m.shards))

    # at target: the next pass has nothing to evict
    again = worker.run_once()
    assert again.evicted_objects == 0 and again.eviction_steps == m.shards


def test_eviction_in_small_steps_still_reaches_the_target(new_master):
    m = new_master(shards=1, evict_on_put=False)
    m.mount_segment("seg-a", 100 * KIB, "client-1")
    keys = [f"k{i}" for i in range(100)]
    m.batch_put_start("client-1", keys, [KIB] * 100)
    m.batch_put_end("client-1", keys)
    done = Worker(m, step_units=4).run_once()
    assert done.eviction_steps > 1
    assert m.usage().used_bytes == 85 * KIB  # target = 85% of 100 KiB


def test_leased_objects_are_not_evicted_until_the_lease_ends(new_master):
    m = new_master(shards=1, evict_on_put=False)
    m.mount_segment("seg-a", 10 * KIB, "client-1")
    keys = [f"k{i}" for i in range(10)]
    m.batch_put_start("client-1", keys, [KIB] * 10)
    m.batch_put_end("client-1", keys)
    m.batch_get_replica_list(keys)  # leases every object
    worker = Worker(m)
    assert worker.run_once().evicted_objects == 0
    m.advance_clock(m.config.default_kv_lease_ttl)
    assert worker.run_once().evicted_objects == 2  # 10 KiB -> 8 KiB <= 85%
    assert m.usage().used_bytes == 8 * KIB


# ---- claims --------------------------------------------------------------------------------
def test_second_worker_cannot_claim_until_the_claim_expires(master):
    a = Worker(master, "worker-a", claim_ttl_ms=5000)
    b = Worker(master, "worker-b", claim_ttl_ms=5000)
    assert a.run_once().shards_claimed == master.shards
    assert b.run_once().shards_claimed == 0
    master.advance_clock(4999)
    assert b.run_once().shards_claimed == 0
    assert a.run_once().shards_claimed == master.shards  # renews: until T0 + 4999 + 5000
    master.advance_clock(4999)
    assert b.run_once().shards_claimed == 0
    master.advance_clock(1)  # a's claim has run out on the store clock
    assert b.run_once().shards_claimed == master.shards
    assert a.run_once().shards_claimed == 0
    assert master.redis.get(shard_keys(master, 0).worker).decode() == f"worker-b {T0 + 9999 + 5000}"


def test_claimed_shard_work_is_done_once(new_master):
    master = new_master(client_ttl=LONG, put_start_discard_timeout=1000)
    master.mount_segment("seg-a", 1 << 20, "client-1")
    master.put_start("client-1", "k1", KIB)
    a, b = Worker(master, "worker-a"), Worker(master, "worker-b")
    a.run_once()
    master.advance_clock(master.config.put_start_discard_timeout)
    assert b.run_once() == WorkerPass()  # a still holds every shard: b does nothing
    assert a.run_once().discarded_puts == 1


def test_release_claim_only_releases_our_own(master):
    assert master.transport.call("mc_claim", 0, "worker-a", 1000) == 1
    assert master.transport.call("mc_claim", 0, "worker-b", 1000) == 0
    assert master.transport.call("mc_release_claim", 0, "worker-b") == 0
    assert master.transport.call("mc_release_claim", 0, "worker-a") == 1
    assert master.transport.call("mc_claim", 0, "worker-b", 1000) == 1


# ---- an idle store is not written to on every pass -------------------------------------------
PASS_MS = 200  # a worker's default interval, as store time between passes


def writes(m) -> int:
    """Write commands the server has run (its dirty counter), functions' own writes included."""
    return int(m.redis.info("persistence")["rdb_changes_since_last_save"])


def test_idle_passes_write_at_most_a_few_times_per_client_ttl(valkey_master):
    m = valkey_master(shards=2)
    m.mount_segment("seg-a", 1 << 20, "client-1")
    worker = Worker(m)
    worker.run_once()  # the first pass claims, starts the watch of client silence, publishes

    def idle_passes(n: int) -> int:
        """The writes of n passes PASS_MS apart (the clock's own INCRBY on each shard left out)."""
        before = writes(m)
        for _ in range(n):
            m.advance_clock(PASS_MS)
            assert worker.run_once().shards_claimed == 2
        return writes(m) - before - n * m.shards

    # 1 s of idle passes: the claim, the watch and the metrics are all fresh
    assert idle_passes(5) == 0
    # on to 10 s (client_ttl), per shard: a claim renewal per claim_ttl / 2 (7), a watch refresh
    # per client_ttl / 8 (7) and 2 publications of 3 commands: about 20 (5 a pass used to be 225)
    assert idle_passes(45) <= 2 * 24
    worker.flush_metrics()
    assert [int(metrics(m, s)["passes_total"]) for s in range(2)] == [51, 51]  # every pass counted
    assert [int(metrics(m, s)["last_pass_ms"]) for s in range(2)] == [m.now_ms()] * 2


def test_a_silent_client_is_expired_by_the_first_pass_after_client_ttl(new_master):
    m = new_master()
    m.mount_segment("seg-a", 1 << 20, "client-1")  # its last ping: T0
    worker = Worker(m)
    while m.now_ms() <= T0 + m.config.client_ttl:
        assert worker.run_once().clients_expired == 0
        m.advance_clock(PASS_MS)
    assert worker.run_once().clients_expired == m.shards  # it was known on every shard


def test_a_takeover_keeps_the_watch_of_client_silence(new_master):
    """A worker that dies leaves its claim for up to claim_ttl and skipped watch refreshes: the
    next worker still sees an unbroken watch and expires a silent client on time."""
    m = new_master()
    m.mount_segment("seg-a", 1 << 20, "client-1")
    a, b = Worker(m, "worker-a"), Worker(m, "worker-b")
    while m.now_ms() < T0 + 3000:  # then a dies
        assert a.run_once().clients_expired == 0
        m.advance_clock(PASS_MS)
    taken = False
    while m.now_ms() <= T0 + m.config.client_ttl:
        done = b.run_once()
        taken = taken or done.shards_claimed == m.shards
        assert done.clients_expired == 0
        m.advance_clock(PASS_MS)
    assert taken and b.run_once().clients_expired == m.shards


# ---- stopping ------------------------------------------------------------------------------
class StopAfter(Worker):
    """Sets the stop event after `passes` passes, the way a SIGTERM handler would."""

    def __init__(self, master, stop, passes=1, **kw):
        super().__init__(master, **kw)
        self.stop, self.left, self.passes = stop, passes, 0

    def run_once(self):
        done = super().run_once()
        self.passes += 1
        self.left -= 1
        if self.left == 0:
            self.stop.set()
        return done


def test_run_returns_once_stop_is_set_and_releases_claims(master):
    stop = threading.Event()
    w = StopAfter(master, stop, passes=2, worker_id="worker-a")
    assert w.run(stop, interval_s=0) == 2
    assert w.passes == 2
    # the claims were released on the way out: another worker takes over at once
    assert Worker(master, "worker-b").run_once().shards_claimed == master.shards


def test_run_with_stop_already_set_does_nothing(master):
    stop = threading.Event()
    stop.set()
    w = StopAfter(master, stop, passes=1)
    assert w.run(stop) == 0 and w.passes == 0


def test_sigterm_sets_stop_and_run_returns(master):
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers need the main thread")
    stop = threading.Event()
    previous = stop_on_signals(stop)
    try:
        class SigtermAfterFirstPass(Worker):
            passes = 0

            def run_once(self):
                done = super().run_once()
                self.passes += 1
                if self.passes == 1:
                    os.kill(os.getpid(), signal.SIGTERM)
                elif self.passes > 3:  # safety net: never loop forever if the signal is lost
                    stop.set()
                return done

        w = SigtermAfterFirstPass(master)
        w.run(stop, interval_s=0)
        assert stop.is_set() and w.passes == 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_stop_interrupts_eviction_between_steps(new_master):
    m = new_master(shards=1, evict_on_put=False)
    m.mount_segment("seg-a", 100 * KIB, "client-1")
    keys = [f"k{i}" for i in range(100)]
    m.batch_put_start("client-1", keys, [KIB] * 100)
    m.batch_put_end("client-1", keys)
    stop = threading.Event()

    def stop_during_evict(worker, shard, done):
        stop.set()  # as if SIGTERM arrived while the first eviction step ran
        evict(worker, shard, done)

    steps = [Step("evict", stop_during_evict) if s.name == "evict" else s for s in STEPS]
    w = Worker(m, step_units=1, steps=steps)
    w.run(stop, interval_s=0)
    assert m.usage().objects == 99  # exactly one step ran, then the worker left


def test_a_pass_runs_the_steps_in_order_on_each_claimed_shard(new_master):
    m = new_master(shards=4)
    seen = []
    assert [s.name for s in STEPS] == ["discard_puts", "expire_clients", "finish_drains", "sweep_replicas",
                                       "reap_gateway_segments",
                                       "redeliver_offload", "evict", "radix"]
    probes = [Step(f"probe-{s.name}", lambda worker, shard, done, name=s.name: seen.append((shard.index, name)))
              for s in STEPS]
    steps = [x for pair in zip(probes, STEPS) for x in pair]  # a probe before each built-in step
    done = Worker(m, steps=steps + [Step("last", lambda worker, shard, done: seen.append((shard.index, "last")))]
                  ).run_once()
    assert done.shards_claimed == 4 and done.eviction_steps == 4  # the built-in steps ran too
    order = m.transport.spread(range(4))  # by shard number; on a cluster, taking turns on the nodes
    assert sorted(order) == [0, 1, 2, 3]
    assert seen == [(shard, name) for shard in order for name in [s.name for s in STEPS] + ["last"]]
