"""The unchanged Mooncake client (mooncake-transfer-engine-non-cuda 0.3.13.post1) against the
gateway, each client in its own process (tests/mooncake_session.py), beside Mooncake's own
mooncake_master in the same test: the same scenario must give the same answers on every call.
Real bytes move between real transfer engines over TCP; the store is a real Valkey. Skipped
with the reason where Mooncake's client cannot be loaded (libibverbs missing, no wheel)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from mooncake_redis import Master, MasterConfig
from mooncake_redis.bench.mooncake import MooncakeMaster, MooncakeUnavailable, find_mooncake
from mooncake_redis.gateway.server import GatewayThread, Listeners
from mooncake_redis.gateway.store import GatewayStore
from mooncake_redis.server import EmbeddedValkey, free_port

try:
    _, MOONCAKE_MASTER = find_mooncake()
    UNAVAILABLE = ""
except MooncakeUnavailable as exc:
    MOONCAKE_MASTER, UNAVAILABLE = "", str(exc)

pytestmark = [pytest.mark.skipif(bool(UNAVAILABLE), reason=UNAVAILABLE), pytest.mark.slow]

SESSION = str(Path(__file__).with_name("mooncake_session.py"))
ENV = {**os.environ, "MC_TCP_BIND_ADDRESS": "127.0.0.1", "MC_STORE_MEMCPY": "0"}  # bytes go by TCP


def run_session(scenario: str, master: str, metadata: str, timeout: float = 120,
                segment_mib: int = 64, *extra: str) -> list[tuple[str, object]]:
    proc = subprocess.run([sys.executable, SESSION, scenario, master, metadata, str(segment_mib), *extra], env=ENV,
                          capture_output=True, text=True, timeout=timeout)
    steps = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0, f"client exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return [(s["step"], s["result"]) for s in steps]


class Client:
    """A long-running client process (provider, writes) with its output read line by line."""

    def __init__(self, scenario: str, master: str, metadata: str):
        self.proc = subprocess.Popen([sys.executable, SESSION, scenario, master, metadata], env=ENV, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def next_step(self, timeout: float = 60) -> tuple[str, object]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError(f"client ended (exit {self.proc.poll()})")
            if line.startswith("{"):
                step = json.loads(line)
                return step["step"], step["result"]
        raise AssertionError("client gave no step in time")

    def finish(self) -> list[tuple[str, object]]:
        """Close its stdin (the provider then closes the store) and read what is left."""
        if not self.proc.stdin.closed:
            self.proc.stdin.close()
        out = self.proc.stdout.read()
        self.proc.wait(60)
        return [(s["step"], s["result"]) for s in map(json.loads, filter(None, out.splitlines()))]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def mooncake_master(tmp_path_factory):
    master = MooncakeMaster(MOONCAKE_MASTER, str(tmp_path_factory.mktemp("mooncake")), http_metadata=True).start()
    yield master
    master.stop()


@pytest.fixture
def store_url(valkey):
    return valkey.url


def open_gateway(url: str, namespace: str, shards: int = 1, **config) -> tuple[Master, GatewayThread]:
    master = Master.connect(url, MasterConfig(namespace=namespace, shards=shards, **config))
    thread = GatewayThread(master, Listeners("127.0.0.1", free_port(), free_port()))
    thread.start()
    return master, thread


@pytest.fixture
def gateway(store_url):
    master, thread = open_gateway(store_url, f"gw{uuid.uuid4().hex[:8]}")
    yield thread.gateway
    thread.stop()
    master.close()


def test_the_client_gets_the_same_answers_as_from_mooncake_master(mooncake_master, gateway):
    theirs = run_session("basic", mooncake_master.address, mooncake_master.metadata_url)
    ours = run_session("basic", gateway.rpc_address, gateway.metadata_url)
    assert [s for s, _ in ours] == [s for s, _ in theirs]
    assert dict(ours) == dict(theirs)
    assert dict(ours)["get eight-mib equal"] is True


def test_p2p_handshake_needs_no_metadata_server(gateway):
    steps = dict(run_session("basic", gateway.rpc_address, "P2PHANDSHAKE"))
    assert steps["get one-mib equal"] is True and steps["close"] == 0


def test_a_provider_and_a_consumer_on_two_gateways_share_one_store(store_url):
    namespace = f"gw{uuid.uuid4().hex[:8]}"
    master_a, a = open_gateway(store_url, namespace)
    master_b, b = open_gateway(store_url, namespace)
    provider = Client("provider", a.gateway.rpc_address, a.gateway.metadata_url)
    try:
        assert provider.next_step() == ("setup", 0)
        assert provider.next_step() == ("ready", 0)
        # the consumer has no segment: its put lands in the provider's, through the other gateway
        steps = dict(run_session("consumer", b.gateway.rpc_address, b.gateway.metadata_url))
        assert steps == {"setup": 0, "put": 0, "get equal": True, "is_exist": 1, "remove forced": 0, "close": 0}
        assert ("close", 0) in provider.finish()
    finally:
        provider.kill()
        for thread, master in ((a, master_a), (b, master_b)):
            thread.stop()
            master.close()


def test_the_store_keeps_what_the_gateway_was_told(store_url):
    """Segments by UUID, the transfer engine's metadata and the gateway itself are in Redis."""
    master, thread = open_gateway(store_url, f"gw{uuid.uuid4().hex[:8]}")
    provider = Client("provider", thread.gateway.rpc_address, thread.gateway.metadata_url)
    try:
        assert provider.next_step() == ("setup", 0) and provider.next_step() == ("ready", 0)
        store = GatewayStore(master)
        [segment] = master.segments()
        facts = store.segment_facts(segment["name"])
        assert facts.endpoint == segment["name"] and facts.protocol == "tcp" and facts.size == 64 << 20
        assert store.segment_name(facts.uuid) == segment["name"]
        assert store.metadata_get(f"mooncake/ram/{segment['name']}".encode()).startswith(b"{")
        assert [g["rpc"] for g in store.gateways()] == [thread.gateway.rpc_address]
        assert ("close", 0) in provider.finish()
        assert master.segments() == [] and store.segment_name(facts.uuid) is None
        assert store.metadata_get(f"mooncake/ram/{segment['name']}".encode()) is None  # the client's DELETE
    finally:
        provider.kill()
        thread.stop()
    assert GatewayStore(master).gateways() == []  # a gateway that stops leaves the list
    master.close()


def test_eviction_under_pressure_never_returns_other_bytes(gateway):
    steps = dict(run_session("pressure", gateway.rpc_address, gateway.metadata_url, segment_mib=16))
    assert steps["puts failed"] == 0  # puts evict what they need
    gets = steps["gets"]
    assert gets["wrong"] == 0 and gets["missing"] > 0 and gets["equal"] > 0, gets


def acknowledged(client: Client, count: int) -> list[int]:
    """Read the writer's lines until `count` more puts were acknowledged; their numbers."""
    done = []
    while len(done) < count:
        step, (rc, equal) = client.next_step()
        if rc == 0:
            assert equal, step  # a put acknowledged and read back with other bytes
            done.append(int(step.split()[1]))
    return done


def start_gateway_process(url: str, namespace: str, port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "mooncake_redis.cli", "--redis", url, "--namespace", namespace,
                             "gateway", "--rpc-port", str(port), "--metadata-port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    assert line.startswith("mooncake gateway: rpc"), line
    return proc


def test_a_gateway_killed_mid_session_loses_nothing(store_url):
    namespace = f"gw{uuid.uuid4().hex[:8]}"
    master = Master.connect(store_url, MasterConfig(namespace=namespace))
    port = free_port()
    gateway = start_gateway_process(store_url, namespace, port)
    writer = Client("writes", f"127.0.0.1:{port}", "P2PHANDSHAKE")
    try:
        assert writer.next_step() == ("setup", 0)
        done = acknowledged(writer, 10)
        gateway.send_signal(signal.SIGKILL)
        gateway.wait()
        gateway = start_gateway_process(store_url, namespace, port)  # the client reconnects by itself
        done += acknowledged(writer, 10)
        assert master.batch_exist_key([f"w-{i}" for i in done]) == [True] * len(done)
    finally:
        writer.kill()
        gateway.kill()
        gateway.wait()
        master.close()


def test_valkey_restarted_from_its_aof_mid_session_loses_nothing(tmp_path):
    valkey = EmbeddedValkey(data_dir=str(tmp_path / "valkey"), appendonly=True,
                            extra_args=("--appendfsync", "always")).start()
    namespace = f"gw{uuid.uuid4().hex[:8]}"
    master, thread = open_gateway(valkey.url, namespace)
    writer = Client("writes", thread.gateway.rpc_address, thread.gateway.metadata_url)
    try:
        assert writer.next_step() == ("setup", 0)
        done = acknowledged(writer, 10)
        [segment] = master.segments()
        valkey.proc.send_signal(signal.SIGKILL)  # no shutdown: only the AOF holds the data
        valkey.proc.wait()
        valkey = EmbeddedValkey(data_dir=valkey.data_dir, port=valkey.port, appendonly=True,
                                extra_args=("--appendfsync", "always")).start()
        done += acknowledged(writer, 10)
        assert master.batch_exist_key([f"w-{i}" for i in done]) == [True] * len(done)
        assert master.segments()[0]["name"] == segment["name"]  # the mount survived with its facts
        store = GatewayStore(master)
        assert store.segment_facts(segment["name"]) is not None
        assert store.metadata_get(f"mooncake/ram/{segment['name']}".encode()) is not None
    finally:
        writer.kill()
        thread.stop()
        master.close()
        valkey.stop()


def test_a_graceful_unmount_by_the_client_keeps_its_objects_readable(mooncake_master, store_url):
    """unmount_and_free_segment(ids, grace) sends GracefulUnmountSegment: the same answers as
    Mooncake's master, and the store keeps the segment draining (the client's second segment
    shares its first one's name: the gateway keeps it under "<name>#<uuid>")."""
    theirs = run_session("graceful", mooncake_master.address, mooncake_master.metadata_url)
    master, thread = open_gateway(store_url, f"gw{uuid.uuid4().hex[:8]}")
    try:
        ours = run_session("graceful", thread.gateway.rpc_address, thread.gateway.metadata_url)
        assert ours == theirs
        assert dict(ours)["get after unmount equal"] is True
        (seg,) = master.segments()  # the first segment went with close(); the drained one stays listed
        assert "#" in seg["name"] and master.segment_status(seg["name"]) == "GRACEFULLY_UNMOUNTING"
    finally:
        thread.stop()
        master.close()


def test_upserts_answer_as_mooncake_masters(mooncake_master, gateway):
    """upsert / upsert_batch (UpsertStart, UpsertEnd and the Batch forms): in place, to another
    size, of a new key; each get answers the last bytes written, as against Mooncake's master."""
    theirs = run_session("upsert", mooncake_master.address, mooncake_master.metadata_url)
    ours = run_session("upsert", gateway.rpc_address, gateway.metadata_url)
    assert ours == theirs
    assert all(result is True for step, result in ours if "equal" in step)


def copied(master: str, metadata: str) -> dict:
    """A copy task run by Mooncake's own client: from its segment onto a holder's."""
    holder = Client("holder", master, metadata)
    try:
        assert holder.next_step()[0] == "setup"
        step, name = holder.next_step()
        assert step == "ready"
        return dict(run_session("copy", master, metadata, 120, 64, name))
    finally:
        holder.finish()
        holder.kill()


def test_a_copy_task_runs_as_against_mooncake_master(mooncake_master, gateway):
    theirs = copied(mooncake_master.address, mooncake_master.metadata_url)
    ours = copied(gateway.rpc_address, gateway.metadata_url)
    assert theirs == ours == {"setup": 0, "put": 0, "create_copy_task": 0, "task status": "SUCCESS",
                              "replicas": 2, "get equal": True, "remove forced": 0, "close": 0}
