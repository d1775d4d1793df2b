"""Chaos: several worker processes and writers on one real Valkey; one worker is SIGKILLed
mid-run. Afterwards fsck finds no drift (no overlapping extents among it), no protected object
was evicted, and the killed worker's shards are taken over once its claim expires."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from mooncake_redis import Master, MasterConfig, ReplicateConfig
from mooncake_redis.fsck import fsck
from mooncake_redis.worker import Worker

from helpers import T0, WATERMARKS, all_shard_keys

HERE = Path(__file__).parent
KIB = 1024
pytestmark = pytest.mark.slow  # worker processes and a SIGKILL: seconds


def spawn_worker(url: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cli", "--redis", url, "worker", "--interval", "0.01",
                             "--step-units", "8"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def spawn_writer(url: str, seed: int, ops: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(HERE / "chaos_writer.py"), url, str(seed), str(ops)],
                            stdout=subprocess.PIPE, text=True)


def test_workers_and_writers_with_a_killed_worker(valkey):
    redis.Redis.from_url(valkey.url).flushall()
    m = Master.connect(valkey.url, MasterConfig(shards=4, **WATERMARKS))
    m.freeze_clock(T0)  # leases, pins and timeouts hold still; claims expire only when advanced
    m.mount_segment("seg", 4 * 256 * KIB, "node")
    # protected objects, in a key space the writers never touch
    hard = [f"p-hard-{i}" for i in range(12)]
    for key in hard:
        m.put_start("node", key, 4 * KIB, ReplicateConfig(with_hard_pin=True))
        m.put_end("node", key)
    leased = [f"p-leased-{i}" for i in range(12)]
    m.batch_put_start("node", leased, [4 * KIB] * len(leased))
    m.batch_put_end("node", leased)
    m.batch_get_replica_list(leased)  # leased until T0 + 10 s; the clock moves 5 s at most
    pending = [f"p-pending-{i}" for i in range(8)]
    m.batch_put_start("node", pending, [4 * KIB] * len(pending))  # never ended

    workers = [spawn_worker(valkey.url) for _ in range(3)]
    writers = [spawn_writer(valkey.url, seed, 1500) for seed in range(3)]
    try:
        assert writers[0].stdout.readline().strip() == "half"
        workers[0].send_signal(signal.SIGKILL)  # mid-run, wherever it is
        for w in writers:
            out, _ = w.communicate(timeout=300)
            assert w.returncode == 0 and out.strip().endswith("done")
        for w in workers[1:]:
            for line in w.stdout:  # up and running (its first log line), so SIGTERM is its clean stop
                if b" started on " in line:
                    break
            w.send_signal(signal.SIGTERM)
            w.wait(timeout=60)
            assert w.returncode == 0, w.stdout.read().decode()[-2000:]
    finally:
        for p in workers + writers:
            if p.poll() is None:
                p.kill()
                p.wait()
    workers[0].wait()

    # the killed worker's claims hold until they expire on the store clock; then any worker takes over
    m.advance_clock(5_000)
    assert Worker(m).run_once().shards_claimed == 4

    report = fsck(m)
    assert report.ok, [str(f) for f in report.findings]
    for key in hard + leased:
        assert m.describe(key).status.value == "complete", key
    for key in pending:
        assert m.describe(key).status.value == "processing", key
    evicted = sum(int(m.redis.hget(p.metrics, "evicted_objects_total") or 0) for p in all_shard_keys(m))
    assert evicted > 0, "the workers never evicted: the run put no pressure on the store"
