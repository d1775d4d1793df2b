"""Soak: writers, a reader and workers run against a private Valkey (AOF, appendfsync always)
while the test injects faults: Valkey paused (SIGSTOP/SIGCONT), a worker SIGKILLed and replaced,
Valkey killed or stopped and restarted on the same port and data directory. At the end fsck is
clean, every acknowledged write is present and complete, and every acknowledged remove or revoke
is gone. No live client may have been expired: every outage is shorter than client_ttl, or, in
the long-outage case, the store must not hold an outage against the clients. One client mounts a
segment, puts an object and never pings: it must be expired, its segment and object gone.

There is no eviction pressure: segments are far larger than what is ever put, so an
acknowledged object can only go missing through a fault (or a bug), never by design.

Opt-in, real time (the store clock runs): MOONCAKE_SOAK=1 python -m pytest -q -s tests/test_soak.py
(MOONCAKE_SOAK_SECONDS, default 120, at least 30, is the length of the faulted run;
MOONCAKE_SOAK_SEED varies the fault timings)."""
from __future__ import annotations

import ctypes
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import redis

from mooncake_redis import ErrorCode, Master, MasterConfig, MasterError, ReplicateConfig
from mooncake_redis.fsck import fsck
from mooncake_redis.keys import object_key, shard_of
from mooncake_redis.server import EmbeddedValkey

from helpers import all_shard_keys

HERE = Path(__file__).parent
ROOT = HERE.parent
SECONDS = float(os.environ.get("MOONCAKE_SOAK_SECONDS", "120"))
SHARDS = 4
SILENT = "silent"  # the client that stops pinging at once

pytestmark = pytest.mark.skipif(os.environ.get("MOONCAKE_SOAK") != "1",
                                reason="soak test: set MOONCAKE_SOAK=1 (and MOONCAKE_SOAK_SECONDS)")


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGKILL when the test process dies, so nothing outlives a run."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):
        pass


class Soak:
    """The processes of one soak run and the faults done to them, with a log of both."""

    def __init__(self, tmp: Path, client_ttl_ms: int, writers: int = 2, readers: int = 1, workers: int = 2):
        self.tmp = tmp
        self.out = tmp / "clients"
        self.out.mkdir()
        self.valkey = EmbeddedValkey(data_dir=str(tmp / "valkey"), appendonly=True,
                                     extra_args=("--appendfsync", "always"))
        self.valkey.start()
        self.url = f"{self.valkey.url}?socket_timeout=2&socket_connect_timeout=2"
        self.ping_ms = client_ttl_ms // 6  # well within client_ttl, as an engine pings
        self.paused = False
        self.events: list[str] = []
        self.t0 = time.monotonic()
        m = Master.connect(self.valkey.url, MasterConfig(shards=SHARDS, client_ttl=client_ttl_ms))
        # a client that never pings: expiry must still work, and take its segment and object along
        m.mount_segment(SILENT + "-seg", 1 << 30, SILENT, base=1 << 41)
        m.put_start(SILENT, SILENT + "-obj", 4096, ReplicateConfig(preferred_segments=(SILENT + "-seg",)))
        m.put_end(SILENT, SILENT + "-obj")
        m.close()
        self.n_workers_spawned = 0
        self.workers = [self.spawn_worker() for _ in range(workers)]
        self.clients = [self.spawn_client("writer", i) for i in range(writers)]
        self.clients += [self.spawn_client("reader", writers + i) for i in range(readers)]

    def note(self, what: str) -> None:
        self.events.append(f"{time.monotonic() - self.t0:7.2f}s {what}")

    def spawn_worker(self) -> subprocess.Popen:
        log = open(self.tmp / f"worker-{self.n_workers_spawned}.log", "wb")
        self.n_workers_spawned += 1
        return subprocess.Popen([sys.executable, "-m", "cli", "--redis", self.url, "worker", "--interval", "0.1"],
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)

    def spawn_client(self, role: str, index: int) -> subprocess.Popen:
        # the test stops them with SIGTERM; the run length is only a bound
        return subprocess.Popen([sys.executable, str(HERE / "soak_client.py"), role, self.url, f"{role}-{index}",
                                 str(index), str(SECONDS + 600), str(self.ping_ms), str(self.out)],
                                stdout=subprocess.PIPE, stderr=open(self.tmp / f"{role}-{index}.err", "wb"),
                                text=True, preexec_fn=die_with_parent)

    # ---- faults -----------------------------------------------------------------------------
    def pause(self, seconds: float) -> None:
        self.note(f"SIGSTOP valkey for {seconds:.1f}s")
        self.valkey.proc.send_signal(signal.SIGSTOP)
        self.paused = True
        time.sleep(seconds)  # the outage itself
        self.resume()

    def resume(self) -> None:
        if self.paused:
            self.valkey.proc.send_signal(signal.SIGCONT)
            self.paused = False
            self.note("SIGCONT valkey")

    def kill_worker(self, rng: random.Random) -> None:
        i = rng.randrange(len(self.workers))
        self.note(f"SIGKILL worker {self.workers[i].pid}; start a new one")
        self.workers[i].kill()
        self.workers[i].wait()
        self.workers[i] = self.spawn_worker()
        # a worker that cannot reach Redis when it starts exits 2: let it start before the next fault
        log = self.tmp / f"worker-{self.n_workers_spawned - 1}.log"
        self.wait_for(f"worker {self.workers[i].pid} started", lambda: "started on" in log.read_text())

    def restart(self, sig: signal.Signals, down_s: float) -> None:
        self.note(f"{sig.name} valkey, down {down_s:.1f}s, restart from AOF")
        self.valkey.proc.send_signal(sig)
        self.valkey.proc.wait(30)
        time.sleep(down_s)  # the outage itself
        self.valkey.start(timeout_s=60)  # same port and data directory
        r = redis.Redis.from_url(self.valkey.url)
        try:  # the store came back: configuration and functions
            assert r.hgetall(f"mc:{{mc:0}}:config"), "the store did not come back after a restart"
            assert r.function_list(library="mooncake"), "the functions did not come back after a restart"
        finally:
            r.close()
        self.note(f"valkey back (pid {self.valkey.proc.pid})")

    def wait_silent_expired(self, timeout_s: float) -> None:
        """Fault-free time until the silent client is expired on every shard (bounded). Each
        fault may restart the store's watch of client silence (a killed worker's shards go
        unwatched until its claim runs out), so the expiry may be owed to this quiet end."""
        r = redis.Redis.from_url(self.valkey.url)
        start = time.monotonic()
        try:
            while any(r.zscore(f"mc:{{mc:{i}}}:clients", SILENT) is not None for i in range(SHARDS)):
                if time.monotonic() - start > timeout_s:
                    self.note("silent client NOT expired")  # verify() reports it
                    return
                time.sleep(0.2)  # waiting for the workers to do it, not for a deadline of ours
        finally:
            r.close()
        self.note(f"silent client expired (waited {time.monotonic() - start:.1f}s)")

    # ---- progress -----------------------------------------------------------------------
    def acks(self) -> int:
        """Puts the writers have acknowledged so far (the A lines of their logs)."""
        return sum(line.startswith("A ") for p in self.out.glob("writer-*.log") for line in p.read_text().splitlines())

    def wait_for(self, what: str, done, timeout_s: float = 90) -> None:
        """Poll until done() holds (traffic or worker passes observed), within timeout_s."""
        start = time.monotonic()
        while not done():
            if time.monotonic() - start > timeout_s:
                raise AssertionError(f"no {what} within {timeout_s:.0f}s; events: {self.events[-6:]}")
            time.sleep(0.2)  # polling for progress, not waiting for a deadline
        self.note(f"{what} (after {time.monotonic() - start:.1f}s)")

    def wait_traffic(self, puts: int) -> None:
        """Until the writers acknowledged `puts` more puts: the clients work (again)."""
        target = self.acks() + puts
        self.wait_for(f"{puts} more acknowledged puts", lambda: self.acks() >= target)

    def wait_worker_passes_after(self, ms: int) -> None:
        """Until a worker pass over every shard began at store time `ms` or later."""
        r = redis.Redis.from_url(self.valkey.url)
        try:
            self.wait_for(f"worker passes after store time {ms}", lambda: all(
                int(r.hget(f"mc:{{mc:{i}}}:metrics", "last_pass_ms") or 0) >= ms for i in range(SHARDS)))
        finally:
            r.close()

    def now_ms(self) -> int:
        r = redis.Redis.from_url(self.valkey.url)
        try:
            sec, usec = r.time()
            return sec * 1000 + usec // 1000
        finally:
            r.close()

    def check_alive(self) -> None:
        for p in self.workers + self.clients:
            assert p.poll() is None, f"process {p.args[:4]} exited early with {p.returncode}"

    # ---- the end ----------------------------------------------------------------------------
    def stop(self) -> list[dict]:
        """Stop workers first (so no client can be expired while the clients wind down), then
        the clients; returns the clients' counters."""
        self.resume()
        self.check_alive()
        for w in self.workers:
            w.send_signal(signal.SIGTERM)
        for w in self.workers:
            assert w.wait(60) == 0, f"worker {w.pid} exited with {w.returncode}"
        for c in self.clients:
            c.send_signal(signal.SIGTERM)
        summaries = []
        for c in self.clients:
            out, _ = c.communicate(timeout=120)
            assert c.returncode == 0, f"client {c.args[4]} exited with {c.returncode}: {self.stderr(c)}"
            summaries.append(json.loads(out.strip().splitlines()[-1]))
        return summaries

    def stderr(self, c: subprocess.Popen) -> str:
        return (self.tmp / f"{c.args[4]}.err").read_text()[-3000:]

    def kill_all(self) -> None:
        if self.valkey.proc and self.valkey.proc.poll() is None:
            self.resume()
        for p in self.workers + self.clients:
            if p.poll() is None:
                p.kill()
                p.wait()
        self.valkey.stop()

    def outcomes(self) -> tuple[set[str], set[str], Counter]:
        """From the writers' logs: keys that must be present, keys that must be absent, counts."""
        must_have, must_not, counts = set(), set(), Counter()
        for path in sorted(self.out.glob("writer-*.log")):
            state: dict[str, str] = {}
            for line in path.read_text().splitlines():
                tag, _, key = line.partition(" ")
                counts[tag] += 1
                if tag in ("A", "K"):
                    state[key] = "present"
                elif tag in ("r", "N"):
                    state[key] = "unknown"  # the remove's outcome is not known
                elif tag in ("R", "V"):
                    state[key] = "absent"
            must_have |= {k for k, s in state.items() if s == "present"}
            must_not |= {k for k, s in state.items() if s == "absent"}
        return must_have, must_not, counts


def verify(soak: Soak, summaries: list[dict]) -> None:
    """Every check runs; the test fails with all the problems found."""
    m = Master.connect(soak.valkey.url)
    problems: list[str] = []
    try:
        must_have, must_not, counts = soak.outcomes()
        metrics = Counter()
        for p in all_shard_keys(m):
            metrics.update({k.decode(): int(v) for k, v in m.redis.hgetall(p.metrics).items()
                            if k.endswith(b"_total")})
        print(f"\nsoak: {len(must_have)} acknowledged keys to find, {len(must_not)} removed/revoked; "
              f"log lines {dict(counts)}")
        for s in summaries:
            print("soak client:", json.dumps(s))
        print("soak events:\n  " + "\n  ".join(soak.events))
        print("soak workers:", dict(metrics))
        print("soak usage:", m.usage())
        watch = [m.redis.hget(p.P, "clients_watched_since") for p in all_shard_keys(m)]
        print("soak: client silence watched for (s):",
              [None if w is None else (m.now_ms() - int(w)) / 1000 for w in watch])

        if counts["A"] < 100:
            problems.append("the writers acknowledged almost nothing: the soak did not run")
        problems += [f"{s['name']} unexpected error: {e}" for s in summaries for e in s["unexpected_errors"]]
        remounts = {s["name"]: s.get("remounts", 0) for s in summaries}
        if any(remounts.values()) or metrics["clients_expired_total"] > SHARDS:
            problems.append(f"live clients were expired: {metrics['clients_expired_total']} expiries "
                            f"(the silent client accounts for {SHARDS}), remounts {remounts}")
        if counts["N"]:
            problems.append(f"{counts['N']} removes of acknowledged keys answered OBJECT_NOT_FOUND (lost objects)")
        # the silent client was expired on every shard; its segment and its object went with it
        if any(m.redis.zscore(p.clients, SILENT) is not None for p in all_shard_keys(m)):
            problems.append("the silent client was never expired")
        if any(seg["name"] == SILENT + "-seg" for seg in m.segments()):
            problems.append("the silent client's segment is still mounted")
        try:
            m.describe(SILENT + "-obj")
            problems.append("the silent client's object is still stored")
        except MasterError as exc:
            if exc.code != ErrorCode.OBJECT_NOT_FOUND:
                raise

        report = fsck(m)
        if not report.ok:
            problems.append(f"fsck: {report}")

        keys = sorted(must_have)
        present = m.batch_exist_key(keys)
        missing = [k for k, ok in zip(keys, present) if not ok]
        if missing:
            details = []
            for k in missing[:5]:
                try:
                    details.append(f"{k}: {m.describe(k)}")
                except Exception as exc:  # noqa: BLE001
                    details.append(f"{k}: {exc}")
            problems.append(f"{len(missing)} of {len(keys)} acknowledged keys missing, e.g. {details}")
        for k in random.Random(0).sample(keys, min(200, len(keys))):
            if k not in missing:
                info = m.describe(k)
                if info.status.value != "complete" or not info.replicas:
                    problems.append(f"acknowledged key {k} is not complete: {info}")

        pipe = m.redis.pipeline(transaction=False)
        gone = sorted(must_not)
        for k in gone:
            pipe.exists(object_key(m.ns, shard_of(k.encode(), m.shards), "default", k.encode()))
        back = [k for k, n in zip(gone, pipe.execute()) if n]
        if back:
            problems.append(f"{len(back)} removed or revoked keys are still stored: {back[:10]}")
    finally:
        m.close()
    assert not problems, "\n".join(problems)


@pytest.mark.timeout(SECONDS + 300)
def test_soak_short_faults(tmp_path):
    """Faults shorter than client_ttl (10 s): pauses of 1-4 s, worker kills, Valkey SIGKILL or
    SIGTERM with 0.2-1.5 s down, cycled until SECONDS have passed, and after each the writers
    must acknowledge 20-100 more puts before the next; then quiet until the silent client is
    expired."""
    rng = random.Random(int(os.environ.get("MOONCAKE_SOAK_SEED", "1")))
    soak = Soak(tmp_path, client_ttl_ms=10_000)
    try:
        end = time.monotonic() + SECONDS
        faults = ["pause", "kill_worker", "restart_kill", "pause", "kill_worker", "restart_term"]
        i = 0
        soak.wait_traffic(50)  # the clients mount and write a little first
        while time.monotonic() < end and i < 1000:
            fault = faults[i % len(faults)]
            i += 1
            if fault == "pause":
                soak.pause(rng.uniform(1, 4))
            elif fault == "kill_worker":
                soak.kill_worker(rng)
            else:
                soak.restart(signal.SIGKILL if fault == "restart_kill" else signal.SIGTERM, rng.uniform(0.2, 1.5))
            soak.check_alive()
            soak.wait_traffic(rng.randint(20, 100))  # between faults: the clients work again
        soak.note(f"{i} faults")
        soak.wait_silent_expired(30)  # client_ttl + claim_ttl + a margin
        summaries = soak.stop()
        verify(soak, summaries)
    finally:
        soak.kill_all()


@pytest.mark.timeout(300)
def test_soak_outage_longer_than_client_ttl(tmp_path):
    """Valkey paused, then down, each for 3 x client_ttl (3 s here) while clients keep trying,
    with traffic acknowledged before, between and after. The clients pinged until the outage
    began, so the store must not expire them for it, not even in worker passes more than
    client_ttl after it (only the silent client, which never pings)."""
    ttl = 3_000
    soak = Soak(tmp_path, client_ttl_ms=ttl)
    try:
        # the soak runs on the real clock on purpose: it injects real process faults (pauses,
        # kills, restarts) whose length is wall time; between them it waits on observed progress
        soak.wait_traffic(50)  # traffic before the first outage
        soak.pause(3 * ttl / 1000)
        soak.wait_traffic(50)  # traffic between the two outages
        soak.restart(signal.SIGKILL, 3 * ttl / 1000)
        # worker passes well past client_ttl after the outage: a store that held the outage
        # against the clients would have expired them by then
        soak.wait_worker_passes_after(soak.now_ms() + 2 * ttl)
        soak.wait_silent_expired(15)
        summaries = soak.stop()
        verify(soak, summaries)
    finally:
        soak.kill_all()
