"""bench capacity: the trace reader, the ideal-LRU model (against a hand-computed hit rate), and a
store replay that runs to the end and reports its figures (its hit rate is what the benchmark
measures, so no test asserts it)."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mooncake_redis.bench import capacity
from mooncake_redis.cli.main import cli

# (timestamp ms, blocks); an ideal LRU of 3 blocks, most recent last, hits = the leading run:
TRACE = [
    (0, [1, 2]),      # 0 hits; [1 2]
    (10, [1, 2, 3]),  # 2 hits; [1 2 3]
    (20, [1, 4]),     # 1 hit;  [2 3 1 4] -> 2 goes: [3 1 4]
    (30, [1, 2]),     # 1 hit;  [3 4 1 2] -> 3 goes: [4 1 2]
    (40, [3]),        # 0 hits; [4 1 2 3] -> 4 goes: [1 2 3]
    (50, [1, 2, 3]),  # 3 hits; [1 2 3]
    (60, [9, 2]),     # 0 hits (2 is found past the miss: refreshed); [1 2 3 9] -> 1 goes: [3 9 2]
    (70, [7]),        # 0 hits; [3 9 2 7] -> 3 goes: [9 2 7]   (had 2 not been refreshed, 2 would go)
    (6000, [2]),      # 1 hit
]
BLOCKS, HITS = 17, 8


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps({"timestamp": ts, "input_length": 512 * len(ids), "output_length": 1,
                                        "hash_ids": ids}) + "\n" for ts, ids in TRACE))
    return path


def test_load_trace_and_limit(trace):
    reqs = capacity.load_trace(trace)
    assert [(q.timestamp, list(q.blocks)) for q in reqs] == TRACE
    assert len(capacity.load_trace(trace, limit=4)) == 4


@pytest.mark.parametrize("line, message", [
    ('{"timestamp": 5, "hash_ids": [1]}\n{"timestamp": 4, "hash_ids": [2]}\n', ":2: timestamp must be"),
    ('{"timestamp": 0, "hash_ids": "abc"}\n', ":1: hash_ids must be a list of integers"),
    ('{"hash_ids": [1]}\n', ":1: not a trace request"),
    ('not json\n', ":1: not a trace request"),
    ('\n', "no requests"),
])
def test_load_trace_rejects_bad_lines(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(line)
    with pytest.raises(ValueError, match=message):
        capacity.load_trace(path)


def test_ideal_lru_hand_computed(trace):
    reqs = capacity.load_trace(trace)
    assert capacity.ideal_lru(reqs, 3) == HITS
    assert capacity.ideal_lru(reqs, 1000) == 10  # nothing evicted: also block 2 of request 4 and block 3 of request 5
    assert capacity.leading_run([True, True, False, True]) == 2 and capacity.leading_run([]) == 0


def test_replay_reports_both_runs(trace):
    res = capacity.main(trace, capacity_blocks=3, block_bytes=1024, out=lambda line: None, progress=None)
    assert (res["requests"], res["blocks"], res["distinct_blocks"]) == (len(TRACE), BLOCKS, 6)
    assert res["lru"]["hits"] == HITS and res["lru"]["hit_rate"] == pytest.approx(100 * HITS / BLOCKS)
    for run in ("evict_on_put", "worker"):
        fig = res[run]
        assert 0 <= fig["hits"] <= BLOCKS and fig["hit_rate"] == pytest.approx(100 * fig["hits"] / BLOCKS)
        assert fig["lru_minus_store_points"] == pytest.approx(res["lru"]["hit_rate"] - fig["hit_rate"])
        assert fig["requests_per_s"] > 0 and isinstance(fig["refused"], dict)
        assert 0 < fig["objects_left"] <= 3
        assert fig["written"] + sum(fig["refused"].values()) >= 6  # each distinct block is put at least once


def test_cli_capacity(trace, monkeypatch):
    r = CliRunner().invoke(cli, ["bench", "capacity", "--trace", str(trace), "--capacity-blocks", "3",
                                 "--block-bytes", "1024", "--limit-requests", "6"],
                           env={"MOONCAKE_REDIS_URL": None})
    assert r.exit_code == 0, r.output
    assert "6 requests, 13 block lookups" in r.output
    assert "ideal LRU" in r.output and f"{100 * 7 / 13:6.2f}%" in r.output
    assert "store, no worker (evict-on-put)" in r.output and "store, Worker.run_once per request" in r.output

    monkeypatch.setattr(capacity, "DEFAULT_TRACE", trace.parent / "absent.jsonl")
    r = CliRunner().invoke(cli, ["bench", "capacity"], env={"MOONCAKE_REDIS_URL": None})
    assert r.exit_code == 2 and "no trace: pass one" in r.output
