"""Prometheus metrics: what the store keeps, read at each scrape (mooncake_redis/metrics.py), from
`mooncake-redis metrics` and from a worker's --metrics-port."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from mooncake_redis import Master, MasterConfig, ReplicateConfig
from mooncake_redis.cli.main import cli
from mooncake_redis.metrics import METRICS, exposition, serve_metrics
from mooncake_redis.server import free_port
from mooncake_redis.worker import Worker

from helpers import T0, WATERMARKS

REPO = Path(__file__).resolve().parent.parent
OBJ = 60 << 10


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value}"""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.fixture
def store(valkey_master):
    """Two shards, a 2 MiB segment (1 MiB a shard), objects until both shards pass the watermark."""
    m = valkey_master(shards=2, **WATERMARKS)
    m.mount_segment("seg-a", 2 << 20, "client-1")
    i = 0
    while min(s.used_bytes for s in m.usage().shards) < 0.92 * (1 << 20):
        key = f"k{i}"
        i += 1
        m.put_start("client-1", key, OBJ)
        m.put_end("client-1", key)
    m.put_start("client-1", "open", 100)  # one put in progress
    return m


def test_metrics_before_and_after_an_eviction(store):
    before = samples(exposition(store))
    usage = store.usage()
    assert before[("mooncake_up", ())] == 1
    for shard in usage.shards:
        label = (("shard", str(shard.shard)),)
        assert before[("mooncake_shard_capacity_bytes", label)] == shard.capacity_bytes == 1 << 20
        assert before[("mooncake_shard_used_bytes", label)] == shard.used_bytes
        assert before[("mooncake_shard_objects", label)] == shard.objects
        assert before[("mooncake_shard_segments", label)] == 1
        assert before[("mooncake_shard_clients", label)] == 1
        assert before[("mooncake_shard_clock_frozen", label)] == 1
        assert before[("mooncake_evicted_objects_total", label)] == 0
    assert sum(v for (n, _), v in before.items() if n == "mooncake_shard_puts_in_progress") == 1
    candidates = sum(v for (n, labels), v in before.items()
                     if n == "mooncake_shard_eviction_candidates" and ("tier", "ordinary") in labels)
    assert candidates == usage.objects - 1  # every complete object

    worker = Worker(store, worker_id="w1")
    done = worker.run_once()
    assert done.evicted_objects > 0
    after = samples(exposition(store, worker))
    evicted = sum(v for (n, _), v in after.items() if n == "mooncake_evicted_objects_total")
    evicted_bytes = sum(v for (n, _), v in after.items() if n == "mooncake_evicted_bytes_total")
    assert evicted == done.evicted_objects and evicted_bytes == done.evicted_objects * OBJ
    assert sum(v for (n, _), v in after.items() if n == "mooncake_worker_passes_total") == 2  # one per shard
    assert after[("mooncake_shard_last_worker_pass_timestamp_seconds", (("shard", "0"),))] == T0 / 1000
    assert sum(v for (n, _), v in after.items() if n == "mooncake_shard_used_bytes") == store.usage().used_bytes
    assert after[("mooncake_worker_pass_duration_seconds_count", (("worker", "w1"),))] == 1
    assert after[("mooncake_worker_pass_duration_seconds_sum", (("worker", "w1"),))] > 0


def test_every_metric_is_exported_and_documented(store):
    names = {family.name for family in text_string_to_metric_families(exposition(store))}
    # prometheus-client names a counter family without its _total suffix
    assert {n.removesuffix("_total") for n in METRICS} == names
    doc = (REPO / "docs" / "operations.md").read_text()  # the metrics table
    for name in METRICS + ["mooncake_worker_pass_duration_seconds"]:
        assert f"`{name}`" in doc, name


def test_a_store_that_cannot_be_read_is_up_0(store):
    store.redis.connection_pool.reset()
    store.redis.connection_pool.connection_kwargs["port"] = free_port()
    text = exposition(store)
    assert samples(text) == {("mooncake_up", ()): 0}


def test_metrics_command_prints_the_exposition(store, valkey):
    r = CliRunner().invoke(cli, ["--redis", valkey.url, "metrics"], env={"MOONCAKE_REDIS_URL": None})
    assert r.exit_code == 0, r.output
    got = samples(r.stdout)
    assert got[("mooncake_shard_capacity_bytes", (("shard", "1"),))] == 1 << 20


def test_metrics_command_json_has_the_same_samples(store, valkey):
    import json

    invoke = lambda *a: CliRunner().invoke(cli, ["--redis", valkey.url, "metrics", *a],  # noqa: E731
                                           env={"MOONCAKE_REDIS_URL": None})
    r = invoke("--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert (doc["command"], doc["format"]) == ("metrics", 1)
    by_name = {f["name"]: f for f in doc["metrics"]}
    assert {n.removesuffix("_total") for n in METRICS} == set(by_name)  # every family, as the exposition's
    used = by_name["mooncake_shard_used_bytes"]
    assert used["type"] == "gauge" and used["help"].startswith("Bytes allocated on the shard")
    got = {(s["name"], tuple(sorted(s["labels"].items()))): s["value"] for f in doc["metrics"] for s in f["samples"]}
    assert got == samples(invoke().stdout)
    assert isinstance(got[("mooncake_shard_capacity_bytes", (("shard", "1"),))], int)  # whole numbers as integers
    r = invoke("--json", "--port", str(free_port()))
    assert r.exit_code == 2 and "cannot be used with --port" in r.output


def test_http_endpoint(store):
    port = free_port()
    http = serve_metrics(store, port, "127.0.0.1")
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        http.shutdown()
        http.server_close()
    assert samples(body)[("mooncake_up", ())] == 1


@pytest.mark.slow
def test_worker_metrics_port_after_puts_and_an_eviction(store, valkey):
    """The issue's check: a scrape of a worker's --metrics-port after puts and an eviction."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "mooncake_redis.cli", "--redis", valkey.url, "worker",
                             "--interval", "0.05", "--metrics-port", str(port), "--metrics-addr", "127.0.0.1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        got, end = {}, time.monotonic() + 30
        while time.monotonic() < end:  # polling the endpoint until the worker has evicted
            try:
                got = samples(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode())
            except OSError:
                got = {}
            evicted = [v for (n, _), v in got.items() if n == "mooncake_evicted_objects_total"]
            if len(evicted) == 2 and min(evicted) > 0:  # both shards' passes published
                break
            time.sleep(0.05)
        assert min(v for (n, _), v in got.items() if n == "mooncake_evicted_objects_total") > 0, got
        for shard in ("0", "1"):
            used = got[("mooncake_shard_used_bytes", (("shard", shard),))]
            assert 0 < used <= 0.85 * (1 << 20) + OBJ  # down to the target (high watermark - eviction ratio)
        assert any(n == "mooncake_worker_pass_duration_seconds_count" and v >= 1 for (n, _), v in got.items())
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out


@pytest.mark.slow
def test_metrics_command_serves_until_sigterm(store, valkey):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "mooncake_redis.cli", "--redis", valkey.url, "metrics",
                             "--port", str(port), "--addr", "127.0.0.1"], stdout=subprocess.PIPE, text=True)
    try:
        assert f"on http://127.0.0.1:{port}/metrics" in proc.stdout.readline()  # printed once it listens
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert samples(body)[("mooncake_shard_segments", (("shard", "0"),))] == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0


def test_a_taken_metrics_port_is_an_error_exit_2(store, valkey):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = CliRunner().invoke(cli, ["--redis", valkey.url, "metrics", "--port", str(port), "--addr", "127.0.0.1"],
                               env={"MOONCAKE_REDIS_URL": None})
    assert r.exit_code == 2 and f"error: cannot serve metrics on 127.0.0.1:{port}" in r.stderr


def test_guaranteed_bytes_and_objects(valkey):
    redis.Redis.from_url(valkey.url).flushall()
    m = Master.connect(valkey.url, MasterConfig(shards=1))
    try:
        m.freeze_clock(T0)
        m.mount_segment("seg-a", 1 << 20, "client-1")
        m.put_start("client-1", "kept", 4096, ReplicateConfig(guaranteed_ttl_ms=60_000))
        m.put_end("client-1", "kept")
        m.put_start("client-1", "plain", 4096)
        got = samples(exposition(m))
        assert got[("mooncake_shard_guaranteed_bytes", (("shard", "0"),))] == 4096
        assert got[("mooncake_shard_guaranteed_objects", (("shard", "0"),))] == 1
    finally:
        m.close()


def test_retained_groups_records_and_candidates(valkey):
    """Retention figures per shard: active retained groups, records holding a slot (an expired
    record until the sweep), the shard's share; a retained member is a candidate of the
    retained tier."""
    redis.Redis.from_url(valkey.url).flushall()
    m = Master.connect(valkey.url, MasterConfig(shards=1, max_retained_groups=10))
    try:
        m.freeze_clock(T0)
        m.mount_segment("seg-a", 1 << 20, "client-1")
        m.retain_groups(["g1", "g2"], 60_000)
        m.put_start("client-1", "{g1}a", 4096, ReplicateConfig(group_id="g1"))
        m.put_end("client-1", "{g1}a")
        got = samples(exposition(m))
        shard = (("shard", "0"),)
        assert got[("mooncake_shard_retained_groups", shard)] == 2
        assert got[("mooncake_shard_retention_records", shard)] == 2
        assert got[("mooncake_shard_retained_groups_limit", shard)] == 10
        assert got[("mooncake_shard_eviction_candidates", (("shard", "0"), ("tier", "retained")))] == 1
        assert got[("mooncake_shard_retained_group_members", shard)] == 1
        m.advance_clock(60_001)
        got = samples(exposition(m))
        assert got[("mooncake_shard_retained_groups", shard)] == 0
        assert got[("mooncake_shard_retained_group_members", shard)] == 0
    finally:
        m.close()


def test_the_offload_tier(valkey):
    """Each client's disk (capacity, used and in-flight bytes, tasks in flight, queue depths per
    priority, removals) and the offload counters, as `mooncake-redis status` reads them."""
    redis.Redis.from_url(valkey.url).flushall()
    m = Master.connect(valkey.url, MasterConfig(shards=2, offload_on_put=True))
    try:
        m.freeze_clock(T0)
        m.mount_segment("mem", 2 << 20, "agent")
        m.mount_local_disk_segment("agent")
        m.mount_local_disk_segment("quiet", enable_offloading=False)
        got = samples(exposition(m))
        assert ("mooncake_disk_capacity_bytes", (("client", "agent"),)) not in got  # never reported
        m.report_ssd_capacity("agent", 1 << 30)
        keys = [f"k{i}" for i in range(3)]
        for k in keys:
            m.put_start("w", k, 4096)
            m.put_end("w", k)
        m.put_start("w", "high", 1000, ReplicateConfig(guaranteed_ttl_ms=60_000))
        m.put_end("w", "high")
        tasks = m.offload_object_heartbeat("agent", 2)  # HIGH first, then one more
        done = [t.key for t in tasks if t.key != b"high"]
        assert len(tasks) == 2 and len(done) == 1
        m.notify_offload_success("agent", done, ["/d/1"])
        got = samples(exposition(m))
        agent, quiet = (("client", "agent"),), (("client", "quiet"),)
        assert got[("mooncake_disk_enabled", agent)] == 1 and got[("mooncake_disk_enabled", quiet)] == 0
        assert got[("mooncake_disk_capacity_bytes", agent)] == 1 << 30
        assert got[("mooncake_disk_used_bytes", agent)] == 4096
        assert got[("mooncake_disk_inflight_bytes", agent)] == 1000
        assert got[("mooncake_offload_inflight_tasks", agent)] == 1
        assert got[("mooncake_offload_queued_tasks", (("client", "agent"), ("priority", "high")))] == 0
        assert sum(got[("mooncake_offload_queued_tasks", (("client", "agent"), ("priority", p)))]
                   for p in ("normal", "low")) == 2
        assert got[("mooncake_disk_removals_pending", agent)] == 0
        m.remove(done[0], force=True)  # its file is queued for removal
        got = samples(exposition(m))
        assert got[("mooncake_disk_removals_pending", agent)] == 1
        assert got[("mooncake_disk_used_bytes", agent)] == 0
        assert got[("mooncake_disk_orphaned_removals_total", agent)] == 0
        assert got[("mooncake_offload_events_total", (("event", "enqueued"),))] == 4
        assert got[("mooncake_offload_events_total", (("event", "done"),))] == 1
        counters = m.offload_counters()
        for event, n in counters.items():
            assert got[("mooncake_offload_events_total", (("event", event),))] == n
    finally:
        m.close()


def test_the_endpoint_answers_whatever_the_store_holds(store, monkeypatch):
    """A malformed figure (`HSET P used_bytes notanumber`) is a gauge, not an HTTP 500; and a
    scrape that meets anything it cannot make sense of answers mooncake_up 0."""
    store.redis.hset(store.transport.keys[0].P, "used_bytes", "notanumber")
    port = free_port()
    http = serve_metrics(store, port, "127.0.0.1")
    try:
        got = samples(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode())
        assert got[("mooncake_up", ())] == 1
        assert got[("mooncake_shard_malformed_figures", (("shard", "0"),))] == 1
        assert got[("mooncake_shard_malformed_figures", (("shard", "1"),))] == 0
        assert ("mooncake_shard_used_bytes", (("shard", "0"),)) not in got
        assert got[("mooncake_shard_used_bytes", (("shard", "1"),))] > 0

        def broken(self):
            raise ValueError("a figure nobody expected")
        monkeypatch.setattr(Master, "shard_stats", broken)
        got = samples(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode())
        assert got == {("mooncake_up", ()): 0}
    finally:
        http.shutdown()
        http.server_close()
