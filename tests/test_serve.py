"""`serve` as a process: its private Valkey, restarts, the port and URL it remembers."""
from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

import mooncake_redis.server as server_module
from mooncake_redis import Master
from mooncake_redis.cli.main import safe_url
from mooncake_redis.library import server_library
from mooncake_redis.server import EmbeddedValkey, free_port

from helpers import run_cli as run

REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 30.0  # bound on waiting for `serve` to come up / go down (polling, not a deadline)


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("MOONCAKE_REDIS_URL", "MOONCAKE_DATA_DIR")}


class Serve:
    """`python -m mooncake_redis.cli serve --data-dir DIR ...` as a child process."""

    def __init__(self, tmp: Path, data_dir: Path, *args: str):
        self.data_dir = data_dir
        self.err_path = tmp / f"serve-{time.monotonic_ns()}.err"
        # --no-gateway: these tests are about the private Valkey (tests/test_gateway_cli.py has serve's gateway)
        self.proc = subprocess.Popen([sys.executable, "-m", "mooncake_redis.cli", "serve", "--data-dir", str(data_dir),
                                      "--no-gateway", *args],
                                     cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=open(self.err_path, "w"),
                                     text=True)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.output: list[str] = []

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_ready(self) -> tuple[str, str]:
        """Wait (bounded) for the banner; returns (url, functions version): the URL of the url
        file, which the banner prints with its password masked."""
        end = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < end:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                continue
            if line is None:
                break
            self.output.append(line)
            if line.strip().startswith("stop with"):
                banner = "".join(self.output)
                url = re.search(r"^mooncake-redis master: (redis://\S+)$", banner, re.M)
                version = re.search(r"functions library 'mooncake' version ([0-9a-f]{16})$", banner, re.M)
                assert url and version, banner
                full = (self.data_dir / "url").read_text().strip()
                assert url.group(1) == safe_url(full) != full, banner
                return full, version.group(1)
        raise AssertionError(f"serve did not come up: {self.output} {self.err_path.read_text()}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=START_TIMEOUT_S)

    def cleanup(self) -> None:
        """After a failed test: stop serve, and its Valkey too if serve could not."""
        try:
            self.stop()
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        try:
            pid = int((self.data_dir / "valkey.pid").read_text())
            os.kill(pid, signal.SIGTERM)
            _gone(pid)
        except (OSError, ValueError):
            pass


def _gone(pid: int) -> bool:
    end = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)  # waiting for a process to exit, not for a deadline
    return False


def unauthenticated_ping(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=START_TIMEOUT_S) as s:
        s.sendall(b"PING\r\n")
        return s.recv(1024)


def serve_once(tmp: Path, data: Path, *args: str) -> subprocess.CompletedProcess:
    """A `serve` expected to fail at start."""
    return subprocess.run([sys.executable, "-m", "mooncake_redis.cli", "serve", "--data-dir", str(data), "--no-gateway",
                           *args],
                          cwd=REPO, env=_env(), capture_output=True, text=True, timeout=START_TIMEOUT_S)


@pytest.mark.slow
def test_free_ports_lie_below_the_ephemeral_range_and_are_free():
    """A port found free inside the ephemeral range may become the local end of an outgoing
    connection before a server binds it; free_port picks below the range."""
    lo, _ = server_module._ephemeral_ports()
    for _ in range(20):
        port = free_port()
        assert (10_024 <= port < lo) if lo > 11_024 else port > 0
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free: nothing listens on it


def test_serve_process(tmp_path):
    data = tmp_path / "data"
    port = free_port()
    serve = Serve(tmp_path, data, "--port", str(port))
    try:
        url, version = serve.wait_ready()
        password = (data / "password").read_text().strip()
        assert url == f"redis://:{password}@127.0.0.1:{port}/0"
        client = redis.Redis.from_url(url)
        assert server_library(client)[0] == version
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("dir")["dir"] == str(data.resolve())
        assert client.hget("mc:{mc:0}:config", "shards") == b"1"
        valkey_pid = int(client.info("server")["process_id"])
        client.close()
        assert serve.stop() == 0
        assert _gone(valkey_pid), "valkey-server outlived serve"
        assert not (data / "valkey.pid").exists()
    finally:
        serve.cleanup()


@pytest.mark.slow
def test_serve_metrics_port(tmp_path):
    """serve --metrics-port: its banner names the endpoint, which reads the store; it stops with serve."""
    data, metrics_port = tmp_path / "data", free_port()
    serve = Serve(tmp_path, data, "--metrics-port", str(metrics_port), "--metrics-addr", "127.0.0.1")
    try:
        serve.wait_ready()
        assert f"metrics   http://127.0.0.1:{metrics_port}/metrics" in "".join(serve.output)
        body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
        assert "mooncake_up 1.0" in body and 'mooncake_shard_capacity_bytes{shard="0"} 0.0' in body
        assert serve.stop() == 0
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10)
    finally:
        serve.cleanup()


@pytest.mark.slow
def test_serve_restart_keeps_the_store(tmp_path):
    data = tmp_path / "data"
    first = Serve(tmp_path, data, "--shards", "2")
    try:
        m = Master.connect(first.wait_ready()[0])
        assert m.shards == 2
        m.mount_segment("seg-a", 1 << 20, "client-1")
        m.close()
        assert first.stop() == 0
    finally:
        first.cleanup()
    # a different shard count for the existing store is refused, and its Valkey stopped
    refused = serve_once(tmp_path, data, "--shards", "3")
    assert refused.returncode == 2, refused.stderr
    assert "error INVALID_PARAMS (-600): store 'mc' has 2 shards" in refused.stderr
    assert not (data / "valkey.pid").exists()
    second = Serve(tmp_path, data)
    try:
        m = Master.connect(second.wait_ready()[0])
        assert m.shards == 2 and [s["name"] for s in m.segments()] == ["seg-a"]
        m.close()
        assert second.stop() == 0
    finally:
        second.cleanup()


@pytest.mark.slow
def test_restart_on_the_same_port_with_a_client_left_connected(tmp_path):
    """The connections of the stopped server (TIME_WAIT / FIN_WAIT on its side) do not hold the
    port: only a listener does."""
    data = tmp_path / "data"
    port = free_port()
    first = Serve(tmp_path, data, "--port", str(port))
    try:
        client = redis.Redis.from_url(first.wait_ready()[0])
        assert client.ping()  # connected, and left connected across the stop
        assert first.stop() == 0
    finally:
        first.cleanup()
    second = Serve(tmp_path, data, "--port", str(port))
    try:
        url, _ = second.wait_ready()
        assert redis.Redis.from_url(url).ping()
        assert second.stop() == 0
    finally:
        second.cleanup()
        client.close()


def test_port_with_a_listener_is_refused(tmp_path):
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # reuse does not share a listening port
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        r = serve_once(tmp_path, tmp_path / "data", "--port", str(port))
    assert r.returncode == 2 and f"port {port} on 127.0.0.1 is in use" in r.stderr



def _modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mode & 0o777 for p in [root, *root.rglob("*")]}


@pytest.mark.slow
def test_serve_is_private_and_the_cli_finds_it(tmp_path, monkeypatch):
    """Password (0600), URL file (0600), data directory 0700, AOF files 0600; an unauthenticated
    client is refused; `status` run next to the data directory needs no --redis."""
    data = tmp_path / "mooncake-data"
    data.mkdir(mode=0o755)
    data.chmod(0o755)  # as an earlier version left it
    serve = Serve(tmp_path, data)
    try:
        url, _ = serve.wait_ready()
        password = (data / "password").read_text().strip()
        assert len(password) >= 32 and password in url
        banner = "".join(serve.output)
        assert password not in banner
        assert f'REDISCLI_AUTH="$(cat {data / "password"})"' in banner
        assert f"other commands: MOONCAKE_DATA_DIR={data} mooncake-redis status" in banner  # serve runs elsewhere
        assert unauthenticated_ping(urlsplit(url).port).startswith(b"-NOAUTH")
        client = redis.Redis.from_url(url)
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        client.close()
        modes = _modes(data)
        assert {"password", "url", "valkey.log", "valkey.pid", "serve.lock", "appendonlydir"} <= modes.keys()
        assert any(name.startswith("appendonlydir/") for name in modes)
        assert {name: mode for name, mode in modes.items() if mode & 0o077} == {}

        monkeypatch.chdir(tmp_path)  # the directory that holds mooncake-data/
        r = run("status")
        assert r.exit_code == 0, r.output
        assert f"store      redis://:***@127.0.0.1:{urlsplit(url).port}/0" in r.stdout and password not in r.output
        monkeypatch.chdir(data)  # elsewhere, with MOONCAKE_DATA_DIR
        assert run("status").exit_code == 2
        assert run("status", env={"MOONCAKE_DATA_DIR": str(data)}).exit_code == 0
        assert serve.stop() == 0
    finally:
        serve.cleanup()
    monkeypatch.chdir(tmp_path)
    r = run("status")  # the URL file stays; nothing answers there now
    assert r.exit_code == 2 and password not in r.stderr
    assert "(URL from mooncake-data/url: is `mooncake-redis serve` running?)" in r.stderr


def test_cli_without_url_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = run("status")
    assert r.exit_code == 2
    assert "no Redis: pass --redis URL, set MOONCAKE_REDIS_URL, or run where `mooncake-redis serve` " \
           "keeps its data (mooncake-data/url not found" in r.stderr
    r = run("inspect", "k", env={"MOONCAKE_DATA_DIR": str(tmp_path / "elsewhere")})
    assert r.exit_code == 2 and f"({tmp_path / 'elsewhere' / 'url'} not found" in r.stderr


@pytest.mark.slow
def test_serve_comes_back_on_its_port(tmp_path):
    data = tmp_path / "data"
    first = Serve(tmp_path, data)
    try:
        url, _ = first.wait_ready()
        assert first.stop() == 0
    finally:
        first.cleanup()
    port = urlsplit(url).port
    second = Serve(tmp_path, data)  # no --port: the port of the earlier serve
    try:
        assert second.wait_ready()[0] == url
        assert second.stop() == 0
    finally:
        second.cleanup()

    with socket.socket() as other:  # something else took the port meanwhile
        other.bind(("127.0.0.1", port))
        other.listen()
        refused = serve_once(tmp_path, data)
        assert refused.returncode == 2
        assert (f"port {port} on 127.0.0.1, where {data} was served before (see its url file), is in use "
                f"by another process; free it, or pass --port N") in refused.stderr
        assert (data / "url").read_text().strip() == url
        new_port = free_port()
        moved = Serve(tmp_path, data, "--port", str(new_port))  # the operator moves the store
        try:
            new_url, _ = moved.wait_ready()
            assert new_url == url.replace(f":{port}/", f":{new_port}/")
            assert f"port changed from {port} to {new_port} (--port)" in "".join(moved.output)
            assert moved.stop() == 0
        finally:
            moved.cleanup()


# ---- EmbeddedValkey ----------------------------------------------------------------------

def test_embedded_valkey_does_not_attach_to_another_server(tmp_path, monkeypatch, valkey):
    """A valkey-server that has not bound its port yet (here: one that never will) while
    another server answers there: start() fails instead of returning the other server."""
    slow = tmp_path / "slow-valkey-server"
    slow.write_text("#!/bin/sh\nexec sleep 60\n")
    slow.chmod(0o755)
    monkeypatch.setattr(server_module, "valkey_binary", lambda: str(slow))
    mine = EmbeddedValkey(str(tmp_path / "data"), port=valkey.port, appendonly=False)
    with pytest.raises(RuntimeError, match=f"port {valkey.port} on 127.0.0.1 is served by another process"):
        mine.start()
    assert mine.proc.poll() is not None, "the process started was not stopped"
    assert redis.Redis.from_url(valkey.url).ping()  # the other server is untouched


def test_embedded_valkey_on_a_taken_port_fails(tmp_path, valkey):
    mine = EmbeddedValkey(str(tmp_path / "data"), port=valkey.port, appendonly=False)
    with pytest.raises(RuntimeError, match="served by another process|Address already in use"):
        mine.start()
    assert mine.proc.poll() is not None


def test_embedded_valkey_password(tmp_path):
    with EmbeddedValkey(str(tmp_path / "data"), appendonly=False, password="pw-1_x") as server:
        assert server.url == f"redis://:pw-1_x@127.0.0.1:{server.port}/0"
        assert redis.Redis.from_url(server.url).ping()
        assert unauthenticated_ping(server.port).startswith(b"-NOAUTH")
        assert "pw-1_x" not in " ".join(server.proc.args)  # not on the command line
        assert redis.Redis.from_url(server.url).config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
    with pytest.raises(ValueError):
        EmbeddedValkey(password="has space")


def test_embedded_valkey_removes_the_directory_it_made_up(tmp_path):
    """Without a data_dir it runs in a fresh /tmp/mooncake-valkey-* directory, gone after stop();
    a data_dir given by the caller stays."""
    with EmbeddedValkey(appendonly=False) as server:
        made_up = Path(server.data_dir)
        assert made_up.name.startswith("mooncake-valkey-") and made_up.is_dir()
    assert not made_up.exists()
    with EmbeddedValkey(str(tmp_path / "data"), appendonly=False):
        pass
    assert (tmp_path / "data" / "valkey.log").exists()


# ---- docker compose ----------------------------------------------------------------------

def test_docker_compose_file():
    """Valid YAML; Valkey with AOF, noeviction and the password of .env; every mooncake-redis
    service reaches it with that password; healthchecks; .env stays out of git and images."""
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose["services"]
    password = "${VALKEY_PASSWORD:?"
    valkey = services["valkey"]
    command = " ".join(valkey["command"])
    assert "--appendonly yes" in command and "--maxmemory-policy noeviction" in command
    assert f"--requirepass {password}" in command
    assert all(p.startswith("127.0.0.1:") for p in valkey["ports"])
    for name in ("master", "worker"):
        url = services[name]["environment"]["MOONCAKE_REDIS_URL"]
        assert url.startswith(f"redis://:{password}") and url.endswith("@valkey:6379/0"), name
    assert services["master"]["depends_on"]["valkey"]["condition"] == "service_healthy"
    assert {"valkey", "master", "worker"} <= {name for name, s in services.items() if "healthcheck" in s}
    # several workers by default; Prometheus only with --profile monitoring
    assert services["worker"]["deploy"]["replicas"] >= 2 and "profiles" not in services["worker"]
    assert services["prometheus"]["profiles"] == ["monitoring"]
    for name in ("master", "worker"):
        assert services[name]["command"][-2:] == ["--metrics-port", "9100"], name
    example = (REPO / ".env.example").read_text()
    assert re.search(r"^VALKEY_PASSWORD=$", example, re.M)
    assert ".env" in (REPO / ".gitignore").read_text().split()
    assert ".env" in (REPO / "docker" / "Dockerfile.dockerignore").read_text().split()


# compose-spec keys used here (no docker on the test machine: a structural check, not `docker
# compose config`)
COMPOSE_TOP = {"services", "volumes", "networks", "configs", "secrets", "name"}
COMPOSE_SERVICE = {"image", "build", "command", "entrypoint", "environment", "env_file", "volumes", "ports",
                   "healthcheck", "restart", "depends_on", "profiles", "deploy", "networks", "user"}
COMPOSE_HEALTHCHECK = {"test", "interval", "timeout", "retries", "start_period", "start_interval", "disable"}


def test_docker_compose_structure():
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    assert {k for k in compose if not k.startswith("x-")} <= COMPOSE_TOP
    services = compose["services"]
    for name, service in services.items():
        assert set(service) <= COMPOSE_SERVICE, (name, set(service) - COMPOSE_SERVICE)
        assert "image" in service or "build" in service, name
        if "healthcheck" in service:
            check = service["healthcheck"]
            assert set(check) <= COMPOSE_HEALTHCHECK and check["test"][0] in ("CMD", "CMD-SHELL"), name
            for field in ("interval", "timeout", "start_period"):
                assert field not in check or re.fullmatch(r"\d+(ms|s|m)", check[field]), (name, field)
        depends = service.get("depends_on", [])
        for other in depends:
            assert other in services, (name, other)
            if isinstance(depends, dict):
                assert depends[other]["condition"] in ("service_started", "service_healthy"), (name, other)
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            assert source in compose.get("volumes", {}) or (REPO / source).exists(), (name, volume)
    # Prometheus scrapes the port the master and the workers serve their metrics on
    prometheus = yaml.safe_load((REPO / "docker" / "prometheus.yml").read_text())
    (job,) = prometheus["scrape_configs"]
    (sd,) = job["dns_sd_configs"]
    assert set(sd["names"]) == {"master", "worker"} and sd["port"] == 9100


def test_docker_worker_healthcheck_reads_a_metrics_endpoint(valkey):
    """The worker's healthcheck command, run against a real metrics endpoint."""
    yaml = pytest.importorskip("yaml")
    from mooncake_redis.metrics import serve_metrics

    test = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["worker"]["healthcheck"]["test"]
    assert test[0] == "CMD"
    redis.Redis.from_url(valkey.url).flushall()
    master = Master.connect(valkey.url)
    port = free_port()
    http = serve_metrics(master, port, "127.0.0.1")
    try:
        argv = [sys.executable if a == "python" else a.replace(":9100/", f":{port}/") for a in test[1:]]
        assert subprocess.run(argv, timeout=30).returncode == 0
        master.redis.connection_pool.connection_kwargs["port"] = free_port()  # Redis unreachable
        master.redis.connection_pool.reset()
        assert subprocess.run(argv, timeout=30).returncode == 1
    finally:
        http.shutdown()
        http.server_close()
        master.close()


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
def test_a_killed_parent_leaves_no_valkey_behind(tmp_path):
    """SIGKILL of the process that started a private Valkey (serve, replay, a bench) stops the
    Valkey too: it gets SIGTERM and shuts down cleanly."""
    code = ("import sys, time\nfrom mooncake_redis.server import EmbeddedValkey\n"
            f"v = EmbeddedValkey(data_dir={str(tmp_path / 'v')!r}).start()\n"
            "print(v.proc.pid, flush=True)\nsys.stdin.read()\n")  # until it is killed
    parent = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        valkey_pid = int(parent.stdout.readline())
        os.kill(valkey_pid, 0)  # running
        parent.kill()
        parent.wait()
        assert _gone(valkey_pid), "valkey-server outlived the process that started it"
    finally:
        parent.kill()
