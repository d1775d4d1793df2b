"""The CLI's radix index: `inspect --node` and the radix lines of `status`."""
from __future__ import annotations

import hashlib
import json

import pytest

from mooncake_redis import ReplicateConfig

from helpers import run_cli as run

A, B = hashlib.sha256(b"a").hexdigest(), hashlib.sha256(b"b").hexdigest()


@pytest.fixture
def store(valkey_master):
    m = valkey_master(shards=2, enable_radix_tree=True)
    m.mount_segment("seg", 1 << 20, "c")
    for key, parent in ((f"{A}_0", None), (f"{B}_0", A), (f"{B}_1", A)):
        m.put_start("c", key, 100, ReplicateConfig(parent_block_hash=parent))
        m.put_end("c", key)
    return m


def test_inspect_node_and_status(store, valkey):
    r = run("--redis", valkey.url, "inspect", "--node", A)
    assert r.exit_code == 0, r.output
    assert f"parent       none (a root)" in r.output and f"  {B}" in r.output
    assert "eviction: has_children" in r.output
    r = run("--redis", valkey.url, "inspect", "--node", B, "--json")
    doc = json.loads(r.stdout)
    assert doc["parent"] == A and doc["keys"] == [f"{B}_0", f"{B}_1"] and doc["why"] == "" and not doc["shell"]
    r = run("--redis", valkey.url, "inspect", "--node", "f" * 64)
    assert r.exit_code == 1 and "not found: radix node" in r.output
    r = run("--redis", valkey.url, "inspect", "k", "--node", A)
    assert r.exit_code == 2
    r = run("--redis", valkey.url, "status")
    assert r.exit_code == 0, r.output
    assert "radix      on: 2 node(s), 0 shell(s), 1 leaf/leaves, 0 outbox entr(y/ies)" in r.output
    doc = json.loads(run("--redis", valkey.url, "status", "--json").stdout)
    assert {k: doc["radix"][k] for k in ("enabled", "nodes", "shells", "leaves", "outbox")} == {
        "enabled": True, "nodes": 2, "shells": 0, "leaves": 1, "outbox": 0}
