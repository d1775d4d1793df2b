"""The CLI against a real Valkey: status, inspect, errors, bench wiring (`serve` as a process: test_serve.py)."""
from __future__ import annotations

import json
import re
import sys
import types

import pytest
import redis

from mooncake_redis import Master, MasterConfig, ReplicateConfig, SoftPinAction
from mooncake_redis.library import LIBRARY_PROTOCOL, library_source
from mooncake_redis.keys import shard_key, shard_of
from mooncake_redis.server import free_port
from mooncake_redis.worker import Worker

from helpers import T0, replicas_in
from helpers import run_cli as run


@pytest.fixture
def store(valkey_master):
    """A 2-shard store with two segments, a complete 2-replica object and an unfinished put."""
    m = valkey_master(shards=2)
    m.mount_segment("seg-a", 1 << 20, "client-1")
    m.mount_segment("seg-b", 1 << 20, "client-1")
    m.put_start("client-1", "k1", 4096, ReplicateConfig(replica_num=2, soft_pin_action=SoftPinAction.ENABLE))
    m.put_end("client-1", "k1")
    m.get_replica_list("k1")  # leases it until T0 + default_kv_lease_ttl
    m.put_start("client-1", "k2", 100)
    return m


# ---- status ----------------------------------------------------------------------------

def test_status(store, valkey):
    r = run("--redis", valkey.url, "status")
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "shards 2" in out
    assert f"version {library_source()[1]} protocol {LIBRARY_PROTOCOL} (same as this package)" in out
    assert "FROZEN at 2023-11-14T22:13:20.000Z (1700000000000 ms)" in out
    total = next(line for line in out.splitlines() if line.startswith("total"))
    assert total.split() == ["total", "2.0", "MiB", "8.1", "KiB", "0.4%", "2", "1", "0"]  # human units
    assert re.search(r"seg-a\s+client-1\s+1.0 MiB\s+\d", out) and "seg-b" in out
    assert "2 mounted" in out


def test_status_json(store, valkey):
    """Exact bytes and the documented fields (docs/json.md); parses as one JSON object."""
    r = run("--redis", valkey.url, "status", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["command"] == "status" and doc["format"] == 1
    assert doc["store"] == {"url": valkey.url, "namespace": "mc", "shards": 2}
    assert doc["functions"]["version"] == doc["functions"]["package_version"] == library_source()[1]
    assert doc["clock"] == {"now_ms": T0, "frozen_shards": [0, 1], "frozen_values_ms": [T0]}
    assert doc["total"] == {"capacity_bytes": 2 << 20, "used_bytes": 2 * 4096 + 100, "objects": 2,
                            "puts_in_progress": 1, "held_extents": 0, "guaranteed_bytes": 0,
                            "guaranteed_limit_bytes": 1 << 20}
    assert [s["shard"] for s in doc["shards"]] == [0, 1]
    assert sum(s["used_bytes"] for s in doc["shards"]) == 2 * 4096 + 100
    assert set(doc["shards"][0]) == {
        "shard", "node", "capacity_bytes", "used_bytes", "objects", "puts_in_progress", "held_extents", "candidates",
        "guaranteed_bytes", "guaranteed_limit_bytes", "soft_pinned_candidates", "candidates_by_tier", "claimed_by", "last_pass_ms", "evicted_objects_total", "evicted_bytes_total",
        "discarded_puts_total", "clients_expired_total"}
    assert {s["client"] for s in doc["segments"]} == {"client-1"}
    assert [(s["name"], s["size_bytes"]) for s in doc["segments"]] == [("seg-a", 1 << 20), ("seg-b", 1 << 20)]
    assert sum(s["used_bytes"] for s in doc["segments"]) == 2 * 4096 + 100


def test_status_shows_the_disk_tier(store, valkey):
    store.mount_local_disk_segment("client-1")
    store.report_ssd_capacity("client-1", 1 << 30)
    store.put_start("client-1", "d", 3000)
    store.put_end("client-1", "d")
    store.notify_offload_success("client-1", ["d"], ["/disk/d"])
    doc = json.loads(run("--redis", valkey.url, "status", "--json").stdout)
    (c,) = doc["offload"]["clients"]
    assert (c["client"], c["used_bytes"], c["capacity_bytes"], c["inflight_bytes"], c["removals"]) == \
        ("client-1", 3000, 1 << 30, 0, 0)
    assert {"deferred", "orphaned"} <= set(doc["offload"]["counters"])
    out = run("--redis", valkey.url, "status").stdout
    line = next(x for x in out.splitlines() if x.strip().startswith("client-1") and "yes" in x)
    assert line.split()[:6] == ["client-1", "yes", "2.9", "KiB", "1.0", "GiB"]
    assert "orphaned files 0" in out


def test_status_envvar_and_unfrozen_clock(store, valkey):
    store.unfreeze_clock()
    r = run("status", env={"MOONCAKE_REDIS_URL": valkey.url})
    assert r.exit_code == 0, r.output
    assert "server TIME (not frozen)" in r.stdout


def test_status_without_store_exits_1_and_writes_nothing(valkey):
    client = redis.Redis.from_url(valkey.url)
    client.flushall()
    r = run("--redis", valkey.url, "status")
    assert r.exit_code == 1
    assert "no store under namespace 'mc'" in r.stderr
    assert client.dbsize() == 0


def test_status_other_namespace(valkey):
    redis.Redis.from_url(valkey.url).flushall()
    Master.connect(valkey.url, MasterConfig(namespace="ns2", shards=3)).close()
    assert run("--redis", valkey.url, "status").exit_code == 1  # nothing under "mc"
    r = run("--redis", valkey.url, "--namespace", "ns2", "status")
    assert r.exit_code == 0, r.output
    assert "namespace ns2  shards 3" in r.stdout


def test_status_warns_when_no_worker_has_run_recently(store, valkey):
    def warnings():
        r = run("--redis", valkey.url, "status", "--json")
        assert r.exit_code == 0, r.output
        return [w for w in json.loads(r.stdout)["warnings"] if w["kind"] == "no_recent_worker"]

    (w,) = warnings()  # no worker ever ran on this store
    assert w["shards"] == [0, 1] and w["silence_ms"] == 10_000 and "(no pass yet)" in w["message"]
    r = run("--redis", valkey.url, "status")
    assert r.stdout.splitlines()[1].startswith("WARNING    no worker has run on shard(s) 0, 1 in the last 10.0 s")
    Worker(store).run_once()
    assert warnings() == []
    store.advance_clock(10_000)
    assert warnings() == []  # 10 s: still recent
    store.advance_clock(1)
    (w,) = warnings()
    assert w["shards"] == [0, 1] and "(last pass 10.0 s ago)" in w["message"]
    r = run("--redis", valkey.url, "status")
    assert r.exit_code == 0 and "abandoned puts, client expiry and eviction wait" in r.stdout


def test_status_warns_about_a_maxmemory_policy_that_may_delete_store_keys(store, valkey):
    client = redis.Redis.from_url(valkey.url)
    try:
        doc = json.loads(run("--redis", valkey.url, "status", "--json").stdout)
        assert doc["maxmemory_policy"] == [{"node": None, "policy": "noeviction", "unreadable": None}]
        assert not [w for w in doc["warnings"] if w["kind"].startswith("maxmemory")]
        client.config_set("maxmemory-policy", "allkeys-lru")
        r = run("--redis", valkey.url, "status")
        assert r.exit_code == 0, r.output
        assert "WARNING    maxmemory-policy allkeys-lru: under memory pressure Redis may delete store keys" in r.stdout
        assert "server     maxmemory-policy allkeys-lru" in r.stdout
        doc = json.loads(run("--redis", valkey.url, "status", "--json").stdout)
        (w,) = [w for w in doc["warnings"] if w["kind"] == "maxmemory_policy"]
        assert (w["node"], w["policy"]) == (None, "allkeys-lru")
    finally:
        client.config_set("maxmemory-policy", "noeviction")
        client.close()


def test_status_says_when_it_cannot_read_the_policy(store, valkey):
    client = redis.Redis.from_url(valkey.url)
    client.acl_setuser("no-config", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-config"])
    try:
        user = valkey.url.replace("redis://", "redis://no-config:pw@")
        r = run("--redis", user, "status", "--json")
        assert r.exit_code == 0, r.output
        (w,) = [w for w in json.loads(r.stdout)["warnings"] if w["kind"] == "maxmemory_policy_unknown"]
        assert "make sure it is noeviction" in w["message"]
    finally:
        client.acl_deluser("no-config")
        client.close()


# ---- inspect ---------------------------------------------------------------------------

def test_inspect_found(store, valkey):
    r = run("--redis", valkey.url, "inspect", "k1")
    assert r.exit_code == 0, r.output
    out = r.stdout
    shard = shard_of(b"k1", 2)
    assert f"redis key {shard_key('mc', shard)}:obj:default:k1" in out
    assert re.search(r"^size\s+4096 ", out, re.M)
    assert re.search(r"^status\s+complete$", out, re.M)
    assert re.search(r"^writer\s+client-1$", out, re.M)
    assert "put started" not in out  # only while the put is in progress (test_cli_ops shows one)
    assert "lease        2023-11-14T22:13:30.000Z (1700000010000 ms), active, 10.0 s left" in out
    assert "soft pin     2023-11-14T22:43:20.000Z (1700001800000 ms), active, 30.0 min left" in out
    assert re.search(r"^hard pin\s+no$", out, re.M)
    assert re.search(r"^group\s+none$", out, re.M)
    assert "replicas     2 live" in out and re.search(r"^  seg-a  offset \d+  size 4096  complete$", out, re.M)


BINARY_KEY = b"blk\xff\xfe/7"  # not UTF-8: printed as blk\xff\xfe/7


def test_inspect_takes_a_key_that_is_not_utf8_as_printed_or_in_hex(store, valkey):
    store.put_start("client-1", BINARY_KEY, 512)
    store.put_end("client-1", BINARY_KEY)
    escaped = BINARY_KEY.decode(errors="backslashreplace")
    assert escaped == "blk\\xff\\xfe/7"
    for args in ((escaped,), ("--hex", BINARY_KEY.hex()), ("--hex", BINARY_KEY.hex().upper()),
                 (BINARY_KEY.decode("utf-8", "surrogateescape"),)):  # the bytes as a shell passes them
        r = run("--redis", valkey.url, "inspect", *args)
        assert r.exit_code == 0, (args, r.output)
        assert re.search(rf"^key\s+{re.escape(escaped)}   \(not UTF-8; hex {BINARY_KEY.hex()}\)$", r.stdout, re.M)
        assert re.search(r"^size\s+512 ", r.stdout, re.M)
    doc = json.loads(run("--redis", valkey.url, "inspect", escaped, "--json").stdout)
    assert (doc["key"], doc["key_hex"], doc["size_bytes"]) == (escaped, BINARY_KEY.hex(), 512)
    assert doc["redis_key"].endswith(":obj:default:" + escaped)


def test_inspect_prefers_the_key_as_typed_over_its_escapes(store, valkey):
    literal = "lit\\x41"  # a key that really is backslash, x, 4, 1
    store.put_start("client-1", literal, 100)
    store.put_end("client-1", literal)
    store.put_start("client-1", "litA", 200)
    store.put_end("client-1", "litA")
    doc = json.loads(run("--redis", valkey.url, "inspect", literal, "--json").stdout)
    assert (doc["key"], doc["size_bytes"]) == (literal, 100)
    store.remove(literal)
    doc = json.loads(run("--redis", valkey.url, "inspect", literal, "--json").stdout)
    assert (doc["key"], doc["size_bytes"]) == ("litA", 200)  # then the key its escapes spell


def test_inspect_hex_errors(store, valkey):
    r = run("--redis", valkey.url, "inspect", "--hex", "6bz")
    assert r.exit_code == 2 and "is not hex" in r.stderr
    r = run("--redis", valkey.url, "inspect", "--hex", "--group", "g")
    assert r.exit_code == 2 and "--hex is for an object KEY" in r.stderr
    r = run("--redis", valkey.url, "inspect", "--hex", "6bff", "--json")
    assert r.exit_code == 1 and json.loads(r.stdout) == {"command": "inspect", "format": 1, "key": "k\\xff",
                                                         "tenant": "default", "found": False}
    assert "not found: object 'k\\\\xff'" in r.stderr


def test_inspect_processing_group_and_expired_lease(store, valkey):
    group = next(f"g{i}" for i in range(100) if shard_of(f"g{i}".encode(), 2) == shard_of(b"k3", 2))
    store.put_start("client-1", "k3", 10, ReplicateConfig(with_hard_pin=True, group_id=group),
                    tenant_id="t1")
    store.advance_clock(60_000)
    r = run("--redis", valkey.url, "inspect", "k3", "--tenant", "t1")
    assert r.exit_code == 0, r.output
    assert re.search(r"^status\s+processing$", r.stdout, re.M)
    assert re.search(rf"^group\s+{group}$", r.stdout, re.M)
    assert re.search(r"^hard pin\s+yes$", r.stdout, re.M)
    assert re.search(r"^lease\s+none$", r.stdout, re.M)
    r = run("--redis", valkey.url, "inspect", "k1")
    assert "expired 50.0 s ago" in r.stdout


def test_inspect_raw(store, valkey):
    r = run("--redis", valkey.url, "inspect", "k2", "--raw")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0] == f"# HGETALL {shard_key('mc', shard_of(b'k2', 2))}:obj:default:k2"
    fields = dict(line.split(" ", 1) for line in lines[1:])
    assert fields["size"] == "100" and fields["status"] == "processing"
    # the hash as stored: a put's start is its P:processing score, a default action is not written
    assert "put_started" not in fields and "soft_pin_action" not in fields
    assert [seg[:4] for seg in replicas_in(fields)] == ["seg-"]


def test_inspect_shows_dead_replicas(store, valkey):
    # unmount seg-b on every shard without the sweep that Master.unmount_segment runs after it
    client = redis.Redis.from_url(valkey.url)
    for i in range(2):
        client.execute_command("FCALL", "mc_unmount_segment", 1, shard_key("mc", i), 2, "name", "seg-b", "client_id", "client-1")
    r = run("--redis", valkey.url, "inspect", "k1")
    assert r.exit_code == 0, r.output
    assert "replicas     1 live, 1 dead" in r.stdout
    assert re.search(r"^  seg-b  offset \d+  dead", r.stdout, re.M)


def test_inspect_not_found_exits_1(store, valkey):
    r = run("--redis", valkey.url, "inspect", "nope")
    assert r.exit_code == 1
    assert "not found: object 'nope'" in r.stderr
    r = run("--redis", valkey.url, "inspect", "k1", "--tenant", "other")
    assert r.exit_code == 1


# ---- bad input and errors --------------------------------------------------------------

def test_bad_tenant_is_a_master_error_exit_2(store, valkey):
    r = run("--redis", valkey.url, "inspect", "k1", "--tenant", "no spaces")
    assert r.exit_code == 2
    assert r.stderr.startswith("error INVALID_PARAMS (-600): tenant_id must match")


def test_bad_namespace_exit_2(valkey):
    r = run("--redis", valkey.url, "--namespace", "a b", "status")
    assert r.exit_code == 2
    assert "error INVALID_PARAMS (-600)" in r.stderr


def test_usage_errors_exit_2(valkey, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ./mooncake-data/url either
    assert run("status").exit_code == 2  # no URL
    assert run("--redis", valkey.url, "inspect").exit_code == 2  # no KEY
    assert run("serve", "--shards", "zero").exit_code == 2
    assert run("--redis", "http://example", "status").exit_code == 2
    r = run("--redis", valkey.url, "serve", "--port", "7000")
    assert r.exit_code == 2 and "cannot be used with --redis" in r.stderr


def test_unreachable_redis_exit_2():
    url = f"redis://127.0.0.1:{free_port()}/0"
    r = run("--redis", url, "status")
    assert r.exit_code == 2
    assert r.stderr.startswith(f"error: cannot reach Redis at {url}")


def test_password_is_masked_in_messages():
    url = f"redis://user:secret@127.0.0.1:{free_port()}/0"
    r = run("--redis", url, "status")
    assert r.exit_code == 2 and "secret" not in r.stderr and "user:***@127.0.0.1" in r.stderr


def test_serve_with_redis_refuses_other_shard_count(store, valkey):
    r = run("--redis", valkey.url, "serve", "--shards", "3")
    assert r.exit_code == 2
    assert "error INVALID_PARAMS (-600): store 'mc' has 2 shards, --shards says 3" in r.stderr


# ---- bench -----------------------------------------------------------------------------

@pytest.fixture
def fake_bench(monkeypatch):
    calls = []

    def main(url, n, shards, out, expire_sizes):
        assert redis.Redis.from_url(url).ping()
        assert expire_sizes == (10_000, 1_000_000)  # the default
        calls.append((url, n, shards))
        out("fake bench done")

    monkeypatch.setitem(sys.modules, "mooncake_redis.bench.ops", types.SimpleNamespace(main=main))
    return calls


def test_bench_ops_with_redis(fake_bench, valkey):
    r = run("--redis", valkey.url, "bench", "ops", "--n", "5", "--shards", "4")
    assert r.exit_code == 0, r.output
    assert fake_bench == [(valkey.url, 5, 4)] and "fake bench done" in r.stdout
    r = run("--redis", valkey.url, "bench", "ops", "--expire-sizes", "10,x")
    assert r.exit_code == 2 and "--expire-sizes" in r.output and "Traceback" not in r.output


def test_bench_ops_does_not_follow_the_environment_url(fake_bench, valkey):
    """MOONCAKE_REDIS_URL names the shell's server, not one to write and empty a scratch namespace on."""
    r = run("bench", "ops", env={"MOONCAKE_REDIS_URL": valkey.url})
    assert r.exit_code == 0, r.output
    assert fake_bench[0][0] != valkey.url and "MOONCAKE_REDIS_URL is not used" in r.stderr
    r = run("bench", "ops", "--redis", valkey.url, env={"MOONCAKE_REDIS_URL": valkey.url})
    assert r.exit_code == 0 and fake_bench[1][0] == valkey.url  # --redis on the command line: that server


def test_bench_ops_private_valkey(fake_bench):
    r = run("bench", "ops")
    assert r.exit_code == 0, r.output
    (url, n, shards), = fake_bench
    assert (n, shards) == (20000, 1) and url != ""
    with pytest.raises(redis.ConnectionError):  # the private server is gone
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()


# ---- --redis and --namespace after the command's name ---------------------------------------

def test_serve_takes_redis_after_its_name(store, valkey):
    r = run("serve", "--redis", valkey.url, "--shards", "3")
    assert r.exit_code == 2, r.output
    assert "error INVALID_PARAMS (-600): store 'mc' has 2 shards, --shards says 3" in r.stderr
    r = run("serve", "--redis", valkey.url, "--port", "7000")
    assert r.exit_code == 2 and "cannot be used with --redis" in r.stderr


def test_worker_takes_redis_and_namespace_after_its_name(store, valkey):
    r = run("worker", "--redis", valkey.url, "--namespace", "other")
    assert r.exit_code == 1, r.output  # it reached the server, and looked under the namespace given
    assert f"no store under namespace 'other' at {valkey.url}" in r.stderr


def test_redis_after_the_name_wins_over_the_one_before(store, valkey):
    unreachable = f"redis://127.0.0.1:{free_port()}/0"
    r = run("--redis", unreachable, "status", "--redis", valkey.url, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["store"]["shards"] == 2
    r = run("--redis", valkey.url, "--namespace", "other", "status", "--namespace", "mc")
    assert r.exit_code == 0, r.output
    r = run("status", "--redis", valkey.url, env={"MOONCAKE_REDIS_URL": unreachable})
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("where", ["before", "after", "env"])
def test_a_url_with_an_unknown_query_parameter_is_a_usage_error(where):
    url = "redis://:secret@h/0?foo=1"
    args, env = {"before": ((("--redis", url, "status")), None), "after": (("status", "--redis", url), None),
                 "env": (("status",), {"MOONCAKE_REDIS_URL": url})}[where]
    r = run(*args, env=env)
    assert r.exit_code == 2, r.output
    assert "unknown query parameter 'foo'" in r.stderr and "Traceback" not in r.output
    assert "secret" not in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)


# ---- a server that wants a password --------------------------------------------------------

@pytest.fixture
def locked(server):
    """A server (`server`: valkey or redis) that requires the password `sekrit`."""
    from conftest import REDIS_SERVER
    from mooncake_redis.server import EmbeddedValkey

    if server == "redis" and not REDIS_SERVER:
        pytest.skip("redis-server is not installed")
    locked = EmbeddedValkey(appendonly=False, password="sekrit",
                            binary=REDIS_SERVER if server == "redis" else None).start()
    yield locked
    locked.stop()


@pytest.mark.parametrize("server", ["valkey", "redis"])
def test_a_missing_password_is_named_as_such(locked):
    for url in (f"redis://127.0.0.1:{locked.port}/0", f"redis://127.0.0.1:{locked.port}/0?protocol=3"):
        r = run("--redis", url, "status")
        assert r.exit_code == 2, r.output
        assert r.stderr == (f"error: Redis at {url}: this server needs a password (see ./mooncake-data/password "
                            f"or the url file ./mooncake-data/url, which holds the whole URL)\n")
        assert "HELLO" not in r.stderr and "AUTH" not in r.stderr


@pytest.mark.parametrize("server", ["valkey", "redis"])
def test_a_wrong_password_is_named_as_such(locked, tmp_path):
    url = f"redis://:not-it@127.0.0.1:{locked.port}/0"
    r = run("--redis", url, "status")
    assert r.exit_code == 2, r.output
    assert "this server refused the URL's password or user" in r.stderr and "not-it" not in r.stderr
    (tmp_path / "url").write_text(url + "\n")  # a url file of another serve
    r = run("status", env={"MOONCAKE_DATA_DIR": str(tmp_path)})
    assert r.exit_code == 2, r.output
    assert f"see {tmp_path}/password or the url file {tmp_path}/url" in r.stderr
    r = run("--redis", f"redis://:sekrit@127.0.0.1:{locked.port}/0", "status")
    assert r.exit_code == 1 and "no store under namespace" in r.stderr  # the right one gets in


def test_status_reads_the_policy_of_every_primary_of_a_cluster(valkey_cluster):
    from helpers import flush

    flush(valkey_cluster.url)
    Master.connect(valkey_cluster.url, MasterConfig(shards=16)).close()
    r = run("--redis", valkey_cluster.url, "status", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert sorted(p["node"] for p in doc["maxmemory_policy"]) == sorted(f"127.0.0.1:{n.port}"
                                                                        for n in valkey_cluster.nodes[:3])
    assert {p["policy"] for p in doc["maxmemory_policy"]} == {"noeviction"}
    assert [w["kind"] for w in doc["warnings"]] == ["no_recent_worker"]
