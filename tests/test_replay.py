"""mooncake-redis replay: the reference caches and the store replay on small traces with
hand-computed figures (on real Valkey, Redis 7 and memory://), the store's plain-Python model
against both, and the command (exit codes, --json fields, --sweep, --plot, --check)."""
from __future__ import annotations

import io
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import pytest
import redis
from click.testing import CliRunner

from mooncake_redis.bench import replay as engine
from mooncake_redis.bench import replay_model
from mooncake_redis.bench.replay_model import model_lru
from mooncake_redis import MasterConfig, ReplicateConfig
from mooncake_redis.bench.replay_policies import POLICIES, Combined, Guaranteed, Lru, Policy, Retained, make_policy
from mooncake_redis.cli.main import cli

SEC = 20_000  # requests 20 s apart: a read's 10 s lease has run out by the next one

# Store, capacity 3 blocks, one shard. put_end scores a block at its write time, a read at
# read time + the 10 s lease; evict-on-put and the worker take the lowest score first (ties by
# key name). (time, blocks, input_length)
STORE_TRACE = [
    (0 * SEC, [1, 2], 1024),        # 0 hits; store {1:0 2:0}
    (1 * SEC, [1, 2, 3], 1100),     # 2 hits; read 1 2 (score 30 s), write 3 (20 s)
    (2 * SEC, [4], 512),            # 0 hits
    (3 * SEC, [1, 2, 3], 1400),     #
]
# No worker (evict-on-put only):
#   R3 writes 4 into a full store: 3 (20 s) goes; {1:30 2:30 4:40}; 3 has no child: not orphan-making
#   R4 hits 1 2 (-> 70 s), writes 3: 4 (40 s) goes; {1 2 3}
NO_WORKER = dict(hits=4, evictions=2, orphan_evictions=0, tokens_saved=1024 + 1024, written=5)
# With Worker.run_once after each request (high watermark 0.90 of 3 blocks, down to 0.85: at most 2 blocks kept):
#   R2 ends with 3 blocks: 3 (20 s) goes; {1:30 2:30}
#   R3 writes 4 -> 3 blocks: 1 goes (30 s, before 2 by name) while its child 2 stays: orphan-making; {2 4}
#   R4: 1 misses (0 hits), 2 is found past the miss (-> 70 s); 1 and 3 written (60 s): evict-on-put
#       takes 4 (40 s) for room, the worker then 1 (60 s, before 3 by name) while 2 stays: orphan-making
WITH_WORKER = dict(hits=2, evictions=4, orphan_evictions=2, tokens_saved=1024, written=6)
TOKENS = 1024 + 1100 + 512 + 1400


def write_trace(path, rows):
    path.write_text("".join(json.dumps({"timestamp": ts, "input_length": n, "output_length": 1, "hash_ids": ids})
                            + "\n" for ts, ids, n in rows))
    return path


@pytest.fixture
def store_trace(tmp_path):
    return write_trace(tmp_path / "store.jsonl", STORE_TRACE)


@pytest.fixture(params=["valkey", "redis", "memory"])
def url(request):
    if request.param == "memory":
        return f"memory://{uuid.uuid4().hex}"
    return request.getfixturevalue({"valkey": "valkey", "redis": "redis7"}[request.param]).url


# ---- the trace and the reference caches ----------------------------------------------------

def test_tokens_saved_caps_at_the_prompt():
    req = engine.Request(0, (1, 2, 3), 1100)
    assert [req.tokens_saved(h, 512) for h in range(4)] == [0, 512, 1024, 1100]
    assert engine.Request(0, (1, 2)).tokens(512) == 1024  # no input_length: whole blocks


def test_load_trace_rejects_a_bad_input_length(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "hash_ids": [1], "input_length": -3}\n')
    with pytest.raises(ValueError, match=":1: input_length must be"):
        engine.load_trace(path)


def test_chains_know_each_blocks_children():
    chains = engine.Chains([engine.Request(0, (1, 2, 3)), engine.Request(0, (1, 4))])
    assert chains.children[1] == {2, 4} and chains.children[2] == {3} and not chains.children.get(3)
    assert chains.parents[4] == {1}


# radix keeps the chain lru breaks: capacity 3
CHAIN_TRACE = [engine.Request(0, (1, 2, 3)), engine.Request(1, (4,)), engine.Request(2, (1, 2, 3))]


def test_ideal_lru_breaks_the_chain():
    st = engine.ideal_lru(CHAIN_TRACE, 3)
    # R2 evicts 1 (least recent) while 2 stays: orphan-making. R3 misses 1, so 0 hits; inserting
    # 1 2 3 again evicts 2, 3 (each re-inserted later in the request) and 4
    assert (st.hits, st.blocks) == (0, 7)
    assert st.evictions == 4 and st.orphan_evictions == 1 + 1  # R2's 1; R3's 2 (child 3 stored at the end)
    assert st.request_hit_rate == 0


def test_ideal_radix_keeps_the_chain():
    st = engine.ideal_radix(CHAIN_TRACE, 3)
    # R2: the only leaf is 3: it goes, {1 2 4}. R3 hits 1 2; inserting 3 evicts leaf 4
    assert (st.hits, st.blocks, st.evictions, st.orphan_evictions) == (2, 7, 2, 0)
    assert st.block_hit_rate == pytest.approx(2 / 7) and st.request_hit_rate == pytest.approx(1 / 3)


def test_ideal_radix_never_orphans_on_random_traces():
    rnd = random.Random(7)
    for _ in range(20):
        reqs, t = [], 0
        for _ in range(60):
            # chains from a small tree: block ids encode their prefix so a block has one parent
            depth = rnd.randint(1, 6)
            path = tuple(rnd.randint(0, 2) for _ in range(depth))
            reqs.append(engine.Request(t, tuple(int("9" + "".join(map(str, path[:i + 1]))) for i in range(depth))))
            t += 1
        cap = rnd.randint(1, 12)
        radix, lru = engine.ideal_radix(reqs, cap), engine.ideal_lru(reqs, cap)
        assert radix.orphan_evictions == 0 and radix.objects_left <= cap and lru.objects_left <= cap
        assert radix.blocks == lru.blocks


# ---- the store replay --------------------------------------------------------------------------

@pytest.mark.parametrize("worker, want", [(False, NO_WORKER), (True, WITH_WORKER)], ids=["no-worker", "worker"])
def test_store_lru_hand_computed(url, store_trace, worker, want):
    reqs = engine.load_trace(store_trace)
    st = engine.replay_store(url, reqs, Lru(), 3, block_bytes=1024, worker=worker)
    got = {k: getattr(st, k) for k in want}
    assert got == want
    assert (st.blocks, st.tokens, st.requests) == (9, TOKENS, 4)
    assert st.token_hit_rate == pytest.approx(want["tokens_saved"] / TOKENS)
    assert st.puts_refused == {} and st.guaranteed_peak_bytes == 0
    assert st.objects_left == st.written - st.evictions


def test_store_without_evictions_hits_every_repeat(url, store_trace):
    reqs = engine.load_trace(store_trace)
    st = engine.replay_store(url, reqs, Lru(), 100, block_bytes=1024, shards=4)
    # nothing evicted: R2 hits 1 2, R4 hits 1 2 3
    assert (st.hits, st.evictions, st.written, st.objects_left) == (5, 0, 4, 4)
    assert st.tokens_saved == 1024 + 1400


def test_the_replay_leaves_no_keys(valkey, store_trace):
    import redis

    r = redis.Redis.from_url(valkey.url)
    r.set(f"{engine.NAMESPACE}:stale", "x")  # an interrupted run's key: deleted first
    r.set("other", "kept")
    engine.replay_store(valkey.url, engine.load_trace(store_trace), Lru(), 3, block_bytes=1024)
    assert list(r.scan_iter(match=f"{engine.NAMESPACE}:*")) == [] and r.get("other") == b"kept"
    r.delete("other")


def test_make_policy():
    assert isinstance(make_policy("lru"), Lru) and "lru" in POLICIES
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        make_policy("nope")


# ---- the command ---------------------------------------------------------------------------------

def invoke(*args):
    return CliRunner().invoke(cli, ["replay", *map(str, args)], env={"MOONCAKE_REDIS_URL": None})


POLICY_FIELDS = {"block_hit_rate", "token_hit_rate", "request_hit_rate", "hits", "blocks", "tokens_saved",
                 "tokens", "evictions", "orphan_evictions", "puts_refused", "written", "guaranteed_peak_bytes",
                 "requests_per_s", "seconds", "objects_left", "used_ratio", "worker_evicted"}
IDEAL_FIELDS = {"block_hit_rate", "token_hit_rate", "request_hit_rate", "hits", "blocks", "tokens_saved",
                "tokens", "evictions", "orphan_evictions"}


def test_cli_json_on_a_private_valkey(store_trace):
    r = invoke(store_trace, "--capacity-blocks", 3, "--block-bytes", 1024, "--no-worker", "--json")
    assert r.exit_code == 0, r.output
    assert r.stdout.count("\n") == 1  # one line
    res = json.loads(r.stdout)
    assert (res["command"], res["format"]) == ("replay", 1)
    assert res["trace"] == str(store_trace) and res["capacity_blocks"] == 3
    assert (res["requests"], res["blocks"], res["distinct_blocks"], res["tokens"]) == (4, 9, 4, TOKENS)
    assert res["server"].endswith("(private, no AOF)") and res["worker"] is False and res["shards"] == 1
    assert set(res["policies"]) == set(POLICIES) and set(res["ideal"]) == {"lru", "radix"}
    lru = res["policies"]["lru"]
    assert set(lru) == POLICY_FIELDS and set(res["policies"]["guaranteed"]) == POLICY_FIELDS | {
        "guaranteed_puts", "guarantee_renewals"}
    assert lru["block_hit_rate"] == pytest.approx(4 / 9) and lru["evictions"] == 2 and lru["puts_refused"] == {}
    assert all(set(f) == IDEAL_FIELDS for f in res["ideal"].values())
    assert res["infinite_cache"]["hits"] == 5
    assert res["runs"] == [{"capacity_blocks": 3, "policies": res["policies"], "ideal": res["ideal"]}]


def test_cli_tables_and_sweep(store_trace):
    r = invoke(store_trace, "--sweep", "100,3", "--block-bytes", 1024, "--no-worker", "--policy", "lru")
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "4 requests, 9 block lookups (4 distinct)" in out
    assert "capacity 3 blocks (1,536 tokens" in out and "capacity 100 blocks" in out
    assert out.index("capacity 3 blocks") < out.index("capacity 100 blocks")
    assert "block hit rate by capacity" in out
    lines = [line.split() for line in out.splitlines()]
    assert ["lru", "44.44%"] == next(row[:2] for row in lines if row[:1] == ["lru"])  # capacity 3
    assert ["100", "55.56%", "55.56%", "55.56%"] == next(row for row in lines if row[:1] == ["100"])


def test_cli_capacity_tokens(store_trace):
    r = invoke(store_trace, "--capacity-tokens", 1600, "--block-bytes", 1024, "--json", "--no-worker")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["capacity_blocks"] == 3


@pytest.mark.parametrize("args, message", [
    (["--capacity-blocks", "3", "--capacity-tokens", "2000"], "not both"),
    (["--sweep", "3,x"], "comma-separated block counts"),
    (["--sweep", "0"], "comma-separated block counts"),
    (["--sweep", "3", "--capacity-blocks", "3"], "--sweep gives the capacities"),
    (["--capacity-tokens", "100"], "less than one block"),
    (["--policy", "nope"], "Invalid value for '--policy'"),
])
def test_cli_usage_errors_exit_2(store_trace, args, message):
    r = invoke(store_trace, *args)
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output


def test_cli_bad_trace_exits_2(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    r = invoke(bad)
    assert r.exit_code == 2 and "error: " in r.output and ":1: not a trace request" in r.output
    r = invoke(tmp_path / "absent.jsonl")
    assert r.exit_code == 2 and "No such file" in r.output


def test_cli_plot_without_matplotlib_exits_2(store_trace, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    r = invoke(store_trace, "--plot", tmp_path / "p.png")
    assert r.exit_code == 2 and "--plot needs matplotlib" in r.output and not (tmp_path / "p.png").exists()


def test_cli_plot_writes_a_png(store_trace, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "p.png"
    r = invoke(store_trace, "--sweep", "3,100", "--block-bytes", 1024, "--plot", png)
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


@pytest.mark.parametrize("server", ["valkey", "memory"])
def test_cli_with_redis_uses_that_server(request, server, store_trace):
    url = request.getfixturevalue("valkey").url if server == "valkey" else f"memory://{uuid.uuid4().hex}"
    r = CliRunner().invoke(cli, ["--redis", url, "replay", str(store_trace), "--capacity-blocks", "3",
                                 "--block-bytes", "1024", "--json", "--shards", "1"], env={"MOONCAKE_REDIS_URL": None})
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["server"].startswith({"valkey": "valkey-server", "memory": "fakeredis"}[server])
    assert res["policies"]["lru"]["hits"] == WITH_WORKER["hits"]


def test_cli_takes_redis_after_its_name(valkey, store_trace):
    r = CliRunner().invoke(cli, ["replay", str(store_trace), "--redis", valkey.url, "--capacity-blocks", "3",
                                 "--block-bytes", "1024", "--json", "--policy", "lru"], env={"MOONCAKE_REDIS_URL": None})
    assert r.exit_code == 0, r.output
    assert not json.loads(r.stdout)["server"].endswith("(private, no AOF)")


def test_cli_does_not_follow_the_environment_url(valkey, store_trace):
    """MOONCAKE_REDIS_URL names a server of the shell, not one to write a throw-away run on."""
    client = redis.Redis.from_url(valkey.url)
    client.flushall()
    client.set("mcreplay:{mcreplay:0}:mine", "kept")  # a key the namespace's cleanup would delete
    try:
        r = CliRunner().invoke(cli, ["replay", str(store_trace), "--capacity-blocks", "3", "--block-bytes", "1024",
                                     "--json", "--policy", "lru"], env={"MOONCAKE_REDIS_URL": valkey.url})
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["server"].endswith("(private, no AOF)")
        assert "MOONCAKE_REDIS_URL is not used" in r.stderr
        assert client.keys("*") == [b"mcreplay:{mcreplay:0}:mine"]  # nothing written, nothing deleted
    finally:
        client.flushall()
        client.close()


def test_cli_removes_its_private_valkey_directory_after_an_error(store_trace, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def fail(*_args, **_kwargs):
        raise RuntimeError("the store went away")
    monkeypatch.setattr(engine, "replay_store", fail)
    r = invoke(store_trace, "--capacity-blocks", 3, "--policy", "lru")
    assert r.exit_code == 2 and "error: the store went away" in r.stderr
    assert list(tmp_path.glob("mooncake-valkey-*")) == []


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_cli_stopped_by_a_signal_removes_its_private_valkey_and_directory(tmp_path, signum):
    rows = [(i * SEC, [i % 500, 500 + i % 700], 1024) for i in range(30_000)]  # longer than the test waits
    trace = write_trace(tmp_path / "long.jsonl", rows)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("MOONCAKE_REDIS_URL", "MOONCAKE_DATA_DIR")}
    env["TMPDIR"] = str(tmp)
    proc = subprocess.Popen([sys.executable, "-m", "mooncake_redis.cli", "replay", str(trace), "--policy", "lru"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 60
        while not list(tmp.glob("mooncake-valkey-*/valkey.log")) and proc.poll() is None and time.monotonic() < end:
            time.sleep(0.02)  # waiting for the private Valkey to come up, not for a deadline
        (data,) = tmp.glob("mooncake-valkey-*")
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signum, err
    assert f"replay stopped by {signal.Signals(signum).name}" in err and "Traceback" not in err
    assert not data.exists() and list(tmp.iterdir()) == []


# ---- --check: the plain-Python model of the store --------------------------------------------------

@pytest.mark.parametrize("worker, want", [(False, NO_WORKER), (True, WITH_WORKER)], ids=["no-worker", "worker"])
def test_model_hand_computed(store_trace, worker, want):
    st = model_lru(engine.load_trace(store_trace), 3, block_bytes=1024, worker=worker)
    assert {k: getattr(st, k) for k in want} == want


def random_trace(rnd: random.Random, n: int, gaps: tuple[int, ...] = (0, 0, 500, 3000, 15_000)) -> list[engine.Request]:
    """Chains from a small tree (a block's id spells its path: one parent each), with gaps
    between requests drawn from `gaps` (by default 0 to 15 s: leases of 10 s run out or not)."""
    reqs, t = [], 0
    for _ in range(n):
        path = [rnd.randint(0, 2) for _ in range(rnd.randint(1, 8))]
        reqs.append(engine.Request(t, tuple(int("9" + "".join(map(str, path[:i + 1]))) for i in range(len(path)))))
        t += rnd.choice(gaps)
    return reqs


@pytest.mark.parametrize("seed,slack", [(1, 0), pytest.param(2, 0, marks=pytest.mark.slow), (3, 4_000)])
def test_model_agrees_with_the_store_on_random_traces(url, shards, seed, slack):
    """slack: the store's kv_lease_slack (the lru policy's knob lease_slack_ms), which the model
    applies too."""
    rnd = random.Random(seed)
    # with a slack, gaps that land reads within it and leases of 10 s + 4 s that outlast a request
    gaps = (0, 500, 3000, 9000, 12_000) if slack else (0, 0, 500, 3000, 15_000)
    reqs = random_trace(rnd, 40 if url.startswith("memory://") else 120, gaps)  # fakeredis runs Lua slowly
    chains = engine.Chains(reqs)
    config = MasterConfig(shards=shards, kv_lease_slack=slack)
    for capacity, worker in ((rnd.randint(4, 12), True), (rnd.randint(4, 12), False), (40, True)):
        store = engine.replay_store(url, reqs, Lru(lease_slack_ms=slack), capacity, block_bytes=1000, shards=shards,
                                    worker=worker, chains=chains)
        model = model_lru(reqs, capacity, block_bytes=1000, shards=shards, worker=worker, chains=chains,
                          config=config)
        fields = ("hits", "evictions", "orphan_evictions", "written", "puts_refused", "objects_left", "worker_evicted")
        assert {f: getattr(store, f) for f in fields} == {f: getattr(model, f) for f in fields}, (capacity, worker)


def test_cli_check(store_trace, monkeypatch):
    r = invoke(store_trace, "--capacity-blocks", 3, "--block-bytes", 1024, "--check", "--json")
    assert r.exit_code == 0, r.output
    c = json.loads(r.stdout)["check"]["lru"]
    assert c["agrees"] is True and c["block_hit_rate_difference"] == 0
    assert c["model"]["hits"] == WITH_WORKER["hits"] and c["model"]["evictions"] == WITH_WORKER["evictions"]
    r = invoke(store_trace, "--capacity-blocks", 3, "--block-bytes", 1024, "--check")
    assert r.exit_code == 0 and "check lru: store 22.22%, model 22.22% (difference +0.000 points: agrees" in r.stdout

    def off_by_one(requests, *args):
        st = model_lru(requests, *args)
        st.hits += 1
        return st

    monkeypatch.setitem(replay_model.MODELS, "lru", off_by_one)
    r = invoke(store_trace, "--capacity-blocks", 3, "--block-bytes", 1024, "--check")
    assert r.exit_code == 1 and "DISAGREES" in r.stdout and "check failed" in r.output


# ---- guaranteed: the online rule keeps a hot prefix that lru evicts ------------------------------

# capacity 4 blocks, no worker (evict-on-put only), requests 20 s apart; guaranteed: a block
# referenced by 2 requests within the window is hot (written with a guarantee, reads renew it)
HOT_TRACE = [
    (0 * SEC, [1], 512),               # 1 written (ordinary in both)
    (1 * SEC, [5, 6, 7, 8], 2048),     # 8 evicts 1 (lowest score): {5 6 7 8}
    (2 * SEC, [1], 512),               # 1 misses; now hot: guaranteed writes it with a guarantee; 5 goes
    (3 * SEC, [9, 10, 11, 12], 2048),  # 9 10 11 evict 6 7 8; 12: lru evicts 1, guaranteed has no candidate
    (4 * SEC, [1], 512),               # lru misses 1 (evicting 9); guaranteed hits it
]


@pytest.fixture
def hot_trace(tmp_path):
    return write_trace(tmp_path / "hot.jsonl", HOT_TRACE)


def test_guaranteed_keeps_the_hot_prefix_lru_evicts(url, hot_trace):
    reqs = engine.load_trace(hot_trace)
    lru = engine.replay_store(url, reqs, Lru(), 4, block_bytes=1024, worker=False)
    assert (lru.hits, lru.evictions, lru.puts_refused, lru.guaranteed_peak_bytes) == (0, 7, {}, 0)
    g = engine.replay_store(url, reqs, Guaranteed(requests=2, window_ms=600_000, ttl_ms=1_000_000), 4,
                            block_bytes=1024, worker=False)
    assert (g.hits, g.evictions, g.puts_refused) == (1, 5, {"NO_AVAILABLE_HANDLE": 1})
    assert g.guaranteed_peak_bytes == 1024 and g.requests_hit == 1


def test_guaranteed_rule_counts_distinct_requests_in_the_window():
    p = Guaranteed(requests=3, window_ms=1000, ttl_ms=5)
    p._note(engine.Request(0, (1, 1, 2)), 0)       # a request counts once per block
    p._note(engine.Request(0, (1,)), 500)
    assert p.hot == set()
    p._note(engine.Request(0, (1, 2)), 1000)       # 1: t=0, 500, 1000 within 1000 ms
    assert p.hot == {1}
    p._note(engine.Request(0, (1,)), 2001)         # t=0 and 500 and 1000 fell out
    assert p.hot == set()
    assert [c for _, c in p.put_batches(None, engine.Request(0, (1, 3)), [0, 1], 0)] == [None]


def test_cli_knobs(hot_trace):
    r = invoke(hot_trace, "--capacity-blocks", 4, "--block-bytes", 1024, "--no-worker", "--json",
               "--knob", "guaranteed.ttl_ms=1000000", "--knob", "guaranteed.requests=2")
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["policy_settings"]["guaranteed"]["knobs"] == {"requests": 2, "window_ms": 600_000, "ttl_ms": 1_000_000}
    assert res["policies"]["guaranteed"]["hits"] == 1 and res["policies"]["lru"]["hits"] == 0
    # hot: 1 at R3 (written with a guarantee) and at R5 (hit: its guarantee renewed)
    assert (res["policies"]["guaranteed"]["guaranteed_puts"], res["policies"]["guaranteed"]["guarantee_renewals"]) == (1, 1)
    for bad in ("guaranteed.nope=1", "guaranteed.requests", "lru.x=1", "guaranteed.requests=x", "guaranteed.requests=0"):
        r = invoke(hot_trace, "--knob", bad)
        assert r.exit_code == 2 and "--knob" in r.output and "Traceback" not in r.output, bad


# ---- progress ----------------------------------------------------------------------------------

class Stream(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_progress_on_a_terminal_and_off_it(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(engine.time, "monotonic", lambda: now[0])
    plain = engine.Progress("lru @ 3 blocks", 100, Stream(False))
    now[0] = 105.0
    plain(25)                    # past a second, but a plain line comes every 10 s
    now[0] = 110.0
    plain(50)
    plain.close()
    assert plain.stream.getvalue() == "  lru @ 3 blocks: 50/100 requests (50%), 5/s, ETA 10 s\n"

    now[0] = 200.0
    tty = engine.Progress("lru", 100, Stream(True))
    now[0] = 200.5
    tty(5)                       # under a second: nothing yet
    now[0] = 202.0
    tty(20)
    now[0] = 202.2
    tty(22)                      # under half a second since the last line
    now[0] = 204.0
    tty.close()
    assert tty.stream.getvalue() == ("\r  lru: 20/100 requests (20%), 10/s, ETA 8 s\x1b[K"
                                     "\r  lru: 100/100 requests (100%), 25/s\x1b[K\n")
    quiet = engine.Progress("lru", 100, None)
    quiet(50)
    quiet.close()


# ---- retained: a request's blocks, retained as a group, outlive an older ordinary block -----------

# capacity 4 blocks, no worker; retained knobs ms_per_output_token=1000, extra_ms=0, so a request
# with output_length n is retained n seconds. (time, blocks, input_length, output_length)
RETAIN_TRACE = [
    (0, [1, 2], 1024, 100),      # group r1 {1 2} retained until 100 s
    (20_000, [3], 512, 1),       # group r2 {3} retained until 21 s
    (40_000, [4, 5], 1024, 1),   # group r3 {4 5}; 5 needs room. lru evicts 1 (score 0: orphan-making, 2
                                 # stays); retained evicts r2 (3, ordinary again), never r1 (retained)
    (60_000, [1, 2], 1024, 1),   # retained hits 1 2; lru misses 1 (2 found past the miss), writes 1: 3 goes
]


@pytest.fixture
def retain_trace(tmp_path):
    path = tmp_path / "retain.jsonl"
    path.write_text("".join(json.dumps({"timestamp": ts, "input_length": n, "output_length": out, "hash_ids": ids})
                            + "\n" for ts, ids, n, out in RETAIN_TRACE))
    return path


def test_retained_keeps_the_requests_group(url, shards, retain_trace):
    reqs = engine.load_trace(retain_trace)
    assert [q.output_length for q in reqs] == [100, 1, 1, 1]
    if shards == 1:  # (with 4 shards each shard holds a slice: the hand count is for one)
        lru = engine.replay_store(url, reqs, Lru(), 4, block_bytes=1024, worker=False)
        assert (lru.hits, lru.evictions, lru.orphan_evictions) == (0, 2, 1)
    policy = Retained(ms_per_output_token=1000, extra_ms=0)
    r = engine.replay_store(url, reqs, policy, 4 * shards, block_bytes=1024, shards=shards, worker=False)
    if shards == 1:
        assert (r.hits, r.evictions, r.orphan_evictions, r.puts_refused, r.written) == (2, 1, 0, {}, 5)
        assert policy.figures() == {"groups_retained": 3, "retentions_refused": {}}
    else:  # one group per shard a request's new blocks route to
        assert policy.figures()["retentions_refused"] == {} and policy.figures()["groups_retained"] >= 3


def test_retained_groups_route_with_their_members(valkey):
    m = engine.Master.connect(valkey.url, engine.MasterConfig(namespace="rtag", shards=4))
    try:
        p = Retained()
        req = engine.Request(0, tuple(range(40)), output_length=10)
        batches = p.put_batches(m, req, list(range(40)), 0)
        assert sorted(j for idx, _ in batches for j in idx) == list(range(40)) and len(batches) == 4
        for idx, config in batches:
            shard = m.transport.shard_of(config.group_id.encode())
            assert {m.transport.shard_of(p.key(req.blocks[j])) for j in idx} == {shard}
        assert p.duration_ms(req) == 300 and Retained(0, 0).duration_ms(req) == 1
    finally:
        engine.delete_namespace(m.redis, "rtag")
        m.close()


# ---- combinations ----------------------------------------------------------------------------------

class _Part(Policy):
    def __init__(self, name, batches):
        self.name, self.batches = name, batches

    def put_batches(self, m, req, missing, now):
        return self.batches


def test_combined_merges_each_blocks_settings():
    a = _Part("a", [([0, 1], ReplicateConfig(guaranteed_ttl_ms=5)), ([2], None)])
    b = type("B", (_Part,), {})("b", [([0], ReplicateConfig(group_id="g1")), ([1, 2], ReplicateConfig(group_id="g2"))])
    got = Combined([a, b]).put_batches(None, engine.Request(0, (7, 8, 9)), [0, 1, 2], 0)
    assert sorted((idx, c) for idx, c in got) == [
        ([0], ReplicateConfig(guaranteed_ttl_ms=5, group_id="g1")),
        ([1], ReplicateConfig(guaranteed_ttl_ms=5, group_id="g2")),
        ([2], ReplicateConfig(group_id="g2"))]
    assert Combined([a, b]).name == "a+b"


def test_make_policy_combinations():
    p = make_policy("guaranteed+retained", {"guaranteed": {"ttl_ms": 7}, "retained": {"extra_ms": 3}})
    assert isinstance(p, Combined) and p.reader is p.parts[0] and p.name == "guaranteed+retained"
    assert p.knobs() == {"guaranteed.requests": 2, "guaranteed.window_ms": 600_000, "guaranteed.ttl_ms": 7,
                         "retained.ms_per_output_token": 30, "retained.extra_ms": 3}
    for bad in ("lru+lru", "lru+nope", "guaranteed+guaranteed"):
        with pytest.raises(ValueError):
            make_policy(bad)


def test_guaranteed_and_retained_together(url, hot_trace):
    # as guaranteed alone (HOT_TRACE above), but each request's blocks are one group (retained
    # 30 ms): R2's group {5 6 7 8} goes whole when R3 writes 1, so R4 finds room for 9 10 11
    p = make_policy("guaranteed+retained", {"guaranteed": {"ttl_ms": 1_000_000}})
    st = engine.replay_store(url, engine.load_trace(hot_trace), p, 4, block_bytes=1024, worker=False)
    assert (st.hits, st.evictions, st.puts_refused) == (1, 5, {"NO_AVAILABLE_HANDLE": 1})
    assert p.figures() == {"guaranteed_puts": 1, "guarantee_renewals": 1, "groups_retained": 4,
                           "retentions_refused": {}}


def test_cli_combination(hot_trace):
    r = invoke(hot_trace, "--capacity-blocks", 4, "--block-bytes", 1024, "--no-worker", "--json",
               "--policy", "guaranteed+retained", "--knob", "guaranteed.ttl_ms=1000000")
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert list(res["policies"]) == ["guaranteed+retained"] and res["policies"]["guaranteed+retained"]["hits"] == 1
    r = invoke(hot_trace, "--policy", "lru+lru")
    assert r.exit_code == 2 and "a combination joins" in r.output


@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_radix_model_agrees_with_the_store_on_random_traces(url, seed):
    """The radix policy (one shard): the store and model_radix agree eviction for eviction, and
    neither evicts a block another stored block extends."""
    from mooncake_redis.bench.replay_model import model_radix
    from mooncake_redis.bench.replay_policies import Radix

    rnd = random.Random(seed)
    reqs = random_trace(rnd, 40 if url.startswith("memory://") else 120)
    chains = engine.Chains(reqs)
    for capacity, worker in ((rnd.randint(4, 12), True), (rnd.randint(8, 12), False), (40, True)):
        store = engine.replay_store(url, reqs, Radix(), capacity, block_bytes=1000, shards=1, worker=worker,
                                    chains=chains)
        model = model_radix(reqs, capacity, block_bytes=1000, shards=1, worker=worker, chains=chains)
        fields = ("hits", "evictions", "orphan_evictions", "written", "puts_refused", "objects_left", "worker_evicted")
        assert {f: getattr(store, f) for f in fields} == {f: getattr(model, f) for f in fields}, (capacity, worker)
        assert store.orphan_evictions == 0
