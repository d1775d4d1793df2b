"""A client process for test_soak: an engine-like writer or reader on a store whose Valkey is
being paused, killed and restarted.

Usage: python soak_client.py ROLE URL NAME INDEX SECONDS PING_MS OUT_DIR

Both roles mount a segment of their own and ping it from a thread every PING_MS, remounting on
NEED_REMOUNT, as an engine does. An error a fault can cause (connection lost, timeout,
BUSY/LOADING, a MasterError with an unknown-outcome code) means "not acknowledged": back off and
carry on. Any other error is counted as unexpected. The process stops after SECONDS or on
SIGTERM and prints one JSON line of counters.

writer: puts of unique keys (single, batch, grouped, soft/hard pinned, all preferring its own
  segment), revokes and removes of its own keys. A single put's put_start and put_end are
  retried after a fault error (the store answers a retried put_start with the replicas it
  already allocated). It appends one line per outcome to
  OUT_DIR/NAME.log, always after the reply arrived:
    A key  put_end answered OK: acknowledged
    r key  a remove of the key is about to be sent (its outcome is unknown until R/K/N)
    R key  remove answered OK          K key  remove refused (leased): still there
    N key  remove answered OBJECT_NOT_FOUND: the acknowledged object was gone before its remove
           (removes are not retried, so this is a lost object; the test reports it)
    V key  put_revoke answered OK      M      the ping said NEED_REMOUNT: remounted
reader: reads random keys the writers acknowledged (from their logs) and missing keys."""
from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import redis

from mooncake_redis import ErrorCode, Master, MasterError, ReplicateConfig, SoftPinAction

SEG_SIZE = {"writer": 1 << 40, "reader": 1 << 30}  # no eviction pressure: far more than is ever put
MAX_ACKED = 10_000  # a writer keeps at most about this many objects (so a long soak's AOF stays small)


def fault_error(exc: BaseException) -> bool:
    """An error that a Valkey fault can cause: the call's outcome is unknown."""
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError, OSError)):
        return True  # includes BusyLoadingError (LOADING after a restart)
    if isinstance(exc, redis.ResponseError):
        return str(exc).startswith(("BUSY", "LOADING"))
    if isinstance(exc, MasterError):  # an unknown-outcome code, should the client grow one
        return any(word in exc.code.name for word in ("UNKNOWN", "TIMEOUT", "UNAVAILABLE"))
    return False


class Client:
    def __init__(self, role: str, url: str, name: str, index: int, seconds: float, ping_ms: int, out: Path):
        self.role, self.url, self.name = role, url, name
        self.segment = f"{name}-seg"
        self.base = (index + 1) << 42
        self.deadline = time.monotonic() + seconds
        self.ping_s = ping_ms / 1000
        self.out = out
        self.stop = threading.Event()
        self.counts: Counter[str] = Counter()
        self.unexpected: list[str] = []
        self.lock = threading.Lock()
        self.log = open(out / f"{name}.log", "a", buffering=1) if role == "writer" else None
        self.rng = random.Random(index)
        self.master = self._connect()

    def _connect(self) -> Master:
        for _ in range(200):  # Valkey may be down for a moment
            try:
                return Master.connect(self.url)
            except Exception as exc:  # noqa: BLE001 - classified below
                if not fault_error(exc):
                    raise
                time.sleep(0.1)
        raise RuntimeError("could not connect")

    def record(self, line: str) -> None:
        if self.log:
            with self.lock:
                self.log.write(line + "\n")

    def error(self, what: str, exc: BaseException) -> None:
        with self.lock:
            if fault_error(exc):
                self.counts["fault_errors"] += 1
            else:
                self.counts["unexpected"] += 1
                if len(self.unexpected) < 20:
                    self.unexpected.append(f"{what}: {type(exc).__name__}: {exc}")
        time.sleep(self.rng.uniform(0.05, 0.3))  # back off

    def running(self) -> bool:
        return not self.stop.is_set() and time.monotonic() < self.deadline

    def retried(self, call, *args):
        """call(*args), tried again (up to 3 times) after a fault error, as an engine retries."""
        for attempt in range(3):
            try:
                return call(*args)
            except Exception as exc:  # noqa: BLE001
                if attempt == 2 or not fault_error(exc):
                    raise
                self.counts["retries"] += 1
                time.sleep(self.rng.uniform(0.05, 0.3))

    # ---- liveness, as an engine keeps it ----------------------------------------------------
    def mount(self) -> None:
        self.master.mount_segment(self.segment, SEG_SIZE[self.role], self.name, base=self.base)

    def pinger(self) -> None:
        while not self.stop.is_set():
            try:
                if self.master.ping(self.name) == "NEED_REMOUNT":
                    self.counts["remounts"] += 1
                    self.record("M")
                    self.mount()
                self.counts["pings"] += 1
            except Exception as exc:  # noqa: BLE001
                self.error("ping", exc)
                continue  # ping again at once after the back-off
            self.stop.wait(self.ping_s)

    # ---- writer -------------------------------------------------------------------------------
    def write_once(self, n: int, acked: list[str]) -> None:
        m, rng, me = self.master, self.rng, self.name
        prefer = (self.segment,)
        op = rng.random() if len(acked) < MAX_ACKED else 1.0  # a full writer only removes
        if op < 0.45:
            key = f"{me}-{n}"
            cfg = rng.choice([ReplicateConfig(preferred_segments=prefer),
                              ReplicateConfig(preferred_segments=prefer, soft_pin_action=SoftPinAction.ENABLE,
                                              soft_pin_ttl_ms=rng.randrange(1_000, 60_000)),
                              ReplicateConfig(preferred_segments=prefer, with_hard_pin=True)])
            size = rng.randrange(1, 65) * 1024
            self.retried(m.put_start, me, key, size, cfg)  # a retry answers the replicas already allocated
            self.retried(m.put_end, me, key)               # and put_end of a complete object is OK
            self.record(f"A {key}")
            acked.append(key)
            self.counts["put"] += 1
        elif op < 0.55:
            keys = [f"{me}-{n}-b{i}" for i in range(rng.randrange(2, 9))]
            self._batch_put(keys, ReplicateConfig(preferred_segments=prefer), acked)
        elif op < 0.65:
            group = f"g-{me}-{n}"
            keys = [f"{{{group}}}m{i}" for i in range(rng.randrange(2, 5))]
            self._batch_put(keys, ReplicateConfig(preferred_segments=prefer, group_id=group), acked)
        elif op < 0.75:
            key = f"{me}-{n}-v"
            m.put_start(me, key, 4096, ReplicateConfig(preferred_segments=prefer))
            m.put_revoke(me, key)
            self.record(f"V {key}")
            self.counts["revoke"] += 1
        elif acked:
            key = acked.pop(rng.randrange(len(acked)))
            self.record(f"r {key}")
            try:
                m.remove(key)
            except MasterError as exc:
                if exc.code == ErrorCode.OBJECT_HAS_LEASE:  # a reader holds it: it stays
                    self.record(f"K {key}")
                    acked.append(key)
                    self.counts["remove_leased"] += 1
                    return
                if exc.code == ErrorCode.OBJECT_NOT_FOUND:
                    self.record(f"N {key}")
                    self.counts["remove_not_found"] += 1
                    return
                raise
            self.record(f"R {key}")
            self.counts["remove"] += 1

    def _batch_put(self, keys: list[str], cfg: ReplicateConfig, acked: list[str]) -> None:
        m, me = self.master, self.name
        sizes = [self.rng.randrange(1, 17) * 1024 for _ in keys]
        started = [k for k, r in zip(keys, m.batch_put_start(me, keys, sizes, cfg)) if not isinstance(r, ErrorCode)]
        for key, code in zip(started, m.batch_put_end(me, started)):
            if code == ErrorCode.OK:
                self.record(f"A {key}")
                acked.append(key)
                self.counts["put"] += 1
            else:
                self.counts[f"batch_put_end_{code.name}"] += 1

    # ---- reader -------------------------------------------------------------------------------
    def writer_keys(self) -> list[str]:
        keys = []
        for path in sorted(self.out.glob("writer-*.log")):
            with open(path) as f:
                keys += [line[2:].rstrip("\n") for line in f if line.startswith("A ")]
        return keys[-5000:]

    def read_once(self, keys: list[str]) -> None:
        m, rng = self.master, self.rng
        picks = [rng.choice(keys) if keys and rng.random() < 0.8 else f"missing-{rng.randrange(10**6)}"
                 for _ in range(rng.randrange(1, 9))]
        op = rng.random()
        if op < 0.4:
            try:
                m.get_replica_list(picks[0])
                self.counts["read_hit"] += 1
            except MasterError as exc:
                if exc.code != ErrorCode.OBJECT_NOT_FOUND:  # removed by its writer, or never there
                    raise
                self.counts["read_miss"] += 1
        elif op < 0.7:
            for r in m.batch_get_replica_list(picks):
                if isinstance(r, ErrorCode) and r != ErrorCode.OBJECT_NOT_FOUND:
                    raise MasterError(r, "batch_get_replica_list")
                self.counts["read_hit" if not isinstance(r, ErrorCode) else "read_miss"] += 1
        else:
            hits = m.batch_exist_key(picks) if len(picks) > 1 else [m.exist_key(picks[0])]
            self.counts["exist_hit"] += sum(hits)
            self.counts["exist_miss"] += len(hits) - sum(hits)

    # ---- main loop ----------------------------------------------------------------------------
    def run(self) -> dict:
        while True:
            try:
                self.mount()
                break
            except Exception as exc:  # noqa: BLE001
                self.error("mount", exc)
                if not self.running():
                    raise
        pinger = threading.Thread(target=self.pinger, daemon=True)
        pinger.start()
        acked: list[str] = []
        keys: list[str] = []
        refreshed = 0.0
        n = 0
        while self.running() and n < 1_000_000:
            n += 1
            try:
                if self.role == "writer":
                    self.write_once(n, acked)
                else:
                    if time.monotonic() - refreshed > 1:
                        keys, refreshed = self.writer_keys(), time.monotonic()
                    self.read_once(keys)
            except Exception as exc:  # noqa: BLE001
                self.error(self.role, exc)
            time.sleep(0.002)  # leave the shared cores to the others
        self.stop.set()
        pinger.join(30)
        return {"name": self.name, "ops": n, **self.counts, "unexpected_errors": self.unexpected}


def main() -> None:
    role, url, name, index, seconds, ping_ms, out = sys.argv[1:8]
    client = Client(role, url, name, int(index), float(seconds), int(ping_ms), Path(out))
    signal.signal(signal.SIGTERM, lambda *_: client.stop.set())
    print(json.dumps(client.run()), flush=True)


if __name__ == "__main__":
    main()
