"""Against Mooncake's own C++ master, in the same run: one Python client each, on loopback.

Mooncake's side is its `mooncake_master` (the `mooncake-transfer-engine` wheel, or its
`-non-cuda` build) with one `mooncake.store.MooncakeDistributedStore` client (protocol tcp,
metadata P2PHANDSHAKE: no metadata server) that mounts a segment of its own memory. Our side is
the `Master` on a private valkey-server (no AOF), on the lean transport, as `bench ops` drives it.
Every object is 1 KiB with one replica.

The operations, each timed over n calls (keys/s for the batch):

    exist_key            is_exist                   exist_key
    batch_exist_key x100 batch_is_exist (100 keys)  batch_exist_key (100 keys)
    put                  put (moves 1 KiB)          put_start + put_end
    get_replica_list     get (reads 1 KiB back)     get_replica_list
    remove               remove                     remove

and, without data on Mooncake's side (the same master calls, no bytes moved), put as
batch_put_session_start + batch_put_session_end of one key and get_replica_list as
get_replica_desc, against the same figures of ours; and the design's floor on our side, through
the same transport: a no-op FCALL, and bench instructions' floor functions, which make exactly
the redis.calls of our reads and nothing else. Every figure is the median of 3 rounds; each
round runs every Mooncake operation, then every one of ours, so both see the same machine. Ours
also gets the server's usec per call (INFO commandstats deltas, as bench ops).

    python -m mooncake_redis.bench.mooncake [--n N]

Both masters are started here on free loopback ports and stopped at the end; nothing else is
touched. Needs `pip install 'mooncake-redis[mooncake]'` (see docs/bench.md).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import redis

from mooncake_redis import Master, MasterConfig
from mooncake_redis.functions import server_library
from mooncake_redis.server import free_port, private_valkey, stop_process

from .common import cpu_model
from .instructions import LIBRARY as FLOOR_LIBRARY
from .ops import BATCH, CLIENT, FCALLS, REPEATS, Placement, _fmt, _measure, put_pairs

INSTALL = "pip install 'mooncake-redis[mooncake]'"
NAMESPACE = "bench"
SEGMENT = "bench-seg"
SEGMENT_SIZE = 1 << 44           # ours: 16 TiB, never the limit
OBJECT_SIZE = 1 << 10            # 1 KiB per object, 1 replica, both sides
READ_SET_MAX = 10_000            # stored objects the reads spread over
LOCAL_BUFFER = 16 << 20          # Mooncake client's transfer buffer
START_TIMEOUT_S = 30.0


class MooncakeUnavailable(RuntimeError):
    """Mooncake's client or master cannot be used here; the message says what to install."""


def find_mooncake() -> tuple[type, str]:
    """(MooncakeDistributedStore, path of the mooncake_master executable), or MooncakeUnavailable."""
    try:
        from mooncake.store import MooncakeDistributedStore
    except ModuleNotFoundError as exc:
        raise MooncakeUnavailable(
            f"Mooncake's Python client is not installed (no module {exc.name!r}); install it with "
            f"{INSTALL}") from None
    except ImportError as exc:  # installed, but a shared library it links is missing
        raise MooncakeUnavailable(
            f"Mooncake's Python client is installed but does not load: {exc}. Its store.so needs "
            f"libibverbs (Debian/Ubuntu: apt-get install libibverbs1); the CUDA build "
            f"(mooncake-transfer-engine) also needs libcuda.so.1 and libcudart.so.12: on a machine "
            f"without CUDA install the same version of mooncake-transfer-engine-non-cuda "
            f"instead") from None
    import mooncake

    here = Path(sys.executable).parent / "mooncake_master"
    candidates = [str(here) if here.is_file() and os.access(here, os.X_OK) else None,
                  shutil.which("mooncake_master"),
                  # the binary itself, which the wheel's mooncake_master script execs
                  shutil.which("mooncake_master", path=str(Path(mooncake.__file__).parent))]
    exe = next((c for c in candidates if c), None)
    if exe is None:
        raise MooncakeUnavailable(f"no mooncake_master executable next to {sys.executable} or on PATH; "
                                  f"install it with {INSTALL}")
    return MooncakeDistributedStore, exe


def mooncake_version() -> str:
    """`<distribution> <version>` of the installed mooncake package."""
    from importlib import metadata

    names = metadata.packages_distributions().get("mooncake", [])
    for name in names:
        with contextlib.suppress(metadata.PackageNotFoundError):
            return f"{name} {metadata.version(name)}"
    return "mooncake (version unknown)"


@contextlib.contextmanager
def _stderr_to(path: str):
    """Send file descriptor 2 (where Mooncake's C++ logging writes) to `path` meanwhile."""
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


def _tail(path: str, lines: int = 8) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 8192))
            got = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    return "\n".join(got[-lines:]) or "(empty log)"


class MooncakeMaster:
    """mooncake_master on 127.0.0.1 (RPC and admin ports free ones), logging into `dir`, no HA,
    no metrics reporting, every other flag at its default; with `http_metadata`, its HTTP
    metadata server on a free port too (`metadata_url`)."""

    def __init__(self, exe: str, dir: str, http_metadata: bool = False):
        self.exe, self.dir = exe, dir
        self.port, self.admin_port = free_port(), free_port()
        self.metadata_port = free_port() if http_metadata else None
        self.log_path = os.path.join(dir, "mooncake_master.log")
        self.proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def metadata_url(self) -> str:
        return f"http://127.0.0.1:{self.metadata_port}/metadata" if self.metadata_port else "P2PHANDSHAKE"

    def start(self) -> "MooncakeMaster":
        args = [self.exe, f"--rpc_port={self.port}", "--rpc_address=127.0.0.1",
                f"--metrics_port={self.admin_port}", "--metrics_host=127.0.0.1",
                "--enable_metric_reporting=false"]
        if self.metadata_port:
            args += ["--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
                     f"--http_metadata_server_port={self.metadata_port}"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args, cwd=self.dir, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"mooncake_master exited with code {self.proc.returncode}:\n"
                                       f"{_tail(self.log_path)}")
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.5):
                    return self
                if time.monotonic() > deadline:
                    raise RuntimeError(f"mooncake_master did not listen on {self.address} within "
                                       f"{START_TIMEOUT_S:g} s:\n{_tail(self.log_path)}")
                time.sleep(0.05)  # waiting for a process to come up, not for a deadline
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        stop_process(self.proc)


Run = Callable[[int], int]


def _mooncake_cases(store, n: int, read_keys: list[str], windows: list[list[str]]) -> list[tuple[str, tuple, Run]]:
    """The timed loops on Mooncake's client; each checks every reply (a failed call would
    otherwise count as a fast one)."""
    value = b"m" * OBJECT_SIZE
    put_keys = [[f"mc-put-{rep}-{i:08d}" for i in range(n)] for rep in range(REPEATS)]
    session_keys = [[f"mc-session-{rep}-{i:08d}" for i in range(n)] for rep in range(REPEATS)]

    def check(what: str, bad: int) -> None:
        if bad:
            raise RuntimeError(f"Mooncake {what}: {bad} calls failed")

    def exists(rep: int) -> int:
        e = store.is_exist
        check("is_exist", sum(e(k) != 1 for k in read_keys))
        return n

    def batch_exists(rep: int) -> int:
        be = store.batch_is_exist
        check("batch_is_exist", sum(BATCH - sum(x == 1 for x in be(w)) for w in windows))
        return len(windows) * BATCH

    def puts(rep: int) -> int:
        p = store.put
        check("put", sum(p(k, value) != 0 for k in put_keys[rep]))
        return n

    def gets(rep: int) -> int:
        g = store.get
        check("get", sum(len(g(k)) != OBJECT_SIZE for k in read_keys))
        return n

    def removes(rep: int) -> int:
        rm = store.remove  # the keys this round's put stored: no lease on them
        check("remove", sum(rm(k) != 0 for k in put_keys[rep]))
        return n

    def session_puts(rep: int) -> int:
        start, end, one = store.batch_put_session_start, store.batch_put_session_end, [OBJECT_SIZE]
        bad = 0
        for k in session_keys[rep]:
            keys = [k]
            bad += start(keys, one) != [0]
            bad += end(keys) != [0]
        check("batch_put_session_start/end", bad)
        return n

    def descs(rep: int) -> int:
        d = store.get_replica_desc
        check("get_replica_desc", sum(not d(k) for k in read_keys))
        return n

    return [("mc_exist_key", (), exists), ("mc_batch_exist_key", (), batch_exists), ("mc_put", (), puts),
            ("mc_get_replica_list", (), gets), ("mc_remove", (), removes),
            ("mc_put_no_data", (), session_puts), ("mc_get_replica_list_no_data", (), descs)]


def _our_cases(master: Master, n: int, read_keys: list[str], windows: list[list[str]]) -> list[tuple[str, tuple, Run]]:
    put_keys = [[f"put-{rep}-{i:08d}" for i in range(n)] for rep in range(REPEATS)]

    def exists(rep: int) -> int:
        e = master.exist_key
        hits = sum(e(k) for k in read_keys)
        assert hits == n, hits
        return n

    def batch_exists(rep: int) -> int:
        be = master.batch_exist_key
        hits = sum(sum(be(w)) for w in windows)
        assert hits == len(windows) * BATCH, hits
        return len(windows) * BATCH

    def puts(rep: int) -> int:
        return put_pairs(master, put_keys[rep], OBJECT_SIZE)

    def gets(rep: int) -> int:
        g = master.get_replica_list  # raises unless the object is there
        for k in read_keys:
            g(k)
        return n

    def removes(rep: int) -> int:
        rm = master.remove  # raises unless the object went
        for k in put_keys[rep]:
            rm(k)
        return n

    return [("exist_key", FCALLS, exists), ("batch_exist_key", FCALLS, batch_exists), ("put", FCALLS, puts),
            ("get_replica_list", FCALLS, gets), ("remove", FCALLS, removes)]


def _floor_cases(master: Master, n: int, read_keys: list[str],
                 windows: list[list[str]]) -> list[tuple[str, tuple, Run]]:
    """The design's floor on our side, through the same transport (functions.run, the lean path):
    a no-op FCALL, and the functions of bench instructions' library `mcbench` that make exactly
    the redis.calls of our reads and nothing else (no argument parsing, no checks, no logic)."""
    run, P = master.transport.run, master.transport.keys[0].P

    def noops(rep: int) -> int:
        cmd = [("FCALL", "mcb_noop", 1, P, "a", "b", "c", "d")]
        for _ in range(n):
            run(cmd)
        return n

    def reads(fn: str):
        def one_key(rep: int) -> int:
            hits = sum(len(run([("FCALL", fn, 1, P, SEGMENT, k)])[0]) for k in read_keys)
            assert hits == n, hits
            return n
        return one_key

    def batch_exists(rep: int) -> int:
        hits = sum(sum(run([("FCALL", "mcb_floor_exist", 1, P, SEGMENT, *w)])[0]) for w in windows)
        assert hits == len(windows) * BATCH, hits
        return len(windows) * BATCH

    return [("floor_noop", FCALLS, noops), ("floor_exist_key", FCALLS, reads("mcb_floor_exist")),
            ("floor_batch_exist_key", FCALLS, batch_exists), ("floor_get_replica_list", FCALLS, reads("mcb_floor_get"))]


# (result name, label, Mooncake case, our case, unit)
ROWS = [
    ("exist_key", "exist_key, 1 key", "mc_exist_key", "exist_key", "/s"),
    ("batch_exist_key", f"batch_exist_key, {BATCH} keys", "mc_batch_exist_key", "batch_exist_key", " keys/s"),
    ("put", "put_start + put_end (Mooncake's put also moves 1 KiB)", "mc_put", "put", "/s"),
    ("get_replica_list", "get_replica_list (Mooncake's get also reads 1 KiB)", "mc_get_replica_list",
     "get_replica_list", "/s"),
    ("remove", "remove", "mc_remove", "remove", "/s"),
]
FLOOR_ROWS = [
    ("floor_noop", "no-op FCALL (mcb_noop), against exist_key", "mc_exist_key", "floor_noop", "/s"),
    ("floor_exist_key", "exist_key's redis.calls (mcb_floor_exist)", "mc_exist_key", "floor_exist_key", "/s"),
    ("floor_batch_exist_key", f"batch_exist_key's, {BATCH} keys", "mc_batch_exist_key", "floor_batch_exist_key",
     " keys/s"),
    ("floor_get_replica_list", "get_replica_list's (mcb_floor_get), against get_replica_desc",
     "mc_get_replica_list_no_data", "floor_get_replica_list", "/s"),
]
NO_DATA_ROWS = [
    ("put_no_data", "put_start + put_end (batch_put_session_start/end, 1 key)", "mc_put_no_data", "put", "/s"),
    ("get_replica_list_no_data", "get_replica_list (get_replica_desc)", "mc_get_replica_list_no_data",
     "get_replica_list", "/s"),
]


def main(n: int = 3000, out=print) -> dict:
    """Run the comparison; print its table through `out`; return every figure. Raises
    MooncakeUnavailable (before starting anything) when Mooncake is not installed."""
    if n < 1:
        raise ValueError("n must be >= 1")
    store_cls, exe = find_mooncake()
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="mooncake-bench-"))
        mc_master = MooncakeMaster(exe, tmp)
        stack.callback(mc_master.stop)
        mc_master.start()
        server = stack.enter_context(private_valkey())
        r = redis.Redis.from_url(server.url)
        stack.callback(r.close)
        master = Master.connect(server.url, MasterConfig(namespace=NAMESPACE, shards=1))
        stack.callback(master.close)

        read_set = max(BATCH, min(n, READ_SET_MAX))
        # Mooncake's segment holds the read set and a round's puts (session puts are never
        # removed: 3 rounds of them), with room to spare under its 90% eviction watermark; it is
        # memory mapped, so pages no object touches cost nothing.
        segment = 1 << max(26, (4 * OBJECT_SIZE * (read_set + (1 + REPEATS) * n)).bit_length())
        store = store_cls()
        client_log = os.path.join(tmp, "mooncake_client.log")
        with _stderr_to(client_log):
            code = store.setup("127.0.0.1", "P2PHANDSHAKE", segment, LOCAL_BUFFER, "tcp", "", mc_master.address)
        if code != 0:
            raise RuntimeError(f"MooncakeDistributedStore.setup returned {code}:\n{_tail(client_log)}\n"
                               f"master log:\n{_tail(mc_master.log_path)}")

        def close_store() -> None:
            with _stderr_to(client_log):
                store.close()
        stack.callback(close_store)
        return _run(store, master, r, mc_master, segment, n, read_set, out)


def _run(store, master: Master, r: redis.Redis, mc_master: MooncakeMaster, segment: int, n: int,
         read_set: int, out) -> dict:
    res: dict[str, Any] = {"n": n, "repeats": REPEATS, "object_bytes": OBJECT_SIZE, "read_set": read_set}
    info = r.info("server")
    res["server"] = f"{info.get('server_name', 'redis')} {info.get('valkey_version') or info.get('redis_version')}"
    res["library_version"] = (server_library(master.redis) or ("not loaded",))[0]
    res["mooncake"] = mooncake_version()
    res["cores"] = os.cpu_count()
    res["started_utc"] = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    res["load_average_at_start"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    out(f"mooncake {res['mooncake']}: mooncake_master on {mc_master.address}, one MooncakeDistributedStore "
        f"client (tcp, P2PHANDSHAKE) with a {segment >> 20} MiB segment of its own")
    out(f"ours     Master on a private {res['server']} (appendonly no), the lean transport; "
        f"library {res['library_version']}")
    load = res["load_average_at_start"]
    out(f"machine  {res['cores']} cores, {cpu_model()}, load average "
        f"{' '.join(f'{x:.2f}' for x in load) if load else '?'} at start ({res['started_utc']}); "
        f"Python {platform.python_version()}, redis-py {redis.__version__}")
    out(f"run      n={n:,} calls per figure and round, median of {REPEATS} rounds (each: every Mooncake "
        f"operation, then every one of ours); objects {OBJECT_SIZE} B, 1 replica; reads over {read_set:,} "
        f"stored objects")

    # the read set, stored on both sides (untimed)
    keys = [f"obj-{i:08d}" for i in range(read_set)]
    value = b"m" * OBJECT_SIZE
    bad = sum(store.put(k, value) != 0 for k in keys)
    if bad:
        raise RuntimeError(f"Mooncake put of the read set: {bad} of {read_set} failed")
    master.mount_segment(SEGMENT, SEGMENT_SIZE, CLIENT)
    for i in range(0, read_set, 1000):
        chunk = keys[i:i + 1000]
        started = master.batch_put_start(CLIENT, chunk, [OBJECT_SIZE] * len(chunk))
        if any(not isinstance(x, list) for x in started):
            raise RuntimeError(f"batch_put_start failed: {started!r:.200}")
        if any(c != 0 for c in master.batch_put_end(CLIENT, chunk)):
            raise RuntimeError("batch_put_end failed")
    read_keys = [keys[(i * 7919) % read_set] for i in range(n)]
    calls = max(10, n // 20)  # batch calls per round
    windows = [keys[s:s + BATCH] for s in ((w * BATCH) % (read_set - BATCH + 1) for w in range(calls))]

    r.function_load(FLOOR_LIBRARY, replace=True)
    m = _measure(r, Placement(r), _mooncake_cases(store, n, read_keys, windows)
                 + _our_cases(master, n, read_keys, windows) + _floor_cases(master, n, read_keys, windows))
    res["load_average_at_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None

    head = f"{'operation':<58}{'Mooncake':>16}{'ours':>16}{'ours/Mooncake':>15}   ours in the server"
    out(head)
    ops: dict[str, dict] = {}

    def row(name: str, label: str, mc: str, ours: str, unit: str) -> None:
        a, b = m[mc]["rate"], m[ours]["rate"]
        per_key = ours.endswith("batch_exist_key")
        ops[name] = {"unit": "keys/s" if per_key else "ops/s", "mooncake_per_s": a, "ours_per_s": b,
                     "ratio": b / a, "ours_server_us_per_call": m[ours]["server_us"],
                     "ours_server_us_per_key": m[ours]["server_us_per_unit"], "ours_same_cpu": m[ours]["same_cpu"]}
        srv = m[ours]["server_us"]
        where = (f"{srv:.1f} us/call" + (f", {m[ours]['server_us_per_unit']:.2f} us/key" if per_key else "")
                 if srv is not None else "")
        out(f"{label:<58}{_fmt(a) + unit:>16}{_fmt(b) + unit:>16}{b / a:>15.2f}   {where}")

    for spec in ROWS:
        row(*spec)
    out("Mooncake without moving data (the same master calls), against the same figures of ours:")
    for spec in NO_DATA_ROWS:
        row(*spec)
    out("The design's floor on our side (the same transport; a no-op, and functions making exactly the")
    out("redis.calls of our reads and nothing else: bench instructions' mcbench), against Mooncake:")
    for spec in FLOOR_ROWS:
        row(*spec)
    res["operations"] = ops
    load = res["load_average_at_end"]
    if load:
        out(f"load average {' '.join(f'{x:.2f}' for x in load)} at the end")
    return res


def _cli() -> None:
    p = argparse.ArgumentParser(prog="python -m mooncake_redis.bench.mooncake",
                                description="Our master against Mooncake's C++ master, same run (docs/bench.md).")
    p.add_argument("--n", type=int, default=3000, help="calls per figure and round (default 3000)")
    a = p.parse_args()
    if a.n < 1:
        p.error("--n must be >= 1")
    try:
        main(n=a.n)
    except MooncakeUnavailable as exc:
        sys.exit(f"error: {exc}")


if __name__ == "__main__":
    _cli()
