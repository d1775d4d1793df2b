"""`mooncake-redis gateway` and the gateway `serve` starts, as processes: the banner, `status`
listing the gateways that serve, a clean stop on SIGTERM, and ports that are taken (a default
one is left out with a note, one given on the command line is an error)."""
from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

from mooncake_redis import Master, MasterConfig
from mooncake_redis.server import free_port

pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "mooncake_redis.cli"]


@pytest.fixture
def store(valkey):
    namespace = f"gw{uuid.uuid4().hex[:8]}"
    Master.connect(valkey.url, MasterConfig(namespace=namespace)).close()
    return valkey.url, namespace


def status(url: str, namespace: str) -> dict:
    out = subprocess.run([*CLI, "--redis", url, "--namespace", namespace, "status", "--json"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return json.loads(out)


@contextlib.contextmanager
def listening(port: int):
    """Hold 127.0.0.1:port listening meanwhile (another process holding it first is waited out,
    so that the port cannot come free during the block)."""
    deadline = time.monotonic() + 30
    with socket.socket() as s:
        while True:
            try:
                s.bind(("127.0.0.1", port))
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.skip(f"port {port} is held by another process")
                time.sleep(0.05)  # waiting for a port to come free, not for a deadline
        s.listen()
        yield


def test_gateway_serves_is_listed_and_stops_on_sigterm(store):
    url, namespace = store
    rpc, metadata = free_port(), free_port()
    proc = subprocess.Popen([*CLI, "--redis", url, "--namespace", namespace, "gateway", "--rpc-port", str(rpc),
                             "--metadata-port", str(metadata)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip()
        assert line == f"mooncake gateway: rpc 127.0.0.1:{rpc}, metadata http://127.0.0.1:{metadata}/metadata"
        [listed] = status(url, namespace)["gateways"]
        assert (listed["rpc"], listed["metadata"]) == (f"127.0.0.1:{rpc}", f"http://127.0.0.1:{metadata}/metadata")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert out.strip() == "gateway stopped"
        assert status(url, namespace)["gateways"] == []
    finally:
        proc.kill()


def test_gateway_on_a_taken_port_is_an_error(store):
    url, namespace = store
    port = free_port()
    with listening(port):
        r = subprocess.run([*CLI, "--redis", url, "--namespace", namespace, "gateway", "--rpc-port", str(port)],
                           capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "the gateway cannot listen on 127.0.0.1" in r.stderr


def test_gateway_needs_a_store(valkey):
    r = subprocess.run([*CLI, "--redis", valkey.url, "--namespace", f"none{uuid.uuid4().hex[:6]}", "gateway",
                        "--rpc-port", str(free_port())], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "no store under namespace" in r.stderr


def serve(tmp_path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([*CLI, "serve", "--data-dir", str(tmp_path / "data"), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)


def banner(proc: subprocess.Popen) -> list[str]:
    lines = []
    while not lines or "stop with Ctrl-C" not in lines[-1]:
        line = proc.stdout.readline()
        assert line, f"serve ended: {lines}"
        lines.append(line.rstrip())
    return lines


@pytest.mark.xdist_group("gateway_default_ports")
def test_serve_starts_a_gateway_and_leaves_out_a_default_port_that_is_taken(tmp_path):
    metadata = free_port()
    with listening(50051):  # the default RPC port, taken
        proc = serve(tmp_path, "--metadata-port", str(metadata))
        try:
            lines = banner(proc)
            assert "  gateway: port 50051 on 127.0.0.1 is taken; no rpc listener (--rpc-port to choose one)" in lines
            assert f"  mooncake gateway: rpc off, metadata http://127.0.0.1:{metadata}/metadata" in lines
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
        finally:
            proc.kill()


def test_serve_with_an_explicit_port_that_is_taken_is_an_error(tmp_path):
    port = free_port()
    with listening(port):
        proc = serve(tmp_path, "--rpc-port", str(port))
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2


def test_serve_no_gateway(tmp_path):
    proc = serve(tmp_path, "--no-gateway")
    try:
        assert not any("mooncake gateway:" in line for line in banner(proc))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        proc.kill()
