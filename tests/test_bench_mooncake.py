"""`mooncake-redis bench mooncake`: the comparison with Mooncake's own master runs end to end when
Mooncake is installed (the `mooncake` extra; skipped otherwise), and says what to install when it
is not. No timing is asserted."""
from __future__ import annotations

import importlib.abc
import json
import re
import sys

import pytest

from mooncake_redis.bench import mooncake as bench_mooncake

from helpers import run_cli as run

# a table line after its label: Mooncake's rate, ours, the ratio ours/Mooncake, ours in the server
ROW = re.compile(r"^ +([\d,]+)(?: keys)?/s +([\d,]+)(?: keys)?/s +(\d+\.\d\d) +[\d.]+ us/call")
LABELS = [label for _, label, *_ in bench_mooncake.ROWS + bench_mooncake.NO_DATA_ROWS + bench_mooncake.FLOOR_ROWS]


def _mooncake_usable() -> bool:
    try:
        bench_mooncake.find_mooncake()
    except bench_mooncake.MooncakeUnavailable:
        return False
    return True


@pytest.mark.skipif(not _mooncake_usable(), reason="Mooncake is not installed: pip install 'mooncake-redis[mooncake]'")
def test_bench_mooncake_prints_every_operation_and_a_ratio(monkeypatch):
    started = []

    class Recorded(bench_mooncake.MooncakeMaster):
        def start(self):
            started.append(self)
            return super().start()

    monkeypatch.setattr(bench_mooncake, "MooncakeMaster", Recorded)
    r = run("bench", "mooncake", "--n", "20", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["command"] == "bench mooncake" and doc["format"] == 1
    res = doc["results"]
    assert res["n"] == 20 and res["repeats"] == 3 and res["object_bytes"] == 1024
    assert set(res["operations"]) == {"exist_key", "batch_exist_key", "put", "get_replica_list", "remove",
                                      "put_no_data", "get_replica_list_no_data", "floor_noop", "floor_exist_key",
                                      "floor_batch_exist_key", "floor_get_replica_list"}
    for name, op in res["operations"].items():
        assert op["mooncake_per_s"] > 0 and op["ours_per_s"] > 0, name
        assert op["ratio"] == pytest.approx(op["ours_per_s"] / op["mooncake_per_s"]), name
        assert op["ours_server_us_per_call"] > 0, name
    # the table went to stderr (--json): one line per operation, with both rates and the ratio
    lines = r.stderr.splitlines()
    assert any("ours/Mooncake" in line for line in lines)
    for label in LABELS:
        (line,) = [ln for ln in lines if ln.startswith(label + " ")]
        m = ROW.match(line[len(label):])
        assert m, line
        mooncake, ours, ratio = (float(x.replace(",", "")) for x in m.groups())
        assert mooncake > 0 and ours > 0 and ratio > 0, line
    (master,) = started
    assert master.proc.poll() is not None  # stopped at the end


def test_bench_mooncake_without_mooncake_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "mooncake.store", None)  # import mooncake.store now fails
    r = run("bench", "mooncake", "--n", "5")
    assert r.exit_code == 2
    assert "error: Mooncake's Python client is not installed" in r.stderr
    assert "pip install 'mooncake-redis[mooncake]'" in r.stderr
    assert r.stdout == ""


class _BrokenStore(importlib.abc.MetaPathFinder):
    """Finds mooncake (installed or not) as a package whose shared library does not load."""

    def find_spec(self, name, path=None, target=None):
        if name in ("mooncake", "mooncake.store"):
            raise ImportError("libibverbs.so.1: cannot open shared object file: No such file or directory")
        return None


def test_bench_mooncake_with_a_library_missing_names_it(monkeypatch):
    for name in ("mooncake", "mooncake.store"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setattr(sys, "meta_path", [_BrokenStore(), *sys.meta_path])
    with pytest.raises(bench_mooncake.MooncakeUnavailable, match="does not load: libibverbs.so.1") as info:
        bench_mooncake.main(n=5)
    assert "apt-get install libibverbs1" in str(info.value) and "non-cuda" in str(info.value)


@pytest.mark.slow
@pytest.mark.skipif(not _mooncake_usable(), reason="Mooncake is not installed: pip install 'mooncake-redis[mooncake]'")
def test_bench_gateway_prints_every_operation_and_where_the_time_goes(monkeypatch):
    from mooncake_redis.bench import gateway as bench_gateway

    monkeypatch.setattr(bench_gateway, "REPEATS", 1)  # one round: the shape of the output, not figures
    r = run("bench", "gateway", "--n", "100", "--json")
    assert r.exit_code == 0, r.output
    results = json.loads(r.stdout)["results"]
    for table in ("single", "aggregate"):
        assert set(results[table]) == {"put", "is_exist", "batch_is_exist", "get", "remove"}
        for row in results[table].values():
            assert row["mooncake_per_s"] > 0 and row["gateway_per_s"] > 0
            assert row["ratio"] == pytest.approx(row["gateway_per_s"] / row["mooncake_per_s"])
    where = results["where"]
    assert where["fcall_server_us"] > 0 and where["gateway_cpu_us_per_rpc"] > 0 and where["valkey_cpu_us_per_rpc"] > 0
    for op in ("put", "is_exist", "batch_is_exist", "get", "remove"):
        cpu = where["client_cpu_us_per_call"][op]
        assert cpu["mooncake_us"] > 0 and cpu["gateway_us"] > 0
    for op in ("is_exist", "get", "remove"):
        assert where["operations"][op]["client_us"] > 0 and where["operations"][op]["gateway_us"] > 0
