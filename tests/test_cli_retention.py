"""The CLI's group retention: `retain`, the retention lines of `status`, `inspect --group`."""
from __future__ import annotations

import json

import pytest

from mooncake_redis import ReplicateConfig

from helpers import T0
from helpers import run_cli as run


@pytest.fixture
def store(valkey_master):
    m = valkey_master(shards=2, max_retained_groups=6)
    m.mount_segment("seg", 1 << 20, "c")
    return m


def test_retain_status_and_inspect_group(store, valkey):
    r = run("--redis", valkey.url, "retain", "g1", "g2", "--ttl", "10m")
    assert r.exit_code == 0, r.output
    assert f"g1  retained until 2023-11-14T22:23:20.000Z ({T0 + 600_000} ms)" in r.output
    assert store.describe_group("g2").retained_until_ms == T0 + 600_000
    store.put_start("c", "{g1}/a", 100, ReplicateConfig(group_id="g1"))
    store.put_end("c", "{g1}/a")

    r = run("--redis", valkey.url, "status")
    assert r.exit_code == 0, r.output
    assert "retention  2 active retained group(s) of at most 6 (per tenant 6)" in r.output
    assert "per shard (active/share): 0:" in r.output

    r = run("--redis", valkey.url, "inspect", "--group", "g1")
    assert r.exit_code == 0, r.output
    assert "members      1" in r.output
    assert f"retention    2023-11-14T22:23:20.000Z ({T0 + 600_000} ms), active, 10.0 min left" in r.output
    assert "eviction     evictable, tier retained" in r.output
    r = run("--redis", valkey.url, "inspect", "--group", "g2")
    assert "members      0" in r.output and "protected (no_members)" in r.output


def test_retain_refusals_exit_1_and_usage_errors_exit_2(store, valkey):
    r = run("--redis", valkey.url, "retain", *[f"g{i}" for i in range(20)], "--ttl", "1h", "--tenant", "t")
    assert r.exit_code == 1
    assert "refused: RETENTION_LIMIT_EXCEEDED (-10003)" in r.output
    for args in (["retain", "g", "--ttl", "ten"], ["retain", "--ttl", "1m"], ["retain", "g"],
                 ["inspect"], ["inspect", "k", "--group", "g"]):
        r = run("--redis", valkey.url, *args)
        assert r.exit_code == 2, (args, r.output)
        assert "Traceback" not in r.output
    r = run("--redis", valkey.url, "retain", "g", "--ttl", "25h")  # above max_group_retention
    assert r.exit_code == 2 and "INVALID_PARAMS" in r.output
    r = run("--redis", valkey.url, "inspect", "--group", "nothing")
    assert r.exit_code == 1 and "not found: group 'nothing'" in r.output


def test_status_and_inspect_group_json(store, valkey):
    assert run("--redis", valkey.url, "retain", "g1", "--ttl", "90s").exit_code == 0
    doc = json.loads(run("--redis", valkey.url, "status", "--json").stdout)
    ret = doc["retention"]
    assert (ret["active_groups"], ret["held_slots"], ret["limit"], ret["tenant_limit"]) == (1, 1, 6, 6)
    assert [s["shard"] for s in ret["shards"]] == [0, 1] and sum(s["share"] for s in ret["shards"]) == 6
    doc = json.loads(run("--redis", valkey.url, "inspect", "--group", "g1", "--json").stdout)
    assert doc["command"] == "inspect" and doc["found"] is True
    assert (doc["members"], doc["retained_until_ms"], doc["lease_until_ms"], doc["protected_by"], doc["tier"]) == \
        (0, T0 + 90_000, None, "no_members", None)
    assert doc["fields"] == {"retained_until": str(T0 + 90_000)}
    r = run("--redis", valkey.url, "inspect", "--group", "nothing", "--json")
    assert r.exit_code == 1 and json.loads(r.stdout) == {"command": "inspect", "format": 1, "group": "nothing",
                                                        "tenant": "default", "found": False}


def test_retain_json(store, valkey):
    r = run("--redis", valkey.url, "retain", "g1", "g2", "--ttl", "10m", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == {
        "command": "retain", "format": 1, "tenant": "default", "ttl_ms": 600_000,
        "groups": [{"group": g, "retained_until_ms": T0 + 600_000, "refused": None, "code": None}
                   for g in ("g1", "g2")]}
    r = run("--redis", valkey.url, "retain", *[f"h{i}" for i in range(20)], "--ttl", "1h", "--tenant", "t", "--json")
    assert r.exit_code == 1  # as the text output: some were refused
    groups = json.loads(r.stdout)["groups"]
    refused = [g for g in groups if g["refused"]]
    assert refused and all(g["refused"] == "RETENTION_LIMIT_EXCEEDED" and g["code"] == -10003
                           and g["retained_until_ms"] is None for g in refused)
    assert all(g["retained_until_ms"] == T0 + 3_600_000 for g in groups if not g["refused"])
