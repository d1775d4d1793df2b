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
