"""The CLI for operators and scripts: --json of inspect, evict, fsck and bench (status: test_cli.py),
fsck's progress off a terminal, usage errors, the worker's stop line."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import types

import pytest
import redis

from mooncake_redis import Master, MasterConfig, ReplicateConfig
from mooncake_redis.cli import output
from mooncake_redis.cli.main import cli
from mooncake_redis.keys import shard_key

from helpers import T0, WATERMARKS

from helpers import run_cli as run


@pytest.fixture
def store(valkey_master):
    """One shard, one 1 MiB segment filled to 16 x 60 KiB objects (over the 90% watermark)."""
    m = valkey_master(shards=1, **WATERMARKS)
    m.mount_segment("seg-a", 1 << 20, "client-1")
    for i in range(16):
        m.put_start("client-1", f"k{i}", 60 << 10)
        m.put_end("client-1", f"k{i}")
    return m


def test_inspect_json(store, valkey):
    store.put_start("client-1", "open", 10, ReplicateConfig(with_hard_pin=True), tenant_id="t1")
    r = run("--redis", valkey.url, "inspect", "open", "--tenant", "t1", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["command"] == "inspect" and doc["format"] == 1 and doc["found"] is True
    assert (doc["key"], doc["tenant"], doc["shard"], doc["size_bytes"]) == ("open", "t1", 0, 10)
    assert doc["redis_key"] == f"{shard_key('mc', 0)}:obj:t1:open"
    assert (doc["status"], doc["writer"], doc["put_started_ms"], doc["now_ms"]) == ("processing", "client-1", T0, T0)
    assert doc["lease_until_ms"] is None and doc["soft_pin_until_ms"] is None
    assert doc["hard_pin"] is True and doc["group"] is None
    assert [(r["segment"], r["size_bytes"]) for r in doc["replicas"]] == [("seg-a", 10)]
    assert doc["dead_replicas"] == [] and doc["fields"]["writer"] == "client-1"


def test_inspect_json_not_found_exits_1(store, valkey):
    r = run("--redis", valkey.url, "inspect", "nope", "--json")
    assert r.exit_code == 1
    assert json.loads(r.stdout) == {"command": "inspect", "format": 1, "key": "nope", "tenant": "default",
                                    "found": False}


def test_evict_json(store, valkey):
    before = store.usage().used_bytes
    r = run("--redis", valkey.url, "evict", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["command"] == "evict" and doc["evicted_objects"] >= 1 and doc["steps"] >= 1
    assert doc["evicted_bytes"] == doc["evicted_objects"] * (60 << 10) == before - store.usage().used_bytes
    (shard,) = doc["shards"]
    assert shard["state"] == "target" and shard["used_bytes"] <= shard["target_bytes"]
    assert shard["used_bytes"] == store.usage().used_bytes


def test_evict_text_and_help(store, valkey):
    r = run("--redis", valkey.url, "evict")
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("evicted ") and "shard 0: target" in r.stdout
    help_text = run("evict", "--help").stdout
    assert "--step-units INTEGER RANGE" in help_text and "Units evicted at most per eviction step" in help_text


def test_fsck_json_clean_then_a_drift(store, valkey):
    r = run("--redis", valkey.url, "fsck", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["command"] == "fsck" and doc["clean"] is True and doc["repair"] is False
    assert (doc["shards"], doc["objects_checked"], doc["findings"], doc["unverified"]) == (1, 16, [], [])
    redis.Redis.from_url(valkey.url).hincrby(shard_key("mc", 0), "used_bytes", 7)  # a counter drift
    r = run("--redis", valkey.url, "fsck", "--json")
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    assert doc["clean"] is False and len(doc["findings"]) >= 1
    assert set(doc["findings"][0]) == {"kind", "shard", "subject", "expected", "found", "severity",
                                       "repairable", "repaired", "note"}
    r = run("--redis", valkey.url, "fsck", "--repair", "--json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["clean"] is True and all(f["repaired"] for f in doc["findings"])


def test_fsck_progress_off_a_terminal_is_plain_lines(store, valkey):
    r = run("--redis", valkey.url, "fsck")  # CliRunner's stderr is not a terminal
    assert r.exit_code == 0, r.output
    assert "\r" not in r.stderr and "\r" not in r.stdout
    assert r.stdout.startswith("fsck: 1 shard(s), 16 objects checked, 0 finding(s)")


def test_progress_printer_off_a_terminal(capsys):
    show = output.progress_printer("objects checked", every=100)
    for n in (40, 80, 120, 160, 250, 260):
        show(n)
    show.done()
    assert capsys.readouterr().err == "  120 objects checked\n  250 objects checked\n"


def test_bench_evict_bad_sizes_is_a_usage_error():
    for sizes, why in (("abc", "expected comma-separated integers"), ("10,20", "at least 1000")):
        r = run("bench", "evict", "--sizes", sizes)
        assert r.exit_code == 2, r.output
        assert why in r.stderr and "Traceback" not in r.output


def test_bench_json(monkeypatch, valkey):
    def main(url, n, shards, out, expire_sizes):
        out("text line")
        return {"url": url, "n": n, "noop_fcall_ops_per_s": 1.5}

    monkeypatch.setitem(sys.modules, "mooncake_redis.bench.ops", types.SimpleNamespace(main=main))
    r = run("--redis", valkey.url, "bench", "ops", "--n", "3", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == {"command": "bench ops", "format": 1,
                                    "results": {"url": valkey.url, "n": 3, "noop_fcall_ops_per_s": 1.5}}
    assert "text line" in r.stderr


@pytest.mark.slow
def test_bench_offload_runs_and_names_what_bounds_put_many(valkey):
    r = run("--redis", valkey.url, "bench", "offload", "--objects", "100", "--json")
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)["results"]
    for size in ("put_64k", "put_1m"):
        fig = res[size]
        assert fig["bound_by"] in ("bytes", "master")
        assert all(fig[k] > 0 for k in ("puts_per_s", "put_many_per_s", "copies_per_s", "copy_checksum_per_s",
                                        "master_only_per_s"))
    assert "put_many is bound by" in r.stderr


def test_worker_prints_its_stop_line_once(valkey):
    redis.Redis.from_url(valkey.url).flushall()
    Master.connect(valkey.url, MasterConfig(shards=1)).close()
    proc = subprocess.Popen([sys.executable, "-m", "mooncake_redis.cli", "--redis", valkey.url, "worker",
                             "--interval", "0.05"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:  # bounded by the test timeout
        lines.append(line)
        if " started on " in line:
            break
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=30)
    text = "".join(lines) + rest
    assert proc.returncode == 0, text
    assert text.count("stopped after") == 1, text


def test_worker_logs_one_json_line_per_event_with_the_shard(valkey):
    """--log-format json: one object per line; a shard's work is logged with its shard."""
    redis.Redis.from_url(valkey.url).flushall()
    m = Master.connect(valkey.url, MasterConfig(shards=1, **WATERMARKS))
    m.mount_segment("seg-a", 1 << 20, "client-1")
    for i in range(16):  # over the high watermark: the worker evicts
        m.put_start("client-1", f"k{i}", 60 << 10)
        m.put_end("client-1", f"k{i}")
    m.close()
    proc = subprocess.Popen([sys.executable, "-m", "mooncake_redis.cli", "--redis", valkey.url, "worker",
                             "--interval", "0.05", "--log-format", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stderr:  # bounded by the test timeout
        lines.append(json.loads(line))
        if "counts" in lines[-1]:
            break
    proc.send_signal(signal.SIGTERM)
    _, rest = proc.communicate(timeout=30)
    lines += [json.loads(line) for line in rest.splitlines()]
    assert proc.returncode == 0
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    work = next(line for line in lines if "counts" in line)
    assert work["level"] == "INFO" and work["shard"] == 0 and work["counts"]["evicted_objects"] >= 1
    assert work["message"].startswith("shard 0: ") and "evicted_objects=" in work["message"]
    assert sum("stopped after" in line["message"] for line in lines) == 1


def test_log_options_text_and_level():
    assert "--log-format [text|json]" in run("worker", "--help").stdout
    assert "--log-level" in run("serve", "--help").stdout
    r = run("worker", "--log-format", "xml")
    assert r.exit_code == 2 and "xml" in r.stderr


def test_every_command_and_option_has_help():
    import click

    missing = []

    def walk(command, path):
        missing.extend(f"{path} {p.opts[0]}" for p in command.params if isinstance(p, click.Option) and not p.help)
        for name, sub in getattr(command, "commands", {}).items():
            if not sub.help:
                missing.append(f"{path} {name}")
            walk(sub, f"{path} {name}")

    walk(cli, "mooncake-redis")
    assert missing == []


def test_progress_printer_on_a_terminal(monkeypatch):
    import io

    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty = Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    show = output.progress_printer("objects checked")
    show(5)
    show(10)
    show.done()
    assert tty.getvalue() == "\r  5 objects checked\r  10 objects checked\n"


def test_metrics_endpoints_listen_on_loopback_by_default():
    for command, option in ((["metrics"], "--addr"), (["serve"], "--metrics-addr"), (["worker"], "--metrics-addr")):
        text = " ".join(run(*command, "--help").stdout.split())
        assert f"{option} TEXT Address" in text and "[default: 127.0.0.1]" in text, command
