"""`mooncake-redis bench instructions`: a run under callgrind prints every operation, its floor and
the per-redis.call costs, with positive instruction counts, and its JSON holds them (skipped
only without valgrind); without valgrind it says what to install. No count is asserted beyond
relations that must hold."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile

import pytest

from mooncake_redis.bench import instructions as bench_instructions

from helpers import run_cli as run

OPS = ["exist_key", "get_replica_list", "put_start", "put_end", "remove", "batch_exist_key",
       "batch_get_replica_list"]
NUMBER = r"-?[\d,]+"


def _valgrind_usable() -> bool:
    try:
        bench_instructions.find_valgrind()
    except bench_instructions.CallgrindUnavailable:
        return False
    return True


def _processes_under(path: str) -> list[str]:
    """Command lines of running processes that name `path` (the bench's directory)."""
    out = subprocess.run(["ps", "-e", "-ww", "-o", "args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if path in line]


def _number(text: str) -> int:
    return int(text.replace(",", ""))


@pytest.mark.slow
@pytest.mark.skipif(not _valgrind_usable(), reason=f"valgrind is not installed: {bench_instructions.INSTALL}")
def test_bench_instructions_prints_every_operation_its_floor_and_the_json(monkeypatch, tmp_path):
    monkeypatch.setattr(bench_instructions, "STORE", 300)  # a small store: valgrind is slow
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the bench's temporary directory goes here
    r = run("bench", "instructions", "--n", "5", "--aof", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["command"] == "bench instructions" and doc["format"] == 1
    res = doc["results"]
    assert res["n"] == 5 and res["batch_keys"] == 100 and res["store_objects"] == 300 and res["aof"] is True
    assert "appendonly yes" in r.stderr.splitlines()[0]
    assert res["floor_reply_matches"] is True  # the floor of get_replica_list answers as ours does
    base = res["baselines"]
    assert base["noop_fcall_instructions"] > 0 and base["hgetall_plain_instructions"] > 0
    assert 0 < base["hgetall_plain_command_instructions"] < base["hgetall_plain_instructions"]
    assert list(res["operations"]) == OPS
    for name, op in res["operations"].items():
        ours, floor = op["ours_instructions"], op["floor_instructions"]
        assert ours > 0 and floor > 0, name
        assert op["ratio"] == pytest.approx(ours / floor) and op["logic_instructions"] == pytest.approx(ours - floor)
        assert op["floor_same_calls"] is True, (name, op)  # the floor makes the same redis.calls as ours
        assert op["redis_calls"] == op["floor_redis_calls"] > 0, name
        for who in ("ours", "floor"):
            inside, commands = op[f"{who}_in_redis_call_instructions"], op[f"{who}_in_commands_instructions"]
            assert 0 < commands < inside < op[f"{who}_instructions"], (name, who)
        assert op["unit"] == ("key" if name.startswith("batch_") else "call")
    ops = res["operations"]
    # relations that hold whatever the counts: a batch shares the call's fixed costs among its keys
    assert ops["batch_exist_key"]["ours_instructions"] < ops["exist_key"]["ours_instructions"]
    assert ops["batch_get_replica_list"]["ours_instructions"] < ops["get_replica_list"]["ours_instructions"]
    assert ops["batch_exist_key"]["redis_calls"] < ops["exist_key"]["redis_calls"]
    # every operation does more than a no-op FCALL, and more than its floor's Redis calls alone
    for op in ops.values():
        assert op["ours_instructions"] > base["noop_fcall_instructions"]
    # a re-read within the lease slack changes nothing (its ZADD XX GT moves no score)
    assert list(res["within_slack"]) == ["exist_key", "get_replica_list", "batch_exist_key", "batch_get_replica_list"]
    for name, fig in res["within_slack"].items():
        assert fig["writes"] == 0, name
        assert fig["redis_calls"] <= ops[name]["redis_calls"], name
        assert 0 < fig["instructions"] and fig["renewing_instructions"] == ops[name]["ours_instructions"], name
    assert set(res["redis_call"]) == {"TIME", "HGET", "HSET", "HGETALL", "ZADD"}
    for cmd, fig in res["redis_call"].items():
        assert fig["first_instructions"] > 0 and fig["command_instructions"] > 0, cmd
        assert fig["bridge_instructions"] == pytest.approx(fig["further_instructions"] - fig["command_instructions"])

    # the text (stderr with --json) has a line per baseline, operation and command, with positive counts
    lines = r.stderr.splitlines()
    for label in ("no-op FCALL", "HGETALL from the client"):
        (line,) = [ln for ln in lines if ln.strip().startswith(label)]
        assert re.search(r"\s([\d,]+)(\s|$)", line) and _number(re.findall(r"\s([\d,]+)(?=\s|$)", line)[0]) > 0
    for name in OPS:
        label = name + (" x100, per key" if name.startswith("batch_") else "")
        rows = [ln for ln in lines if re.match(rf"^  {re.escape(label)} ", ln)]
        # the table, where the instructions go, and for the reads the re-read within the slack
        assert len(rows) == 2 + (name in res["within_slack"]), (name, rows)
        m = re.match(rf"^  {re.escape(label)} +({NUMBER}) +({NUMBER}) +(\d+\.\d\d) +({NUMBER}) +(\d+\.\d\d)$", rows[0])
        assert m, rows[0]
        assert _number(m[1]) > 0 and _number(m[2]) > 0  # ours, floor
        assert not any("differ from ours" in ln for ln in lines)
    for name in res["within_slack"]:
        label = name + (" x100, per key" if name.startswith("batch_") else "")
        assert any(re.match(rf"^  {re.escape(label)} +{NUMBER} +{NUMBER} +\d+\.\d\d +\d+\.\d\d$", ln)
                   for ln in lines), name
    for cmd in res["redis_call"]:
        (line,) = [ln for ln in lines if re.match(rf"^  {cmd} +({NUMBER} +){{3}}{NUMBER}$", ln)]
        assert _number(line.split()[1]) > 0, line  # first

    # nothing left behind: no process, no file
    assert not _processes_under(str(tmp_path))
    assert os.listdir(tmp_path) == []


def test_bench_instructions_without_valgrind_says_what_to_install(monkeypatch):
    real = shutil.which

    def which(name, *args, **kwargs):
        return None if name in ("valgrind", "callgrind_control") else real(name, *args, **kwargs)

    monkeypatch.setattr(bench_instructions.shutil, "which", which)
    started = []
    monkeypatch.setattr(bench_instructions, "CallgrindValkey", lambda *a, **kw: started.append(a))
    r = run("bench", "instructions", "--n", "5")
    assert r.exit_code == 2
    assert "apt-get install valgrind" in r.stderr and "valgrind" in r.stderr
    assert not started


@pytest.mark.slow
@pytest.mark.skipif(not _valgrind_usable(), reason=f"valgrind is not installed: {bench_instructions.INSTALL}")
def test_bench_instructions_cleans_up_after_an_error(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    seen = []

    def failing_run(server, *args, **kwargs):
        seen.append(server.pid)
        assert _processes_under(str(tmp_path))  # valgrind runs the server, from the bench's directory
        raise RuntimeError("failed half way")

    monkeypatch.setattr(bench_instructions, "_run", failing_run)
    r = run("bench", "instructions", "--n", "5")
    assert r.exit_code == 2 and "failed half way" in r.stderr
    assert seen and not _processes_under(str(tmp_path))
    assert os.listdir(tmp_path) == []
