"""Background workers: the bounded maintenance loops of the master, driven from outside Redis.

A Worker holds no state of its own beyond counters: every step is one atomic FCALL, so any
number of workers can run, crash and restart. To keep several workers from repeating each
other's work, a worker only works on the shards it holds a short claim on (`mc_claim`, a lease
with a deadline on the store clock, renewed between steps and released when `run` returns).
An idle store is not written to on every pass: a pass reads first (the store clock, the claim,
the oldest ping, the watch of client silence) and renews its claim only once half of it has run
out, runs mc_expire_clients only when a client is due or the watch needs its refresh
(every client_ttl / 8), and publishes an idle pass's metrics every METRICS_EVERY_MS.

One pass runs the loops of `STEPS` over each claimed shard, in this order (earlier loops free
space that eviction would otherwise have to find):
  1. discard_puts: discard abandoned puts, revoke abandoned replica copies and moves, and
     release due held extents (`mc_discard_puts`, until a call does less than `batch` of each);
  2. expire_clients: expire clients whose pings stopped (`mc_expire_clients`, same rule; only
     when a client's last ping is more than client_ttl old or the watch is due for a refresh);
  2b. finish_drains (shard 0): unmount, on every shard, the gracefully unmounting segments
     whose slices are all empty or past their grace period (`mc_finish_drain`);
  3. sweep_replicas: when a segment was unmounted (the shard's `<P>:sweep_pending` marker is
     set, also if a worker stopped before sweeping, or step 2 just unmounted one), sweep the dead
     replicas out of the shard's object hashes (`mc_sweep_replicas` over a SCAN of the shard's
     objects, then `mc_sweep_done`);
  3b. reap_gateway_segments (shard 0): forget segments a Mooncake gateway recorded that are no
     longer mounted, with their transfer-engine metadata (`mc_gw_reap`);
  4. redeliver_offload: offload tasks whose deadline passed are queued again or dropped
     (`mc_offload_sweep`, which releases their task references first);
  5. evict: eviction steps (`mc_evict`, which also runs the due deadline sweeps and, with
     offload_on_evict, queues objects without a disk copy for offload) until the shard's state
     is no longer "more".
  6. radix (only with enable_radix_tree): deliver the shard's radix outbox (unlinks eviction
     wrote make parents on other shards candidates), then one bounded reconciliation call of
     a walk over the shard's nodes (a walk starts at most every RADIX_WALK_EVERY_MS of store
     time after the last one ended).
Then it publishes metrics to the plain hash `<P>:metrics` (not master state): at once after a
pass that did work, else every METRICS_EVERY_MS of store time (the counts of the passes in
between included). A new loop is one more `Step` in `STEPS`.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field, fields
from typing import Callable, Iterable, Sequence

import redis

from .errors import MasterError
from .master import EVICT_STEP_UNITS, Master
from .models import EvictionStep
from .radix import DEFAULT_GRACE_MS as RADIX_GRACE_MS
from .segments import DRAIN_BATCH

log = logging.getLogger(__name__)

MAX_BATCH = 1024  # the functions' own cap on items per call
METRICS_EVERY_MS = 5_000  # store time between two publications of an idle worker's pass metrics
RADIX_WALK_EVERY_MS = 60_000  # store time from the end of a radix reconciliation walk to the next


@dataclass
class WorkerPass:
    """What one `run_once` did, summed over the shards it claimed."""
    shards_claimed: int = 0
    evicted_units: int = 0
    evicted_objects: int = 0
    evicted_bytes: int = 0
    eviction_steps: int = 0
    evict_queued: int = 0  # objects eviction queued for offload instead (offload_on_evict)
    discarded_puts: int = 0
    released_extents: int = 0
    revoked_replications: int = 0
    clients_expired: int = 0
    segments_unmounted: int = 0
    swept_objects: int = 0  # objects the dead-replica sweep deleted (no live replica left)
    radix_outbox_applied: int = 0    # cross-shard radix steps delivered
    radix_nodes_dropped: int = 0     # empty radix nodes reconciliation removed
    radix_phantoms_removed: int = 0  # children a parent listed that were gone
    gateway_segments_reaped: int = 0  # segments a gateway recorded that are no longer mounted
    segments_drained: int = 0  # gracefully unmounted segments that went (drained, or their grace ended)
    offload_timed_out: int = 0  # offload tasks whose deadline passed (queued again or dropped)

    def add(self, other: "WorkerPass") -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def counts(self) -> dict[str, int]:
        """The non-zero counts, by field name."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) and f.name != "shards_claimed"}

    def did_work(self) -> bool:
        return any(getattr(self, f.name) for f in fields(self) if f.name not in ("shards_claimed", "eviction_steps"))


# metrics hash field -> WorkerPass field, incremented with HINCRBY after every pass
_TOTALS = {
    "evicted_units_total": "evicted_units",
    "evicted_objects_total": "evicted_objects",
    "evicted_bytes_total": "evicted_bytes",
    "eviction_steps_total": "eviction_steps",
    "evict_queued_total": "evict_queued",
    "discarded_puts_total": "discarded_puts",
    "released_extents_total": "released_extents",
    "revoked_replications_total": "revoked_replications",
    "clients_expired_total": "clients_expired",
    "segments_unmounted_total": "segments_unmounted",
    "swept_objects_total": "swept_objects",
    "radix_outbox_applied_total": "radix_outbox_applied",
    "radix_nodes_dropped_total": "radix_nodes_dropped",
    "radix_phantoms_removed_total": "radix_phantoms_removed",
    "offload_timed_out_total": "offload_timed_out",
    "gateway_segments_reaped_total": "gateway_segments_reaped",
    "segments_drained_total": "segments_drained",
}


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class _ClaimLost(Exception):
    pass


@dataclass(frozen=True)
class ClaimedShard:
    """A shard a worker holds for one pass."""
    index: int
    now_ms: int          # the store clock when the pass began
    sweep_pending: bool  # <P>:sweep_pending was set: a dead-replica sweep is owed
    expire_due: bool = True  # mc_expire_clients has something to do (see Worker._expire_due)


@dataclass
class _Unpublished:
    """A shard's passes whose metrics are not published yet."""
    passes: int = 0
    counts: WorkerPass = field(default_factory=WorkerPass)
    last_pass_ms: int = 0


@dataclass(frozen=True)
class Step:
    """One background loop. `run(worker, shard, done)` works on one claimed shard in bounded
    calls, adds what it did to `done` (this shard's part of the pass), renews the claim
    (`worker.renew`) before each further call and returns early once `worker.stopping()`."""
    name: str
    run: Callable[["Worker", ClaimedShard, WorkerPass], None]


def discard_puts(worker: "Worker", shard: ClaimedShard, done: WorkerPass) -> None:
    while True:
        discarded, released, revoked = worker.transport.call("mc_discard_puts", shard.index, worker.batch)
        done.discarded_puts += discarded
        done.released_extents += released
        done.revoked_replications += revoked
        if max(discarded, released, revoked) < worker.batch or worker.stopping():
            return
        worker.renew(shard.index)


def expire_clients(worker: "Worker", shard: ClaimedShard, done: WorkerPass) -> None:
    if not shard.expire_due:  # no client is silent for client_ttl, and the store's watch is fresh
        return
    while True:
        clients, segments = worker.transport.call("mc_expire_clients", shard.index, worker.batch)
        done.clients_expired += clients
        done.segments_unmounted += segments
        if clients < worker.batch or worker.stopping():
            return
        worker.renew(shard.index)


def sweep_replicas(worker: "Worker", shard: ClaimedShard, done: WorkerPass) -> None:
    """The shard's dead-replica sweep, when one is owed; a stop leaves its marker set for the
    next pass."""
    if not (shard.sweep_pending or done.segments_unmounted > 0 or done.segments_drained > 0) or worker.stopping():
        return
    worker.renew(shard.index)

    def keep_going(_scanned: int) -> bool:
        if worker.stopping():
            return False
        worker.renew(shard.index)
        return True

    done.swept_objects += worker.master.sweep_shard(shard.index, keep_going)


def evict(worker: "Worker", shard: ClaimedShard, done: WorkerPass) -> None:
    while True:
        step = worker.master.evict_step(shard.index, worker.step_units)
        done.eviction_steps += 1
        done.evicted_units += step.units
        done.evicted_objects += step.objects
        done.evicted_bytes += step.bytes
        done.evict_queued += step.queued
        if step.state != "more" or worker.stopping():
            worker.note_eviction_state(shard.index, step)
            return
        worker.renew(shard.index)


def radix(worker: "Worker", shard: ClaimedShard, done: WorkerPass) -> None:
    """The radix index (only when enable_radix_tree): deliver the shard's outbox (unlinks that
    eviction just wrote make their parents candidates), then one bounded reconciliation call
    (empty nodes past the grace period, phantom children), resuming where the last pass stopped.
    A walk over the shard's nodes starts at most every radix_walk_every_ms of store time after
    the last one ended: it is a repair, and a walk on every pass would cost each pass about
    three calls a node it looks at."""
    master = worker.master
    if not master.config.enable_radix_tree or worker.stopping():
        return
    done.radix_outbox_applied += master.drain_radix_outbox([shard.index])
    cursor = worker.radix_cursors.get(shard.index, 0)
    if cursor == 0 and shard.now_ms < worker.radix_next_walk_ms.get(shard.index, 0):
        return
    worker.renew(shard.index)
    cursor, dropped, phantoms = master.reconcile_radix(shard.index, worker.radix_grace_ms, cursor)
    worker.radix_cursors[shard.index] = cursor
    if cursor == 0:  # the walk is done
        worker.radix_next_walk_ms[shard.index] = shard.now_ms + worker.radix_walk_every_ms
    done.radix_nodes_dropped += dropped
    done.radix_phantoms_removed += phantoms
def redeliver_offload(worker: "Worker", shard: ClaimedShard, done: WorkerPass) -> None:
    """Offload tasks whose deadline passed end as failures: queued again (HIGH always) or
    dropped and counted (`mc_offload_sweep`, until a call finds fewer than `batch`)."""
    while True:
        timed_out, _, _ = worker.transport.call("mc_offload_sweep", shard.index, worker.batch)
        done.offload_timed_out += timed_out
        if timed_out < worker.batch or worker.stopping():
            return
        worker.renew(shard.index)


def _oldest_score(reply: object) -> float | None:
    """The score of ZRANGE key 0 0 WITHSCORES ([member, score], or [[member, score]] in RESP3)."""
    flat: list = []

    def walk(x: object) -> None:
        if isinstance(x, (list, tuple)):
            for y in x:
                walk(y)
        else:
            flat.append(x)
    walk(reply)
    try:
        return float(flat[1]) if len(flat) >= 2 else None
    except (TypeError, ValueError):
        return None


def reap_gateway_segments(worker: "Worker", shard: ClaimedShard, done: WorkerPass) -> None:
    """Shard 0 only: segments a Mooncake gateway recorded that are no longer mounted (their
    client expired) lose their facts and their transfer-engine metadata (`mc_gw_reap`)."""
    while shard.index == 0 and not worker.stopping():
        reaped = worker.transport.call("mc_gw_reap", 0, worker.batch)
        done.gateway_segments_reaped += reaped
        if reaped < worker.batch:
            return
        worker.renew(shard.index)


def finish_drains(worker: "Worker", shard: ClaimedShard, done: WorkerPass) -> None:
    """Shard 0 only: gracefully unmounting segments whose slices are all empty or past their
    deadline are unmounted on every shard (SegmentsApi.finish_drains), a batch at a time."""
    while shard.index == 0 and not worker.stopping():
        finished = worker.master.finish_drains()
        done.segments_drained += finished
        if finished < DRAIN_BATCH:
            return
        worker.renew(shard.index)


# The loops of one pass over a claimed shard, in order.
STEPS: list[Step] = [
    Step("discard_puts", discard_puts),
    Step("expire_clients", expire_clients),
    Step("finish_drains", finish_drains),
    Step("sweep_replicas", sweep_replicas),
    Step("reap_gateway_segments", reap_gateway_segments),
    Step("redeliver_offload", redeliver_offload),
    Step("evict", evict),
    Step("radix", radix),
]


class Worker:
    def __init__(self, master: Master, worker_id: str | None = None, claim_ttl_ms: int | None = None,
                 step_units: int = EVICT_STEP_UNITS, batch: int = 32, steps: Sequence[Step] | None = None):
        if not 1 <= step_units <= MAX_BATCH or not 1 <= batch <= MAX_BATCH:
            raise ValueError(f"step_units and batch must be in [1, {MAX_BATCH}]")
        if claim_ttl_ms is None:
            # a dead worker's shards are taken over within its claim TTL: keep that below
            # client_ttl / 2, or the store would restart its watch of client silence
            # (mc_expire_clients) at every takeover and never expire a dead client
            claim_ttl_ms = max(100, min(5000, master.config.client_ttl // 4))
        if claim_ttl_ms < 1:
            raise ValueError("claim_ttl_ms must be > 0")
        self.master = master
        self.transport = master.transport
        self.worker_id = worker_id or default_worker_id()
        self.claim_ttl_ms = claim_ttl_ms
        self.step_units = step_units
        self.batch = batch
        self.steps = list(STEPS if steps is None else steps)
        self._stop: threading.Event | None = None
        self._blocked: set[int] = set()  # shards whose eviction is blocked (warned once)
        self.pass_count = 0  # passes run by this object, and their wall time (metrics)
        self.pass_seconds_total = 0.0
        self.radix_cursors: dict[int, int] = {}  # shard -> where the radix reconciliation walk resumes
        self.radix_grace_ms = RADIX_GRACE_MS
        self.radix_walk_every_ms = RADIX_WALK_EVERY_MS
        self.radix_next_walk_ms: dict[int, int] = {}  # shard -> store time its next walk may start
        self._unpublished: dict[int, _Unpublished] = {}  # shard -> passes not yet in its <P>:metrics
        self._published_at: dict[int, int] = {}  # shard -> store time of the last pass published

    # ---- claims ----------------------------------------------------------------------
    # An idle store should not be written to on every pass (each write is AOF and replication
    # traffic): a pass reads first, then claims (a write: mc_claim sets P:worker) only the shards
    # whose claim is free, run out, or ours with at most half its TTL left, and runs
    # mc_expire_clients (which writes P.clients_checked_at) only when it has something to do.
    # mc_claim stays the judge: a read that says "ours" is only trusted while more than half
    # the TTL is left, which no other worker can take.
    _READS = 5  # replies per shard of the pass's first pipeline

    def _claim_all(self) -> dict[int, ClaimedShard]:
        """The shards we hold for this pass (claimed now, or held with more than half the TTL left)."""
        t = self.transport
        r = t.run([c for shard, k in enumerate(t.keys)
                   for c in (t.command("mc_now", shard), ("GET", k.worker), ("GET", k.sweep_pending),
                             ("ZRANGE", k.clients, 0, 0, "WITHSCORES"), ("HGET", k.P, "clients_checked_at"))])
        views, claim = {}, []
        for shard in range(t.count):
            now, holder, sweep, oldest, checked = r[self._READS * shard:self._READS * (shard + 1)]
            now = int(now)
            views[shard] = (now, sweep is not None, self._expire_due(now, oldest, checked))
            state = self._claim_state(holder, now)
            if state == "claim":
                claim.append(shard)
            elif state != "ours":
                del views[shard]  # another worker's, still valid: mc_claim would say 0
        if claim:
            for shard, got in zip(claim, t.run([t.command("mc_claim", s, self.worker_id, self.claim_ttl_ms)
                                                for s in claim])):
                if got != 1:
                    del views[shard]
        return {shard: ClaimedShard(shard, now, sweep, due) for shard, (now, sweep, due) in views.items()}

    def _claim_state(self, holder: bytes | None, now: int) -> str:
        """"ours" (held with more than half the TTL left: no call), "theirs" (another worker's,
        not run out) or "claim" (free, run out, ours and due for renewal, or unreadable)."""
        if holder is None:
            return "claim"
        who, _, until = holder.rpartition(b" ")
        if not until.isdigit():
            return "claim"
        left = int(until) - now
        if who != self.worker_id.encode():
            return "theirs" if left > 0 else "claim"
        return "ours" if 2 * left > self.claim_ttl_ms else "claim"

    def _expire_due(self, now: int, oldest: object, checked: bytes | None) -> bool:
        """Whether mc_expire_clients has something to do: a client whose last ping is more than
        client_ttl old, or the store's watch of client silence (P.clients_checked_at) needs
        its refresh, every client_ttl / 8: a watch is broken by a gap over client_ttl / 2
        between two calls, which a dead worker's claim (up to client_ttl / 4) plus this refresh
        interval stays under."""
        ttl = self.master.config.client_ttl
        ping = _oldest_score(oldest)
        if ping is not None and ping < now - ttl:
            return True
        if checked is None or not checked.isdigit():
            return True
        return not 0 <= now - int(checked) < max(1, ttl // 8)

    def renew(self, shard: int) -> None:
        """Extend our claim on `shard` (between two calls of a step); raises if it was lost."""
        if self.transport.call("mc_claim", shard, self.worker_id, self.claim_ttl_ms) != 1:
            raise _ClaimLost()

    def release_all(self) -> int:
        """Give up our claims (so another worker can take over at once); returns how many."""
        return sum(1 for r in self.transport.each("mc_release_claim", self.worker_id) if r == 1)

    # ---- one pass --------------------------------------------------------------------
    def run_once(self) -> WorkerPass:
        started = time.perf_counter()
        try:
            return self._run_once()
        finally:  # this process's pass durations, for its metrics
            self.pass_count += 1
            self.pass_seconds_total += time.perf_counter() - started

    def _run_once(self) -> WorkerPass:
        total = WorkerPass()
        claimed = self._claim_all()
        for index in self.transport.spread(claimed):  # on a cluster: taking turns on the nodes
            shard = claimed[index]
            if self.stopping():
                break
            total.shards_claimed += 1
            done = WorkerPass()
            try:
                for step in self.steps:
                    step.run(self, shard, done)
            except _ClaimLost:
                log.warning("shard %d: worker %s lost its claim mid-pass", index, self.worker_id,
                            extra=self._fields(index))
            finally:
                total.add(done)
                self._publish(index, shard.now_ms, done)
            if done.did_work():  # one line per shard that had work: what was done there
                counts = done.counts()
                log.info("shard %d: %s", index, " ".join(f"{k}={v}" for k, v in counts.items()),
                         extra=self._fields(index, counts))
        log.debug("worker %s pass: %s", self.worker_id, total)
        return total

    def _fields(self, shard: int, counts: dict | None = None) -> dict:
        """Structured fields of a log record (--log-format json prints them)."""
        return {"shard": shard, "worker": self.worker_id, **({"counts": counts} if counts else {})}

    def note_eviction_state(self, shard: int, step: EvictionStep) -> None:
        """Warn once when a shard's eviction becomes blocked (over target, nothing evictable)."""
        if step.state == "blocked" and shard not in self._blocked:
            log.warning("shard %d: eviction blocked (used %d > target %d, nothing evictable)",
                        shard, step.used_bytes, step.target_bytes, extra=self._fields(shard))
            self._blocked.add(shard)
        elif step.state != "blocked":
            self._blocked.discard(shard)

    def _publish(self, shard: int, now: int, done: WorkerPass) -> None:
        """Add a pass to the shard's metrics (<P>:metrics). A pass that did work is published at
        once; idle passes are counted here and published together, when METRICS_EVERY_MS of
        store time have passed since the last publication (and when the worker stops), so that
        an idle store is not written to on every pass."""
        pending = self._unpublished.setdefault(shard, _Unpublished())
        pending.passes += 1
        pending.counts.add(done)
        pending.last_pass_ms = now
        last = self._published_at.get(shard)
        if done.did_work() or last is None or not 0 <= now - last < METRICS_EVERY_MS:
            self._send_metrics(shard)

    def _send_metrics(self, shard: int) -> None:
        pending = self._unpublished.get(shard)
        if pending is None or not pending.passes:
            return
        key = self.transport.keys[shard].metrics
        commands = [("HSET", key, "last_pass_ms", pending.last_pass_ms, "last_worker", self.worker_id),
                    ("HINCRBY", key, "passes_total", pending.passes)]
        commands += [("HINCRBY", key, field, getattr(pending.counts, attr)) for field, attr in _TOTALS.items()
                     if getattr(pending.counts, attr)]
        try:
            self.transport.run(commands)
        except MasterError:  # metrics are best effort; these are sent with the next ones
            log.exception("shard %d: could not publish metrics", shard, extra=self._fields(shard))
            return
        del self._unpublished[shard]
        self._published_at[shard] = pending.last_pass_ms

    def flush_metrics(self) -> None:
        """Publish the passes not published yet (idle ones), e.g. before the worker stops."""
        for shard in list(self._unpublished):
            self._send_metrics(shard)

    # ---- the loop --------------------------------------------------------------------
    def run(self, stop: threading.Event, interval_s: float = 0.2) -> int:
        """Run passes until `stop` is set (e.g. by a SIGTERM handler, see stop_on_signals);
        the step in flight finishes first. Releases the claims on the way out. Returns the
        number of passes run. Redis errors are logged and retried on the next pass."""
        self._stop = stop
        passes = 0
        log.info("worker %s started on %d shard(s)", self.worker_id, self.master.shards)
        try:
            while not stop.is_set():
                try:
                    self.run_once()
                except (MasterError, redis.RedisError):
                    log.exception("worker %s: pass failed; retrying", self.worker_id)
                passes += 1
                stop.wait(interval_s)
        finally:
            self._stop = None
            try:
                self.flush_metrics()
                self.release_all()
            except (MasterError, redis.RedisError):
                log.exception("worker %s: could not release its claims", self.worker_id)
            log.info("worker %s stopped after %d pass(es)", self.worker_id, passes)
        return passes

    def stopping(self) -> bool:
        """Whether `run` was asked to stop: a step returns at its next chance."""
        return self._stop is not None and self._stop.is_set()


def stop_on_signals(stop: threading.Event,
                    signals: Iterable[signal.Signals] = (signal.SIGTERM, signal.SIGINT)) -> dict:
    """Make the given signals set `stop` (call from the main thread). Returns the previous
    handlers, for signal.signal to restore."""
    def on_signal(signum, frame):
        # set() from a helper thread: the handler may interrupt the main thread while it holds
        # the event's internal lock (inside Event.wait), and set() needs that lock.
        threading.Thread(target=stop.set, daemon=True).start()

    return {sig: signal.signal(sig, on_signal) for sig in signals}
