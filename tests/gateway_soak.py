"""Fault-injection soak through the Mooncake gateway, with Mooncake's own client.

Processes: a private Valkey (AOF, appendfsync always), GATEWAYS `mooncake-redis gateway`
processes, WORKERS `mooncake-redis worker` processes, PROVIDERS Mooncake clients that mount a
segment and hold the bytes, WRITERS Mooncake clients without memory of their own that put, read
back and remove, and READERS that get acknowledged keys (tests/gateway_soak_client.py). While
they run, one fault after the other, cycled, each followed by a wait for the writers to get more
puts acknowledged (traffic resumed):

    SIGKILL of a worker (a new one started), SIGKILL of a gateway (restarted on its port; its
    clients reconnect by themselves), SIGKILL of a writer (restarted: it reads its log),
    Valkey SIGKILL or SIGTERM and a restart from its AOF after 0.2-1.5 s down, Valkey paused
    (SIGSTOP) for 1-3 s.

No fault outlasts client_ttl (10 s) and no provider is killed: the bytes of every acknowledged
put stay in a live provider's memory, and there is no eviction pressure (the writers keep a
bounded number of keys, far below the segments), so an acknowledged object can only go missing
through a bug. At the end the writers and readers are killed and the workers stopped; then every
acknowledged key (put answered 0, no remove sent) is read back through the gateway with
Mooncake's client and compared byte for byte, checked through the Python API (present,
complete), every acknowledged remove is gone, and fsck must be clean.

    python tests/gateway_soak.py --seconds 600 [--dir DIR] [--seed N]

Prints the events, the figures and the problems (exit 1 if any). Also run, shorter, by
tests/test_gateway_soak.py (MOONCAKE_SOAK=1, MOONCAKE_SOAK_SECONDS)."""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gateway_soak_client import value_of  # noqa: E402

from mooncake_redis import Master, MasterConfig  # noqa: E402
from mooncake_redis.fsck import fsck  # noqa: E402
from mooncake_redis.server import EmbeddedValkey, free_port  # noqa: E402

CLIENT = str(HERE / "gateway_soak_client.py")
NAMESPACE = "soak"
SHARDS = 4
ENV = {**os.environ, "MC_TCP_BIND_ADDRESS": "127.0.0.1", "MC_STORE_MEMCPY": "0"}  # bytes go by TCP
FAULTS = ("kill_worker", "kill_gateway", "kill_writer", "restart_kill", "pause", "kill_gateway", "restart_term",
          "kill_writer")


def die_with_parent() -> None:
    """preexec_fn: SIGKILL the child when the driver dies, so nothing outlives a run."""
    import ctypes

    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):
        pass


class Soak:
    def __init__(self, out: Path, seed: int, gateways: int, workers: int, providers: int, writers: int,
                 readers: int, provider_mib: int):
        self.out = out
        self.rng = random.Random(seed)
        self.t0 = time.monotonic()
        self.events: list[str] = []
        self.faults: Counter = Counter()
        self.problems: list[str] = []
        self.valkey = EmbeddedValkey(data_dir=str(out / "valkey"), appendonly=True,
                                     extra_args=("--appendfsync", "always")).start()
        self.url = f"{self.valkey.url}?socket_timeout=2&socket_connect_timeout=2"
        Master.connect(self.valkey.url, MasterConfig(namespace=NAMESPACE, shards=SHARDS)).close()
        self.paused = False
        self.reported: set[int] = set()  # processes found exited by themselves
        self.spawned: Counter = Counter()
        self.ports = [free_port() for _ in range(gateways)]
        self.gateways = [self.spawn_gateway(i) for i in range(gateways)]
        self.workers = [self.spawn_worker() for _ in range(workers)]
        self.providers = [self.spawn_client("provider", i, provider_mib) for i in range(providers)]
        for p in self.providers:
            line = p.stdout.readline() if p.stdout else ""
            if line.strip() != "ready":
                raise RuntimeError(f"a provider did not start: {line!r}")
        self.writers = [self.spawn_client("writer", i) for i in range(writers)]
        self.readers = [self.spawn_client("reader", i) for i in range(readers)]
        self.note(f"started: {gateways} gateways, {workers} workers, {providers} providers of {provider_mib} MiB, "
                  f"{writers} writers, {readers} readers")

    def note(self, what: str) -> None:
        line = f"{time.monotonic() - self.t0:8.1f}s {what}"
        self.events.append(line)
        print(line, flush=True)

    # ---- processes --------------------------------------------------------------------------
    def log(self, name: str):
        self.spawned[name] += 1
        return open(self.out / f"{name}-{self.spawned[name]}.err", "wb")

    def spawn_gateway(self, i: int) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-m", "mooncake_redis.cli", "--redis", self.url, "--namespace",
                                 NAMESPACE, "gateway", "--rpc-port", str(self.ports[i]), "--metadata-port", "0"],
                                stdout=subprocess.PIPE, stderr=self.log(f"gateway{i}"), text=True,
                                preexec_fn=die_with_parent)
        line = proc.stdout.readline() if proc.stdout else ""
        if not line.startswith("mooncake gateway: rpc"):
            raise RuntimeError(f"gateway {i} did not start: {line!r}")
        return proc

    def spawn_worker(self) -> subprocess.Popen:
        path = self.out / f"worker-{self.spawned['worker'] + 1}.err"
        proc = subprocess.Popen([sys.executable, "-m", "mooncake_redis.cli", "--redis", self.url, "--namespace",
                                 NAMESPACE, "worker", "--interval", "0.2"], stdout=subprocess.DEVNULL,
                                stderr=self.log("worker"), preexec_fn=die_with_parent)
        self.wait_for(f"worker {proc.pid} started", lambda: "started on" in path.read_text())
        return proc

    def spawn_client(self, role: str, i: int, segment_mib: int = 0) -> subprocess.Popen:
        master = f"127.0.0.1:{self.ports[i % len(self.ports)]}"
        return subprocess.Popen([sys.executable, CLIENT, role, master, str(i), str(self.out), str(segment_mib)],
                                env=ENV, stdin=subprocess.PIPE if role == "provider" else subprocess.DEVNULL,
                                stdout=subprocess.PIPE if role == "provider" else subprocess.DEVNULL,
                                stderr=self.log(f"{role}{i}"), text=True, preexec_fn=die_with_parent)

    # ---- faults -----------------------------------------------------------------------------
    def fault(self, name: str) -> None:
        self.faults[name] += 1
        if name == "kill_worker":
            i = self.rng.randrange(len(self.workers))
            self.note(f"SIGKILL worker {self.workers[i].pid}; a new one")
            self.kill(self.workers[i])
            self.workers[i] = self.spawn_worker()
        elif name == "kill_gateway":
            i = self.rng.randrange(len(self.gateways))
            self.note(f"SIGKILL gateway {i} (pid {self.gateways[i].pid}); restart it on port {self.ports[i]}")
            self.kill(self.gateways[i])
            self.gateways[i] = self.spawn_gateway(i)
        elif name == "kill_writer":
            i = self.rng.randrange(len(self.writers))
            self.note(f"SIGKILL writer {i} (pid {self.writers[i].pid}); restart it")
            self.kill(self.writers[i])
            self.writers[i] = self.spawn_client("writer", i)
        elif name in ("restart_kill", "restart_term"):
            sig = signal.SIGKILL if name == "restart_kill" else signal.SIGTERM
            down = self.rng.uniform(0.2, 1.5)
            self.note(f"{sig.name} valkey, down {down:.1f}s, restart from its AOF")
            assert self.valkey.proc is not None
            self.valkey.proc.send_signal(sig)
            self.valkey.proc.wait(60)
            time.sleep(down)  # the outage itself
            self.valkey.start(timeout_s=60)
            self.note(f"valkey back (pid {self.valkey.proc.pid})")
        elif name == "pause":
            down = self.rng.uniform(1, 3)
            self.note(f"SIGSTOP valkey for {down:.1f}s")
            assert self.valkey.proc is not None
            self.valkey.proc.send_signal(signal.SIGSTOP)
            self.paused = True
            time.sleep(down)  # the outage itself
            self.valkey.proc.send_signal(signal.SIGCONT)
            self.paused = False
            self.note("SIGCONT valkey")

    @staticmethod
    def kill(proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            proc.kill()
        proc.wait()

    # ---- progress ---------------------------------------------------------------------------
    def acks(self) -> int:
        return sum(line.startswith("A ") for p in self.out.glob("writer-*.log") for line in p.read_text().splitlines())

    def wait_for(self, what: str, done, timeout_s: float = 120) -> bool:
        start = time.monotonic()
        while not done():
            if time.monotonic() - start > timeout_s:
                self.problems.append(f"no {what} within {timeout_s:.0f}s")
                self.note(f"NO {what} within {timeout_s:.0f}s")
                return False
            time.sleep(0.2)  # polling for progress, not waiting for a deadline
        return True

    def wait_traffic(self, puts: int) -> None:
        target = self.acks() + puts
        start = time.monotonic()
        if self.wait_for(f"{puts} more acknowledged puts", lambda: self.acks() >= target, timeout_s=180):
            self.note(f"+{puts} acknowledged puts (after {time.monotonic() - start:.1f}s)")

    def check_alive(self) -> None:
        for name, procs in (("gateway", self.gateways), ("worker", self.workers), ("provider", self.providers),
                            ("writer", self.writers), ("reader", self.readers)):
            for i, p in enumerate(procs):
                if p.poll() is not None and p.pid not in self.reported:
                    self.reported.add(p.pid)
                    self.problems.append(f"{name} {i} (pid {p.pid}) exited by itself with {p.returncode}")
                    if name == "provider":  # its bytes are gone with it: the check at the end says so
                        self.note(f"provider {i} exited with {p.returncode}")
                        continue
                    self.note(f"{name} {i} exited with {p.returncode}: restarted")
                    procs[i] = (self.spawn_gateway(i) if name == "gateway" else self.spawn_worker()
                                if name == "worker" else self.spawn_client(name, i))

    # ---- the end ----------------------------------------------------------------------------
    def outcomes(self) -> tuple[list[str], list[str], Counter]:
        """Keys that must be readable, keys that must be gone, and the log's counts."""
        counts: Counter = Counter()
        state: dict[str, str] = {}
        for path in sorted(self.out.glob("writer-*.log")):
            for line in path.read_text().splitlines():
                tag, _, key = line.partition(" ")
                counts[tag] += 1
                if tag == "A":
                    state[key] = "present"
                elif tag == "r":
                    state[key] = "unknown"  # a remove was sent: its outcome is known only from R / N
                elif tag == "R":
                    state[key] = "absent"
                elif tag in ("N", "W"):
                    self.problems.append(f"{'remove answered OBJECT_NOT_FOUND' if tag == 'N' else 'wrong bytes'} "
                                         f"for acknowledged key {key}")
        return (sorted(k for k, s in state.items() if s == "present"),
                sorted(k for k, s in state.items() if s == "absent"), counts)

    def finish(self) -> dict:
        for p in self.writers + self.readers:
            self.kill(p)
        self.note("writers and readers killed")
        for w in self.workers:
            w.send_signal(signal.SIGTERM)
        for w in self.workers:
            if w.wait(60) != 0:
                self.problems.append(f"worker {w.pid} exited with {w.returncode} on SIGTERM")
        self.note("workers stopped")
        must_have, must_not, counts = self.outcomes()
        (self.out / "verify-keys.txt").write_text("\n".join(must_have) + "\n")
        verify = subprocess.run([sys.executable, CLIENT, "verify", f"127.0.0.1:{self.ports[0]}", "99", str(self.out)],
                                env=ENV, capture_output=True, text=True, timeout=1800)
        try:
            seen = json.loads(verify.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            self.problems.append(f"the verifier failed: exit {verify.returncode} {verify.stderr[-2000:]}")
            seen = {"equal": 0, "missing": must_have, "wrong": []}
        if seen["missing"] or seen["wrong"]:
            self.problems.append(f"read back through the gateway: {len(seen['missing'])} of {len(must_have)} "
                                 f"acknowledged keys missing (e.g. {seen['missing'][:5]}), "
                                 f"{len(seen['wrong'])} with other bytes (e.g. {seen['wrong'][:5]})")
        self.note(f"read back {seen['equal']} of {len(must_have)} acknowledged keys, byte for byte")
        m = Master.connect(self.valkey.url, MasterConfig(namespace=NAMESPACE, shards=SHARDS))
        try:
            present = m.batch_exist_key(must_have) if must_have else []
            missing = [k for k, ok in zip(must_have, present) if not ok]
            if missing:
                self.problems.append(f"Python API: {len(missing)} acknowledged keys missing, e.g. {missing[:5]}")
            for key in self.rng.sample(must_have, min(300, len(must_have))):
                if key not in missing:
                    info = m.describe(key)
                    if info.status.value != "complete" or not info.replicas or info.size != len(value_of(key)):
                        self.problems.append(f"acknowledged key {key} is not complete: {info}")
            back = [k for k, ok in zip(must_not, m.batch_exist_key(must_not) if must_not else []) if ok]
            if back:
                self.problems.append(f"{len(back)} removed keys still stored, e.g. {back[:5]}")
            report = fsck(m)
            if not report.ok:
                self.problems.append(f"fsck: {report.summary()}")
            self.note(report.summary().splitlines()[0])
            usage = m.usage()
            worker_totals: Counter = Counter()
            for k in m.transport.keys:
                worker_totals.update({f.decode(): int(v) for f, v in m.redis.hgetall(k.metrics).items()
                                      if f.endswith(b"_total")})
        finally:
            m.close()
        readers = []
        for path in sorted(self.out.glob("reader-*.log")):
            lines = path.read_text().splitlines()
            if lines:
                readers.append(json.loads(lines[-1]))
        for r in readers:
            if r["wrong"] or r["absent_bad"]:
                self.problems.append(f"a reader got other bytes: {r}")
        # a key a reader missed twice, 3 s apart: read back at the end, or removed later by a remove
        # that found it (R), or its remove's outcome unknown; anything else was lost
        removed_ok = set(must_not)
        kept = set(must_have) - set(seen["missing"]) - set(seen["wrong"])
        judged: Counter = Counter()
        windows = []
        for r in readers:
            for key, at in r.pop("missed_twice", []):
                judged["read back at the end" if key in kept else "found by its remove" if key in removed_ok
                       else "remove outcome unknown" if key not in set(must_have) else "lost"] += 1
                windows.append(round(at - self.t0, 1))
        if judged["lost"]:
            self.problems.append(f"{judged['lost']} keys a reader missed twice are gone")
        self.note(f"keys a reader missed twice (3 s apart): {dict(judged)}; at (s) {windows[:40]}")
        return {"seconds": round(time.monotonic() - self.t0), "faults": dict(self.faults),
                "writer_log": dict(counts), "acknowledged_kept": len(must_have), "removed": len(must_not),
                "read_back_equal": seen["equal"], "readers": readers, "missed_twice": dict(judged),
                "usage": str(usage),
                "workers": dict(worker_totals), "problems": self.problems}

    def close(self) -> None:
        for p in self.writers + self.readers + self.workers:
            self.kill(p)
        for p in self.providers:
            if p.poll() is None and p.stdin:
                p.stdin.close()
        for p in self.providers:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                self.kill(p)
        for g in self.gateways:
            g.send_signal(signal.SIGTERM)
            try:
                g.wait(30)
            except subprocess.TimeoutExpired:
                self.kill(g)
        if self.paused and self.valkey.proc:
            self.valkey.proc.send_signal(signal.SIGCONT)
        self.valkey.stop()


def run(seconds: float, out: Path, seed: int = 1, gateways: int = 2, workers: int = 2, providers: int = 2,
        writers: int = 2, readers: int = 1, provider_mib: int = 64) -> dict:
    soak = Soak(out, seed, gateways, workers, providers, writers, readers, provider_mib)
    try:
        soak.wait_traffic(50)
        end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < end:
            soak.fault(FAULTS[i % len(FAULTS)])
            i += 1
            soak.check_alive()
            soak.wait_traffic(soak.rng.randint(30, 120))
            time.sleep(soak.rng.uniform(2, 8))  # fault-free running between faults (wall time on purpose)
        soak.note(f"{i} faults in {seconds:.0f}s")
        return soak.finish()
    finally:
        soak.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=600, help="length of the faulted run (default 600)")
    ap.add_argument("--dir", help="where the logs and the Valkey data go (default: a new temporary directory)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--writers", type=int, default=2)
    ap.add_argument("--gateways", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    out = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="gateway-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"gateway soak: {args.seconds:.0f}s, logs in {out}", flush=True)
    summary = run(args.seconds, out, args.seed, gateways=args.gateways, workers=args.workers, writers=args.writers)
    print(json.dumps(summary, indent=2))
    sys.exit(1 if summary["problems"] else 0)


if __name__ == "__main__":
    main()
