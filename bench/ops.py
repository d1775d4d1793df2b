"""Single-client operations benchmark: one Python client, one thread, one connection.

Measures the Master API (put_start+put_end, get_replica_list, exist_key, batch_exist_key,
remove) next to baselines measured in the same run, which it cannot beat: a no-op FCALL round
trip on a plain socket (pre-encoded RESP, no client library), the same no-op through redis-py,
the same no-op through functions.run (the lean transport, mooncake_redis/resp.py, that every
Master call takes on a plain server) and a pipelined HGET of the same keys; and the memory one
stored object costs. Every figure
comes with the server's time per call and per key (INFO commandstats deltas around its loop).
See docs/bench.md.

    python -m mooncake_redis.bench.ops [--n N] [--shards S] [--redis URL]

Without --redis it starts a private valkey-server (no AOF, no RDB) and flushes it. With
--redis it uses the namespace "bench" on that server and deletes every `bench:*` key before
(leftovers of an interrupted run) and after the run.
"""
from __future__ import annotations

import argparse
import os
import platform
import socket
import statistics
import time
from typing import Any, Callable

import redis

from mooncake_redis import Master, MasterConfig, resp
from mooncake_redis.functions import server_library
from mooncake_redis.keys import object_key, shard_of

from .common import cpu_model, delete_keys, url_or_private_valkey
from .guarantee import figures as guarantee_figures
from .retention import figures as retention_figures

NAMESPACE = "bench"
CLIENT = "bench-client"
SEGMENT = "bench-seg"
SEGMENT_SIZE = 1 << 44          # 16 TiB: never the limit here
OBJECT_SIZE = 1 << 16           # 64 KiB per object, 1 replica
REPEATS = 3                     # each figure is the median of 3 runs
BATCH = 100                     # keys per batch_exist_key call
MEM_OBJECTS = 100_000           # objects stored for the memory figure
MEM_CHUNK = 1000                # keys per batch_put_start / batch_put_end
FCALLS: tuple[str, ...] = ("fcall", "fcall_ro")  # the commandstats rows of function calls
NOOP = b"*3\r\n$8\r\nFCALL_RO\r\n$10\r\nmc_version\r\n$1\r\n0\r\n"  # FCALL_RO mc_version 0, as RESP

Run = Callable[[int], int]      # run(repeat index) -> ops (or keys) done


def put_pairs(master: Master, keys: list[str], size: int = OBJECT_SIZE) -> int:
    """put_start + put_end of each key, one replica of `size` bytes; returns the puts done."""
    ps, pe = master.put_start, master.put_end
    for key in keys:
        ps(CLIENT, key, size)
        pe(CLIENT, key)
    return len(keys)


def _fmt(x: float) -> str:
    return f"{x:,.0f}"


def _cmdstats(r: redis.Redis) -> dict[str, tuple[int, int]]:
    """{command: (calls, usec)} from INFO commandstats."""
    return {name.removeprefix("cmdstat_"): (int(row["calls"]), int(row["usec"]))
            for name, row in r.info("commandstats").items()}


def _last_cpu(pid: int | str) -> int | None:
    """The CPU a process last ran on (Linux /proc), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[36])
    except (OSError, ValueError, IndexError):
        return None


class Placement:
    """Samples whether the client and a local server last ran on the same CPU. On a small VM
    this decides much of the round-trip time (see docs/bench.md), so every figure reports it."""

    def __init__(self, r: redis.Redis):
        try:
            pid = int(r.info("server")["process_id"])
        except (KeyError, ValueError):
            pid = None
        self.pid = pid if pid is not None and _last_cpu(pid) is not None else None

    def sample(self) -> bool | None:
        if self.pid is None:
            return None
        c, s = _last_cpu("self"), _last_cpu(self.pid)
        return None if c is None or s is None else c == s


def _reply_end(buf: bytes, pos: int = 0) -> int | None:
    """Where the RESP2 reply that starts at buf[pos] ends, or None while buf holds only part of it."""
    eol = buf.find(b"\r\n", pos)
    if eol < 0:
        return None
    kind, end = buf[pos:pos + 1], eol + 2
    if kind in (b"+", b"-", b":"):
        return end
    n = int(buf[pos + 1:eol])
    if kind == b"$":
        return end if n < 0 else (end + n + 2 if len(buf) >= end + n + 2 else None)
    if kind == b"*":
        for _ in range(max(n, 0)):
            nxt = _reply_end(buf, end)
            if nxt is None:
                return None
            end = nxt
        return end
    raise RuntimeError(f"not a RESP2 reply: {buf[pos:pos + 40]!r}")


class RawNoop:
    """The floor of a round trip: FCALL_RO mc_version 0 sent pre-encoded on a plain socket, its
    (constant) reply read back as bytes and compared with the first one. No client library."""

    def __init__(self, r: redis.Redis):
        kw = r.connection_pool.connection_kwargs
        if "path" in kw:
            self.sock = socket.socket(socket.AF_UNIX)
            self.sock.connect(kw["path"])
        else:
            self.sock = socket.create_connection((kw.get("host", "localhost"), kw.get("port", 6379)))
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if kw.get("password"):
            args = [b"AUTH", *([kw["username"].encode()] if kw.get("username") else []), kw["password"].encode()]
            self._ask(b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args))
        self.reply = self._ask(NOOP)

    def _ask(self, command: bytes) -> bytes:
        self.sock.sendall(command)
        buf = b""
        while (end := _reply_end(buf)) is None:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise RuntimeError("the server closed the raw socket")
            buf += chunk
        if buf.startswith(b"-"):
            raise RuntimeError(f"the server refused the raw socket's command: {buf.decode(errors='replace')}")
        return buf[:end]

    def run(self, n: int) -> int:
        send, recv, want, reply = self.sock.sendall, self.sock.recv, len(self.reply), self.reply
        for _ in range(n):
            send(NOOP)
            got = recv(want)
            while len(got) < want:
                more = recv(want - len(got))
                if not more:
                    raise RuntimeError("the server closed the raw socket")
                got += more
            if got != reply:
                raise RuntimeError(f"unexpected reply on the raw socket: {got!r}")
        return n

    def close(self) -> None:
        self.sock.close()


def _measure(r: redis.Redis, where: Placement,
             cases: list[tuple[str, tuple[str, ...], Run]]) -> dict[str, dict]:
    """Run each case REPEATS times, all the cases in turn within every repeat, so that every
    operation and every baseline see the same machine. case = (name, commandstats rows, run).
    Returns name -> {rate: median ops (or keys) per second; server_us: server usec per call of
    those commands, server_us_per_unit: per op (or key), each the median over the repeats, from
    INFO commandstats read just before and after each run (a median, as the rate is: commandstats
    counts a command's wall time, so a server descheduled inside one call inflates a sum);
    same_cpu: "k/m" samples (before and after each run) with client and server on one CPU}."""
    rates: dict[str, list[float]] = {name: [] for name, _, _ in cases}
    server: dict[str, list[tuple[int, int, int]]] = {name: [] for name, _, _ in cases}  # (calls, usec, units) a run
    same: dict[str, list[bool]] = {name: [] for name, _, _ in cases}
    for rep in range(REPEATS):
        for name, cmds, run in cases:
            s0 = where.sample()
            before = _cmdstats(r)
            t0 = time.perf_counter()
            units = run(rep)
            rates[name].append(units / (time.perf_counter() - t0))
            after = _cmdstats(r)
            s1 = where.sample()
            calls = sum(after.get(cmd, (0, 0))[0] - before.get(cmd, (0, 0))[0] for cmd in cmds)
            usec = sum(after.get(cmd, (0, 0))[1] - before.get(cmd, (0, 0))[1] for cmd in cmds)
            server[name].append((calls, usec, units))
            same[name] += [x for x in (s0, s1) if x is not None]

    def median_of(name: str, per: int) -> float | None:  # usec a call (per=0) or a unit (per=2)
        runs = [run for run in server[name] if run[0]]
        return statistics.median(run[1] / run[per] for run in runs) if runs else None

    return {name: {"rate": statistics.median(rates[name]),
                   "server_us": median_of(name, 0), "server_us_per_unit": median_of(name, 2),
                   "same_cpu": f"{sum(same[name])}/{len(same[name])}" if same[name] else None}
            for name, _, _ in cases}


def _cpu_seconds(r: redis.Redis) -> tuple[float, float, float] | None:
    """(machine busy, this process, the server) CPU seconds so far; None when the server is not
    a local process we can see (then other load cannot be told apart)."""
    try:
        pid = int(r.info("server")["process_id"])
        if not os.path.exists(f"/proc/{pid}/stat"):
            return None
        tick = os.sysconf("SC_CLK_TCK")
        with open("/proc/stat") as f:
            cpu = [int(x) for x in f.readline().split()[1:]]
        busy = (sum(cpu) - cpu[3] - cpu[4]) / tick  # all but idle and iowait
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        server = (int(fields[11]) + int(fields[12])) / tick
        t = os.times()
        return busy, t.user + t.system, server
    except (OSError, KeyError, ValueError, IndexError):
        return None


def _delete_namespace(r: redis.Redis) -> int:
    """SCAN + DEL every `bench:*` and `bench.*` key (bench/retention.py's stores); returns how
    many were deleted."""
    return delete_keys(r, f"{NAMESPACE}:*", f"{NAMESPACE}.*")


def main(url: str | None = None, n: int = 20000, shards: int = 1, out=print,
         expire_sizes: tuple[int, ...] = (10_000, 1_000_000)) -> dict:
    """Run the benchmark; print one line per figure through `out`; return all figures."""
    if n < 1 or shards < 1:
        raise ValueError("n and shards must be >= 1")
    with url_or_private_valkey(url) as (url, server):
        r = redis.Redis.from_url(url)
        master: Master | None = None
        try:
            if server is not None:
                r.flushall()
            else:
                left = _delete_namespace(r)
                if left:
                    out(f"note     deleted {left} leftover {NAMESPACE}:* keys of an earlier run")
            master = Master.connect(url, MasterConfig(namespace=NAMESPACE, shards=shards))
            where = url if server is None else "a private valkey-server (appendonly no)"
            return _run(master, r, where, n, shards, out, url, expire_sizes)
        finally:
            if master is not None:
                master.close()
            if server is None:
                _delete_namespace(r)
            r.close()


def _run(master: Master, r: redis.Redis, where: str, n: int, shards: int, out, url: str,
         expire_sizes: tuple[int, ...]) -> dict:
    res: dict[str, Any] = {"n": n, "shards": shards, "repeats": REPEATS}
    info = r.info("server")
    res["server"] = f"{info.get('server_name', 'redis')} {info.get('valkey_version') or info.get('redis_version')}"
    res["cores"] = os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    res["library_version"] = (server_library(master.redis) or ("not loaded",))[0]
    out(f"server   {res['server']} (malloc {r.info('memory').get('mem_allocator', '?')}), {where}")
    out(f"machine  {res['cores']} cores, {cpu_model()}, load average {load:.2f} at start; "
        f"Python {platform.python_version()}, redis-py {redis.__version__}")
    out(f"run      n={n:,} ops per figure and repeat, shards={shards}, median of {REPEATS}, "
        f"one client/thread/connection; library {res['library_version']}")
    cpu0, wall0 = _cpu_seconds(r), time.perf_counter()

    master.mount_segment(SEGMENT, SEGMENT_SIZE, CLIENT)
    rc = master.redis  # the Master's own client: the baselines pay the same redis-py costs

    # ---- memory per stored object; these objects are also what the reads below read ----
    mem_keys = [f"obj-{i:08d}" for i in range(MEM_OBJECTS)]
    before = r.info("memory")
    t0 = time.perf_counter()
    for i in range(0, MEM_OBJECTS, MEM_CHUNK):
        chunk = mem_keys[i:i + MEM_CHUNK]
        started = master.batch_put_start(CLIENT, chunk, [OBJECT_SIZE] * len(chunk))
        bad = [x for x in started if not isinstance(x, list)]
        if bad:
            raise RuntimeError(f"batch_put_start failed: {bad[0]!r}")
        bad = [c for c in master.batch_put_end(CLIENT, chunk) if c != 0]
        if bad:
            raise RuntimeError(f"batch_put_end failed: {bad[0]!r}")
    res["batch_put_keys_per_s"] = MEM_OBJECTS / (time.perf_counter() - t0)
    after = r.info("memory")
    res["bytes_per_object"] = (after["used_memory"] - before["used_memory"]) / MEM_OBJECTS
    res["rss_bytes_per_object"] = (after["used_memory_rss"] - before["used_memory_rss"]) / MEM_OBJECTS
    k0 = mem_keys[0].encode()
    okey0 = object_key(NAMESPACE, shard_of(k0, shards), "default", k0)
    res["memory_usage_one_key"] = r.memory_usage(okey0, samples=0)
    enc = r.object("encoding", okey0)
    res["object_hash_encoding"] = enc.decode() if isinstance(enc, bytes) else enc
    out(f"memory   {res['bytes_per_object']:,.0f} B/object (used_memory delta over {MEM_OBJECTS:,} complete "
        f"objects, 1 replica; target < 400: {'met' if res['bytes_per_object'] < 400 else 'MISSED'})   "
        f"MEMORY USAGE of one object hash {res['memory_usage_one_key']} B ({res['object_hash_encoding']})   "
        f"rss delta {res['rss_bytes_per_object']:,.0f} B/object")
    out(f"{'batch_put x' + str(MEM_CHUNK):<22}{_fmt(res['batch_put_keys_per_s']):>10} keys/s   "
        f"(batch_put_start + batch_put_end of {MEM_CHUNK} keys; one run, while filling the store above)")

    # ---- the operations and their baselines, measured side by side ----
    raw = None if issubclass(rc.connection_pool.connection_class, redis.SSLConnection) else RawNoop(rc)

    def raw_noop(rep: int) -> int:
        assert raw is not None  # a case only then
        return raw.run(n)

    def noop(rep: int) -> int:
        ex = rc.execute_command
        for _ in range(n):
            ex("FCALL_RO", "mc_version", 0)
        return n

    lean_cmd = [("FCALL_RO", "mc_version", 0)]
    lean = resp.lean_for(rc, lean_cmd) is not None  # memory://, rediss://, a cluster: redis-py

    def lean_noop(rep: int) -> int:
        call = master.transport.run
        for _ in range(n):
            call(lean_cmd)
        return n

    put_keys = [[f"put-{rep}-{i:08d}" for i in range(n)] for rep in range(REPEATS)]

    def puts(rep: int) -> int:
        return put_pairs(master, put_keys[rep])

    read_keys = [mem_keys[(i * 7919) % MEM_OBJECTS] for i in range(n)]  # spread over the store
    got = master.get_replica_list(read_keys[0])
    assert got.replicas and got.replicas[0].size == OBJECT_SIZE, got
    assert master.exist_key(read_keys[-1]) and not master.exist_key("no-such-key")

    def gets(rep: int) -> int:
        g = master.get_replica_list
        for key in read_keys:
            g(key)
        return n

    def exists(rep: int) -> int:
        e = master.exist_key
        hits = sum(e(key) for key in read_keys)
        assert hits == n, hits
        return n

    calls = max(10, n // 20)  # batch calls per repeat: n=20000 -> 1000 calls, 100k keys
    starts = [(w * BATCH) % (MEM_OBJECTS - BATCH + 1) for w in range(calls)]
    windows = [mem_keys[s:s + BATCH] for s in starts]
    hget_windows = [[object_key(NAMESPACE, shard_of(k.encode(), shards), "default", k.encode()) for k in w]
                    for w in windows]
    assert all(master.batch_exist_key(windows[0]))

    def batch_exists(rep: int) -> int:
        be = master.batch_exist_key
        hits = sum(sum(be(w)) for w in windows)
        assert hits == calls * BATCH, hits
        return calls * BATCH

    def hget_pipelined(rep: int) -> int:
        for w in hget_windows:
            pipe = rc.pipeline(transaction=False)
            for okey in w:
                pipe.hget(okey, "size")
            replies = pipe.execute()
        assert replies[0] is not None
        return calls * BATCH

    def removes(rep: int) -> int:
        # the keys the same repeat's puts stored; put_end leases an object until that moment
        # only, so no remove meets OBJECT_HAS_LEASE (remove raises unless the object went)
        rm = master.remove
        for key in put_keys[rep]:
            rm(key)
        return n

    cases: list[tuple[str, tuple[str, ...], Callable[[int], int]]] = [("raw_noop", FCALLS, raw_noop)] if raw else []
    cases += [("noop", FCALLS, noop), ("lean_noop", FCALLS, lean_noop), ("put", FCALLS, puts),
              ("get_replica_list", FCALLS, gets),
              ("exist_key", FCALLS, exists), ("hget", ("hget",), hget_pipelined),
              ("batch_exist_key", FCALLS, batch_exists), ("remove", FCALLS, removes)]
    try:
        m = _measure(r, Placement(r), cases)
    finally:
        if raw:
            raw.close()

    def server(op: dict, per_key: bool = True) -> str:
        """The server's usec per call (and per key) of the figure, and the placement samples."""
        s = f"   server {op['server_us']:.1f} us/call" if op["server_us"] is not None else ""
        s += f", {op['server_us_per_unit']:.1f} us/key" if s and per_key else ""
        return s + (f"   same cpu {op['same_cpu']}" if op["same_cpu"] else "")

    # the baselines
    noop_rate, raw_rate = m["noop"]["rate"], m["raw_noop"]["rate"] if raw else None
    res["noop_fcall_ops_per_s"], res["noop_fcall_server_us"] = noop_rate, m["noop"]["server_us"]
    res["raw_noop_fcall_ops_per_s"] = raw_rate
    res["raw_noop_fcall_server_us"] = m["raw_noop"]["server_us"] if raw else None
    out("baselines, measured in this run (each repeat runs every baseline and operation in turn):")
    if raw_rate is not None:  # with raw
        out(f"{'raw-socket no-op':<22}{_fmt(raw_rate):>10} ops/s   FCALL_RO mc_version 0, pre-encoded RESP on a "
            f"plain socket (no client library)" + server(m["raw_noop"], per_key=False))
    else:
        out(f"{'raw-socket no-op':<22}{'n/a':>10}         (a TLS connection: no plain socket)")
    out(f"{'no-op FCALL':<22}{_fmt(noop_rate):>10} ops/s   FCALL_RO mc_version 0 through the Master's redis-py "
        f"client" + server(m["noop"], per_key=False))
    lean_rate = m["lean_noop"]["rate"]
    res["lean_noop_fcall_ops_per_s"], res["lean_noop_fcall_server_us"] = lean_rate, m["lean_noop"]["server_us"]
    res["lean_noop_transport"] = "lean" if lean else "redis-py"
    out(f"{'lean no-op':<22}{_fmt(lean_rate):>10} ops/s   FCALL_RO mc_version 0 through functions.run, the path of "
        f"every Master call ({'the lean transport' if lean else 'redis-py: no lean transport for this client'})"
        + server(m["lean_noop"], per_key=False))
    base = m["hget"]
    res["hget_pipelined_keys_per_s"], res["hget_pipelined_calls_per_s"] = base["rate"], base["rate"] / BATCH
    res["hget_server_us"] = base["server_us"]
    out(f"{'pipelined HGET x' + str(BATCH):<22}{_fmt(base['rate']):>10} keys/s "
        f"({_fmt(base['rate'] / BATCH)} calls/s)   "
        f"HGET <object key> size of the batch_exist_key keys, one pipeline per {BATCH}"
        + (f"   server {base['server_us']:.1f} us/HGET" if base["server_us"] is not None else ""))

    def vs(rate: float, pair: bool = False) -> tuple[float, float | None, float, str]:
        """Ratios of an op rate to the redis-py, raw and lean no-ops (a put pair makes two round
        trips)."""
        div = 2 if pair else 1
        r_noop, r_raw = rate / (noop_rate / div), rate / (raw_rate / div) if raw_rate is not None else None
        r_lean = rate / (lean_rate / div)
        two, s = ("2 ", "s") if pair else ("", "")
        text = (f"vs {two}raw no-op{s} {r_raw:.2f}   " if raw else "") + \
            f"vs {two}redis-py no-op{s} {r_noop:.2f}   vs {two}lean no-op{s} {r_lean:.2f}"
        return r_noop, r_raw, r_lean, text

    out("operations (ratio = rate / baseline rate):")
    for key, label, pair in (("put", "put_start+put_end", True), ("get_replica_list", "get_replica_list", False),
                             ("exist_key", "exist_key", False)):
        op = m[key]
        r_noop, r_raw, r_lean, text = vs(op["rate"], pair)
        res[f"{key}_ops_per_s"], res[f"{key}_server_us_per_fcall"] = op["rate"], op["server_us"]
        res[f"{key}_server_us_per_key"], res[f"{key}_same_cpu"] = op["server_us_per_unit"], op["same_cpu"]
        res[f"{key}_ratio"], res[f"{key}_ratio_raw"], res[f"{key}_ratio_lean"] = r_noop, r_raw, r_lean
        out(f"{label:<22}{_fmt(op['rate']):>10} ops/s   {text}" + server(op))

    op = m["batch_exist_key"]
    rate = op["rate"]
    c_noop, c_raw, c_lean, text = vs(rate / BATCH)
    res["batch_exist_key_keys_per_s"], res["batch_exist_key_calls_per_s"] = rate, rate / BATCH
    res["batch_exist_key_server_us_per_fcall"] = op["server_us"]
    res["batch_exist_key_server_us_per_key"] = op["server_us_per_unit"]
    res["batch_exist_key_same_cpu"] = op["same_cpu"]
    res["batch_exist_key_ratio"] = rate / base["rate"]
    res["batch_exist_key_calls_ratio"], res["batch_exist_key_calls_ratio_raw"] = c_noop, c_raw
    res["batch_exist_key_calls_ratio_lean"] = c_lean
    out(f"{'batch_exist_key x' + str(BATCH):<22}{_fmt(rate):>10} keys/s ({_fmt(rate / BATCH)} calls/s)   "
        f"vs pipelined HGET {rate / base['rate']:.2f}   calls {text}" + server(op))

    op = m["remove"]
    r_noop, r_raw, r_lean, text = vs(op["rate"])
    res["remove_ops_per_s"], res["remove_server_us_per_fcall"] = op["rate"], op["server_us"]
    res["remove_server_us_per_key"], res["remove_same_cpu"] = op["server_us_per_unit"], op["same_cpu"]
    res["remove_ratio"], res["remove_ratio_raw"], res["remove_ratio_lean"] = r_noop, r_raw, r_lean
    out(f"{'remove':<22}{_fmt(op['rate']):>10} ops/s   {text}" + server(op))

    out("group retention (bench/retention.py):")
    res.update(retention_figures(url, r, REPEATS, out))
    out("explicit caching (bench/guarantee.py):")
    res.update(guarantee_figures(url, r, max(1, n // 4), REPEATS, out, expire_sizes))

    cpu1, wall = _cpu_seconds(r), time.perf_counter() - wall0
    if cpu0 and cpu1:
        busy, client, srv_cpu = (b - a for a, b in zip(cpu0, cpu1))
        res["cpu_client_cores"], res["cpu_server_cores"] = client / wall, srv_cpu / wall
        res["cpu_other_cores"] = max(0.0, busy - client - srv_cpu) / wall
        out(f"cpu      client {res['cpu_client_cores']:.2f} cores, server {res['cpu_server_cores']:.2f}, "
            f"other processes {res['cpu_other_cores']:.2f} (of {res['cores']}) over the {wall:.0f} s run")
    return res


def _cli() -> None:
    p = argparse.ArgumentParser(prog="python -m mooncake_redis.bench.ops",
                                description="Single-client operations benchmark (docs/bench.md).")
    p.add_argument("--n", type=int, default=20000, help="ops per figure and repeat (default 20000)")
    p.add_argument("--shards", type=int, default=1, help="shards of the bench namespace (default 1)")
    p.add_argument("--expire-sizes", default="10000,1000000", metavar="N,N",
                   help="store sizes (guaranteed objects) of the expire_guaranteed figure")
    p.add_argument("--redis", default=None, metavar="URL",
                   help="a running server (namespace 'bench'; every bench:* key is deleted before and "
                        "after); default: a private valkey-server started and stopped here")
    a = p.parse_args()
    if a.n < 1 or a.shards < 1:
        p.error("--n and --shards must be >= 1")
    main(url=a.redis, n=a.n, shards=a.shards, expire_sizes=tuple(int(x) for x in a.expire_sizes.split(",")))


if __name__ == "__main__":
    _cli()
