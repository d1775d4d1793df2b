"""One typed reader of a shard's figures (Master.shard_stats), used by `status` and the metrics:
it covers every eviction tier the library has, so a tier added to Lua's Units.TIERS and not to
mooncake_redis.keys.TIERS fails here."""
from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from helpers import OWNER, WRITER, T0, run_cli
from mooncake_redis import ReplicateConfig
from mooncake_redis.keys import TIERS
from mooncake_redis.metrics import exposition

UNITS = Path(__file__).resolve().parents[1] / "lua" / "lib" / "30_units.lua"


def lua_tiers() -> list[str]:
    """The K names of Units.TIERS, in order."""
    source = UNITS.read_text()
    names = dict(re.findall(r"(TIER_[A-Z_]+)\s*=\s*K\.(\w+)", source.replace("local ", "")))
    # multiple assignment: local A, B = K.a, K.b
    for lhs, rhs in re.findall(r"local ((?:TIER_[A-Z_]+, )*TIER_[A-Z_]+)[^=\n]*= ([^\n]+)", source):
        for name, value in zip(lhs.split(", "), rhs.split(", ")):
            if value.startswith("K."):
                names[name] = value[2:]
    order = re.search(r"^local TIERS = \{([^}]*)\}", source, re.M).group(1)
    return [names[n.strip()] for n in order.split(",")]


def test_the_reader_covers_every_tier_of_the_library():
    assert lua_tiers() == [attr for _, attr in TIERS]


def test_status_and_metrics_show_every_tier(new_master, valkey):
    m = new_master(shards=1, default_kv_lease_ttl=1000)
    m.mount_segment("seg", 1 << 20, OWNER)
    m.put_start(WRITER, "plain", 100)
    m.put_end(WRITER, "plain")
    m.put_start(WRITER, "member", 100, ReplicateConfig(group_id="g"))
    m.put_end(WRITER, "member")
    assert m.retain_groups(["g"], 600_000)[0] > 0
    [stats] = m.shard_stats()
    assert set(stats.candidates) == {name for name, _ in TIERS}
    assert stats.candidates["ordinary"] == 1 and stats.candidates["retained"] == 1
    assert stats.objects == 2 and stats.clock_ms == T0
    if m.redis.connection_pool.connection_kwargs.get("port") == valkey.port:  # the CLI reads a real server
        doc = json.loads(run_cli("--redis", valkey.url, "status", "--json").stdout)
        assert doc["shards"][0]["candidates_by_tier"] == stats.candidates
    samples = {(s.labels["tier"], s.value) for f in text_string_to_metric_families(exposition(m))
               if f.name == "mooncake_shard_eviction_candidates" for s in f.samples}
    assert samples == {(name, n) for name, n in stats.candidates.items()}


def test_malformed_figures_are_reported_not_raised(new_master, valkey, caplog):
    """A figure that is not an integer (a hand edit: `HSET P used_bytes notanumber`) reads as 0
    everywhere Python reads it, is listed in ShardStats.malformed, logged once as a warning, and
    counted in the metrics (whose own series of it is left out) instead of a traceback; status
    prints the warning on stderr and exits 0."""
    import subprocess
    import sys

    m = new_master(shards=1)
    m.mount_segment("seg", 1 << 20, OWNER)
    m.put_start(WRITER, "plain", 100)
    m.put_end(WRITER, "plain")
    p = m.transport.keys[0]
    m.redis.hset(p.P, mapping={"used_bytes": "notanumber", "offload_done": "x"})
    m.redis.hset(p.metrics, mapping={"passes_total": "zz", "last_worker": "w", "last_pass_ms": T0})
    m.redis.hset(p.segment("seg"), "used", "1e3")
    with caplog.at_level("WARNING", logger="mooncake_redis.figures"):
        [stats] = m.shard_stats()
        assert stats.malformed == {"P.used_bytes": "notanumber", "P.offload_done": "x",
                                   "P:metrics.passes_total": "zz"}
        assert stats.used_bytes == 0 and stats.objects == 1
        assert "passes_total" not in stats.worker_figures and stats.worker_figures["last_worker"] == "w"
        assert m.usage().used_bytes == 0
        assert [s["used"] for s in m.segments()] == [0]
        assert m.offload_counters()["done"] == 0
        text = exposition(m)
        m.shard_stats()  # a second reader's pass warns no more
    warned = [r.getMessage() for r in caplog.records if r.name == "mooncake_redis.figures"]
    assert sorted(w.split(" is malformed")[0] for w in warned) == [
        "shard 0: P.offload_done", "shard 0: P.used_bytes", "shard 0: P:metrics.passes_total", "shard 0: P:seg:seg.used"]
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert [s.value for s in families["mooncake_up"].samples] == [1]
    assert [(s.labels, s.value) for s in families["mooncake_shard_malformed_figures"].samples] == [({"shard": "0"}, 3)]
    assert families["mooncake_shard_used_bytes"].samples == []  # read as 0: not exported as 0
    assert [s.value for s in families["mooncake_shard_objects"].samples] == [1]
    assert families["mooncake_worker_passes"].samples == []
    # repaired by hand, then corrupted again: it warns again
    caplog.clear()
    m.redis.hset(p.P, "used_bytes", 100)
    assert "P.used_bytes" not in m.shard_stats()[0].malformed
    m.redis.hset(p.P, "used_bytes", "again")
    with caplog.at_level("WARNING", logger="mooncake_redis.figures"):
        m.shard_stats()
    assert any("P.used_bytes" in r.getMessage() for r in caplog.records)
    if m.redis.connection_pool.connection_kwargs.get("port") == valkey.port:  # the CLI reads a real server
        for args in (["status"], ["status", "--json"], ["metrics"]):
            r = subprocess.run([sys.executable, "-m", "mooncake_redis.cli.main", "--redis", valkey.url, *args],
                               capture_output=True, text=True, timeout=60)
            assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
            assert "shard 0: P.used_bytes is malformed ('again', not an integer)" in r.stderr, r.stderr
        doc = json.loads(subprocess.run([sys.executable, "-m", "mooncake_redis.cli.main", "--redis", valkey.url,
                                         "status", "--json"], capture_output=True, text=True, timeout=60).stdout)
        assert doc["shards"][0]["used_bytes"] == 0 and doc["shards"][0]["objects"] == 1
