"""Chaos with the radix index on: worker processes and radix writers (parent = the previous
node of a binary tree, across 4 shards) on one real Valkey, one worker SIGKILLed mid-run.
Afterwards, once the outboxes are drained and reconciliation ran, fsck finds the index clean
(no live child its parent does not list, no phantom, no drift in node units)."""
from __future__ import annotations

import signal

import pytest
import redis

from mooncake_redis import Master, MasterConfig
from mooncake_redis.fsck import fsck
from mooncake_redis.worker import Worker

from helpers import T0, WATERMARKS, all_shard_keys
from test_chaos import KIB, spawn_worker

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent

pytestmark = pytest.mark.slow  # worker processes and a SIGKILL: seconds


def test_radix_workers_and_writers_with_a_killed_worker(valkey):
    redis.Redis.from_url(valkey.url).flushall()
    m = Master.connect(valkey.url, MasterConfig(shards=4, enable_radix_tree=True, **WATERMARKS))
    m.freeze_clock(T0)
    m.mount_segment("seg", 4 * 256 * KIB, "node")
    workers = [spawn_worker(valkey.url) for _ in range(3)]
    writers = [subprocess.Popen([sys.executable, str(HERE / "chaos_writer.py"), valkey.url, str(seed), "1500", "radix"],
                                stdout=subprocess.PIPE, text=True) for seed in range(3)]
    try:
        assert writers[0].stdout.readline().strip() == "half"
        workers[0].send_signal(signal.SIGKILL)
        for w in writers:
            out, _ = w.communicate(timeout=300)
            assert w.returncode == 0 and out.strip().endswith("done")
        for w in workers[1:]:
            w.send_signal(signal.SIGTERM)
            w.wait(timeout=60)
            assert w.returncode == 0, w.stdout.read().decode()[-2000:]
    finally:
        for p in workers + writers:
            if p.poll() is None:
                p.kill()
                p.wait()
    workers[0].wait()
    m.advance_clock(5_000)
    assert Worker(m).run_once().shards_claimed == 4
    m.drain_radix_outbox()
    m.reconcile_radix_all(grace_ms=0)
    report = fsck(m)
    assert report.ok, [str(f) for f in report.findings]
    assert sum(s.nodes for s in m.radix_stats()) > 0
    evicted = sum(int(m.redis.hget(p.metrics, "evicted_objects_total") or 0) for p in all_shard_keys(m))
    assert evicted > 0, "the workers never evicted: the run put no pressure on the store"
