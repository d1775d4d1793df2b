"""Eviction benchmark: the cost of one mc_evict step as the store grows, eviction throughput, and
puts into a store four times over capacity. See docs/bench-evict.md.

Server times come from INFO commandstats (the usec and calls of FCALL read just before and after
what is measured: exact, and nothing added inside the calls). Maxima come from the SLOWLOG, set
once to log the calls over SLOW_US (1 ms) and read once at the end of each phase (never reset: the
first call after a SLOWLOG RESET that frees many entries is slow, which is not eviction's doing).

For each size N: a fresh store (FLUSHALL of the private server) is bulk-loaded through the functions
(batch_put_start + batch_put_end, 1000 keys a batch) with N objects of 1 KiB on one segment sized so
that the store sits just under the high watermark (used = 0.899 x capacity); then it is pushed over
the watermark and measured:

  * one mc_evict step that frees STEP_UNITS units: the median and max of STEPS steps, server side
    (commandstats around each call) and client side (one round trip); after each step the evicted
    units are put back so that every step runs at the same size and over the watermark; the same
    with SMALL_UNITS units;
  * the fill's mean server time per call and per key, and its longest call;
  * throughput: run_eviction from OVERSHOOT x capacity down to the target (0.85 x capacity).

Then the 4x-over-capacity put test: one segment of S bytes, 4 x S / 64 KiB puts of 64 KiB
(put_start + put_end each, no reads, evict-on-put makes the room): put failures and puts/s.

With --radix-depth D the stores run with the radix index on (enable_radix_tree): each key is
its own node (64 hex characters), registered before its put (batch_register_radix_nodes) in
chains of D nodes, key i's parent being key i - 1 unless i is a multiple of D; eviction then takes
each chain from its leaf up. The fill line reports the server's used_memory per object, to
compare with a run without the index.

    python -m mooncake_redis.bench.evict [--sizes 10000,100000,1000000] [--redis URL] [--put-mib 256]
                                         [--radix-depth 16]
"""
from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import re
import statistics
import sys
import time
from typing import Any

import redis

from mooncake_redis import ErrorCode, Master, MasterConfig, MasterError, wire
from mooncake_redis.master import EVICT_STEP_UNITS

from .common import WIDE_WATERMARKS, cpu_model, url_or_private_valkey

NAMESPACE = "bevict"
CLIENT = "bench-evict"
SEGMENT = "bench-seg"
T0 = 1_700_000_000_000       # the frozen store clock
OBJ = 1024                   # bytes per object of the fill
BATCH = 1000                 # keys per batch_put_start / batch_put_end of the fill
FILL_RATIO = 0.899           # the fill leaves used just under the 0.90 watermark
OVER_RATIO = 0.905           # level of the step measurements (over the watermark)
OVERSHOOT = 0.95             # start level of the run_eviction throughput figure
STEP_UNITS = EVICT_STEP_UNITS  # max_units of one measured mc_evict step (the workers' default)
STEPS = 20                   # measured steps per size (median reported)
SMALL_UNITS = 8               # a second, smaller step size measured the same way
PUT_OBJ = 64 * 1024          # object size of the 4x-over-capacity put test
SLOWLOG_LEN = 100_000        # room for every call over SLOW_US of the largest phase (the 1M fill)
SLOW_US = 1000               # slowlog-log-slower-than, set once: the maxima reported are the calls
                             # over 1 ms (a lower threshold logs far more, and 0 also logs each
                             # command the scripts run, inside the calls' time)

_MORE_ARGS = re.compile(rb"\.\.\. \((\d+) more arguments\)$")


# ---- helpers -------------------------------------------------------------------------------------

def _fmt(x: float) -> str:
    return f"{x:,.0f}"


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f} us"


def _argc(command: bytes) -> int:
    """Arguments of a SLOWLOG entry (Valkey keeps the first 31 and a "... (N more arguments)")."""
    m = _MORE_ARGS.search(command)
    if m:
        return 31 + int(m.group(1))
    return len(command.split(b" "))


class SlowLog:
    """The function calls over SLOW_US, phase by phase. slowlog-log-slower-than is set once;
    `begin` notes the newest entry's id, `end` reads SLOWLOG GET once and keeps what is newer."""

    def __init__(self, r: redis.Redis):
        self.r = r
        self.saved = {k: r.config_get(k)[k] for k in ("slowlog-log-slower-than", "slowlog-max-len")}
        r.config_set("slowlog-max-len", SLOWLOG_LEN)
        r.config_set("slowlog-log-slower-than", SLOW_US)
        self.mark = -1

    def begin(self) -> None:
        newest = self.r.slowlog_get(1)
        self.mark = int(newest[0]["id"]) if newest else -1

    def end(self) -> list[tuple[bytes, int, int]]:
        """(function name, duration us, argc) of the FCALLs over SLOW_US since `begin`."""
        entries = [e for e in self.r.slowlog_get(SLOWLOG_LEN) if int(e["id"]) > self.mark]
        if len(entries) >= SLOWLOG_LEN:
            raise RuntimeError("SLOWLOG overflowed: raise SLOWLOG_LEN")
        out = []
        for e in entries:
            cmd = e["command"] if isinstance(e["command"], bytes) else str(e["command"]).encode()
            parts = cmd.split(b" ", 2)
            if parts[0].upper() == b"FCALL" and len(parts) > 1:
                out.append((parts[1], int(e["duration"]), _argc(cmd)))
        return out

    def restore(self) -> None:
        for k, v in self.saved.items():
            self.r.config_set(k, v)  # type: ignore[arg-type]  # redis-py types config_get's values loosely


def _longest(calls: list[tuple[bytes, int, int]], *fns: bytes) -> tuple[int, str]:
    """The longest of the calls to `fns` (us, 0 when none) and how to say it."""
    d = max((d for f, d, _ in calls if f in fns), default=0)
    if not d:
        return 0, f"none over {SLOW_US:,} us"
    f = next(f for f, dd, _ in calls if f in fns and dd == d)
    return d, f"{f.decode()} {d:,} us"


def _fcall_stats(r: redis.Redis) -> tuple[int, int]:
    """(calls, usec) of FCALL so far (INFO commandstats)."""
    row = r.info("commandstats").get("cmdstat_fcall", {"calls": 0, "usec": 0})
    return int(row["calls"]), int(row["usec"])


class FcallTime:
    """Sums the server's FCALL calls and usec (commandstats deltas) around what it wraps."""

    def __init__(self, r: redis.Redis):
        self.r, self.calls, self.usec = r, 0, 0

    def __enter__(self) -> "FcallTime":
        self._c0, self._u0 = _fcall_stats(self.r)
        return self

    def __exit__(self, *exc) -> None:
        c1, u1 = _fcall_stats(self.r)
        self.calls += c1 - self._c0
        self.usec += u1 - self._u0

    def per_call(self) -> float:
        return self.usec / max(self.calls, 1)


def _fresh(r: redis.Redis, private: bool) -> None:
    if private:
        r.flushall()
        return
    batch: list[bytes] = []
    for key in r.scan_iter(match=f"{NAMESPACE}:*", count=1000):
        batch.append(key)
        if len(batch) >= 1000:
            r.delete(*batch)
            batch = []
    if batch:
        r.delete(*batch)


def _connect(url: str, radix: bool = False) -> Master:
    m = Master.connect(url, MasterConfig(namespace=NAMESPACE, shards=1, enable_radix_tree=radix, **WIDE_WATERMARKS))
    m.freeze_clock(T0)
    return m


def _put_batch(m: Master, keys: list[str], size: int, timed: dict[bytes, FcallTime] | None = None,
               depth: int = 0) -> None:
    """batch_put_start + batch_put_end of `keys`; with `timed` ({b"mc_put_start": FcallTime,
    b"mc_put_end": FcallTime}), the server time of each half is added to its FcallTime. With a
    radix `depth`, the keys' nodes are registered first, in chains of `depth` (not timed)."""
    if depth:
        pairs = [(k, f"{int(k, 16) - 1:064x}" if int(k, 16) % depth else None) for k in keys]
        codes = m.batch_register_radix_nodes(pairs)
        if any(c != ErrorCode.OK for c in codes):
            raise RuntimeError(f"batch_register_radix_nodes failed: {codes[0]!r}")

    def run(fn: bytes, call):
        if timed is None:
            return call()
        with timed[fn]:
            return call()

    started = run(b"mc_put_start", lambda: m.batch_put_start(CLIENT, keys, [size] * len(keys)))
    bad = [x for x in started if not isinstance(x, list)]
    if bad:
        raise RuntimeError(f"batch_put_start failed: {bad[0]!r} ({len(bad)} of {len(keys)})")
    ended = run(b"mc_put_end", lambda: m.batch_put_end(CLIENT, keys))
    bad = [c for c in ended if c != ErrorCode.OK]
    if bad:
        raise RuntimeError(f"batch_put_end failed: {bad[0]!r}")


class Keys:
    """Fresh object keys in put order (their zero-padded names sort in put order too); with a
    radix depth, 64 hex characters (each key its own radix node)."""

    def __init__(self, depth: int = 0) -> None:
        self.n = 0
        self.depth = depth

    def take(self, count: int) -> list[str]:
        if self.depth:
            out = [f"{i:064x}" for i in range(self.n, self.n + count)]
            self.n += count
            return out
        out = [f"o{i:09d}" for i in range(self.n, self.n + count)]
        self.n += count
        return out


# ---- one size ------------------------------------------------------------------------------------

def _bench_size(url: str, r: redis.Redis, private: bool, n: int, out, depth: int = 0) -> dict[str, Any]:
    res: dict[str, Any] = {"objects": n}
    _fresh(r, private)
    mem0 = r.info("memory")["used_memory"]
    m = _connect(url, radix=depth > 0)
    try:
        cap = math.ceil(n * OBJ / FILL_RATIO)
        m.mount_segment(SEGMENT, cap, CLIENT)
        keys = Keys(depth)
        slow = SlowLog(r)
        try:
            # ---- fill ----
            slow.begin()
            timed = {b"mc_put_start": FcallTime(r), b"mc_put_end": FcallTime(r)}
            t0 = time.perf_counter()
            left = n
            while left:
                chunk = keys.take(min(BATCH, left))
                _put_batch(m, chunk, OBJ, timed, depth)
                m.advance_clock(1)  # each batch is a little younger than the one before
                left -= len(chunk)
            fill_s = time.perf_counter() - t0
            fill_slow = slow.end()
            u = m.usage()
            mem = r.info("memory")["used_memory"]
            res.update(fill_s=fill_s, fill_keys_per_s=n / fill_s, capacity=cap, used=u.used_bytes,
                       used_memory=mem, memory_per_object=(mem - mem0) / n)
            out(f"size {n:,}: fill {n:,} x {OBJ} B in {fill_s:.1f} s ({_fmt(n / fill_s)} keys/s), "
                f"used {u.used_bytes / cap:.2%} of {cap:,} B, server used_memory {mem / 2**20:,.0f} MiB "
                f"({(mem - mem0) / n:,.0f} B per object{f', radix chains of {depth}' if depth else ''})")
            heads = {b"mc_put_start": 4 + len(m._put_head(CLIENT, "default", None)),  # FCALL fn 1 P + options
                     b"mc_put_end": 4 + len(wire.head(wire.KEY, client_id=CLIENT, tenant="default"))}
            for fn, t in timed.items():
                name = fn.decode()
                res[f"fill_{name}_mean_us"], res[f"fill_{name}_us_per_key"] = t.per_call(), t.usec / n
                calls = [(d, (argc - heads[fn]) // (2 if fn == b"mc_put_start" else 1))
                         for f, d, argc in fill_slow if f == fn]
                d, k = max(calls, default=(0, 0))
                res[f"fill_{name}_max_us"] = d
                longest = (f"longest {d:,} us ({k} keys, {d / max(k, 1):.1f} us/key), {len(calls):,} calls over "
                           f"{SLOW_US:,} us" if d else f"none over {SLOW_US:,} us")
                out(f"  fill {name:<13} server mean {t.per_call():,.0f} us/call over {t.calls:,} calls, "
                    f"{t.usec / n:.1f} us/key; {longest}")

            # ---- over the watermark: STEPS measured steps of STEP_UNITS units each ----
            over = math.ceil(OVER_RATIO * cap / OBJ) - n
            _put_batch(m, keys.take(over), OBJ, depth=depth)
            m.advance_clock(1)
            slow.begin()
            srv, cli, used_after = _measure_steps(m, r, keys, STEP_UNITS)
            logged, text = _longest(slow.end(), b"mc_evict")
            med_srv, max_srv = statistics.median(srv), max(srv)
            med_cli, max_cli = statistics.median(cli), max(cli)
            res.update(step_server_us=med_srv, step_server_max_us=max_srv, step_client_us=med_cli * 1e6,
                       step_client_max_us=max_cli * 1e6, step_us_per_unit=med_srv / STEP_UNITS,
                       step_slowlog_max_us=logged)
            out(f"  mc_evict step ({STEP_UNITS} units, used {used_after / cap:.2%} after): "
                f"median server {med_srv:,.0f} us ({med_srv / STEP_UNITS:.1f} us/unit), client {_us(med_cli)}; "
                f"max server {max_srv:,} us, client {_us(max_cli)} ({STEPS} steps, commandstats); "
                f"SLOWLOG: {text}")
            # the same with a smaller step
            slow.begin()
            srv, cli, _ = _measure_steps(m, r, keys, SMALL_UNITS)
            logged, text = _longest(slow.end(), b"mc_evict")
            res.update(small_step_server_us=statistics.median(srv), small_step_server_max_us=max(srv),
                       small_step_slowlog_max_us=logged, small_step_client_max_us=max(cli) * 1e6)
            out(f"  mc_evict step ({SMALL_UNITS} units): median server {statistics.median(srv):,.0f} us, "
                f"client {_us(statistics.median(cli))}; max server {max(srv):,} us, client {_us(max(cli))}; "
                f"SLOWLOG: {text}")

            # ---- throughput: run_eviction from OVERSHOOT x capacity to the target ----
            now_objs = m.usage().objects
            _put_batch_many(m, keys, math.ceil(OVERSHOOT * cap / OBJ) - now_objs)
            m.advance_clock(1)
            before = m.usage().used_bytes
            slow.begin()
            with FcallTime(r) as t:
                t0 = time.perf_counter()
                report = m.run_eviction(max_units_per_step=STEP_UNITS)
                run_s = time.perf_counter() - t0
            logged, text = _longest(slow.end(), b"mc_evict")
            final = report.final[0]
            res.update(run_units=report.evicted_units, run_s=run_s, run_units_per_s=report.evicted_units / run_s,
                       run_steps=report.steps, run_state=final.state, run_step_mean_us=t.per_call(),
                       run_step_max_us=logged, run_server_s=t.usec / 1e6)
            out(f"  run_eviction {before / cap:.2%} -> {final.used_bytes / cap:.2%} ({final.state}): "
                f"{report.evicted_units:,} units in {run_s:.2f} s = {_fmt(report.evicted_units / run_s)} units/s "
                f"({_fmt(report.evicted_units / max(t.usec / 1e6, 1e-9))} units/s of server time), "
                f"{report.steps} steps, server mean {t.per_call():,.0f} us; SLOWLOG: {text}")
            res["max_evict_call_us"] = max(max_srv, res["step_slowlog_max_us"], res["run_step_max_us"])
            res["max_small_step_us"] = max(res["small_step_server_max_us"], res["small_step_slowlog_max_us"])
        finally:
            slow.restore()
    finally:
        m.close()
    return res


def _measure_steps(m: Master, r: redis.Redis, keys: Keys, units: int) -> tuple[list[int], list[float], int]:
    """STEPS mc_evict steps of `units` units, each followed by a refill of what it evicted (not
    measured). Returns (server usec per step from INFO commandstats, client seconds per step,
    used bytes after the first step)."""
    server, client, used_after = [], [], 0
    for i in range(STEPS):
        c0, u0 = _fcall_stats(r)
        t0 = time.perf_counter()
        step = m.evict_step(0, units)
        client.append(time.perf_counter() - t0)
        c1, u1 = _fcall_stats(r)
        assert c1 - c0 == 1
        server.append(u1 - u0)
        if step.units != units:
            raise RuntimeError(f"a measured step evicted {step.units} units, not {units}: {step}")
        if i == 0:
            used_after = step.used_bytes
        _put_batch(m, keys.take(step.units), OBJ, depth=keys.depth)  # back to the same level
        m.advance_clock(1)
    return server, client, used_after


def _put_batch_many(m: Master, keys: Keys, count: int) -> None:
    while count > 0:
        chunk = keys.take(min(BATCH, count))
        _put_batch(m, chunk, OBJ, depth=keys.depth)
        count -= len(chunk)


# ---- 4x over capacity ----------------------------------------------------------------------------

def _bench_put_over(url: str, r: redis.Redis, private: bool, seg_bytes: int, out) -> dict[str, Any]:
    _fresh(r, private)
    m = _connect(url)
    try:
        m.mount_segment(SEGMENT, seg_bytes, CLIENT)
        total = 4 * seg_bytes // PUT_OBJ
        slow = SlowLog(r)
        failures: dict[str, int] = {}
        try:
            ps, pe = m.put_start, m.put_end
            slow.begin()
            with FcallTime(r) as t:
                t0 = time.perf_counter()
                for i in range(total):
                    key = f"p{i:09d}"
                    try:
                        ps(CLIENT, key, PUT_OBJ)
                        pe(CLIENT, key)
                    except MasterError as exc:
                        failures[exc.code.name] = failures.get(exc.code.name, 0) + 1
                secs = time.perf_counter() - t0
            longest, text = _longest(slow.end(), b"mc_put_start", b"mc_put_end")
        finally:
            slow.restore()
        u = m.usage()
        evicted = total - sum(failures.values()) - u.objects
        res: dict[str, Any] = {"segment_bytes": seg_bytes, "puts": total, "failures": sum(failures.values()),
               "failure_codes": failures, "puts_per_s": total / secs, "seconds": secs, "evicted": evicted,
               "objects_left": u.objects, "used_ratio": u.used_bytes / u.capacity_bytes,
               "fcall_mean_us": t.per_call(), "server_us_per_put": t.usec / total, "put_max_us": longest}
        out(f"4x over capacity: segment {seg_bytes / 2**20:,.0f} MiB, {total:,} puts of {PUT_OBJ // 1024} KiB "
            f"(put_start+put_end, no reads): {res['failures']} failures{' ' + str(failures) if failures else ''}, "
            f"{_fmt(res['puts_per_s'])} puts/s ({secs:.1f} s), {evicted:,} evicted on put, "
            f"{u.objects:,} objects left, used {res['used_ratio']:.2%}; server mean {t.per_call():,.0f} us/call, "
            f"{res['server_us_per_put']:,.0f} us/put (put_start + put_end); SLOWLOG: {text}")
        return res
    finally:
        m.close()


# ---- main ----------------------------------------------------------------------------------------

def main(url: str | None = None, sizes=(10_000, 100_000, 1_000_000), out=print,
         put_bytes: int = 256 * 2**20, radix_depth: int = 0) -> dict:
    sizes = tuple(int(s) for s in sizes)
    if not sizes or min(sizes) < 1000:
        raise ValueError("sizes must be >= 1000 objects")
    with url_or_private_valkey(url) as (url, server):
        r = redis.Redis.from_url(url)
        try:
            info = r.info("server")
            version = info.get("valkey_version") or info.get("redis_version")
            out(f"bench.evict  {datetime.datetime.now().isoformat(timespec='seconds')}  "
                f"{'embedded valkey-server (appendonly no)' if server else url} {version}  "
                f"CPU {cpu_model()} x{os.cpu_count()}  load avg {os.getloadavg()[0]:.2f}  "
                f"python {platform.python_version()}")
            out(f"objects {OBJ} B, 1 replica, shards=1, batches of {BATCH}; fill to {FILL_RATIO:.1%} of capacity; "
                f"steps of max_units={STEP_UNITS}, median of {STEPS}; run_eviction from {OVERSHOOT:.0%}"
                + (f"; radix index on, chains of depth {radix_depth}" if radix_depth else ""))
            results: dict[str, Any] = {"sizes": {}, "radix_depth": radix_depth}
            for n in sizes:
                results["sizes"][n] = _bench_size(url, r, server is not None, n, out, radix_depth)
            base_n = 10_000 if 10_000 in results["sizes"] else sizes[0]
            base = results["sizes"][base_n]
            for label, field in (
                    (f"step cost ({STEP_UNITS} units, server median, refilled between steps)", "step_server_us"),
                    (f"step cost ({STEP_UNITS} units, server mean inside run_eviction)", "run_step_mean_us"),
                    (f"step cost ({SMALL_UNITS} units, server median)", "small_step_server_us")):
                parts = []
                for n, res in results["sizes"].items():
                    res[field + "_ratio"] = res[field] / base[field]
                    parts.append(f"{n:,} {res[field]:,.0f} us ({res[field + '_ratio']:.2f}x)")
                out(f"{label} vs {base_n:,}: " + ", ".join(parts))
            biggest = max(results["sizes"])
            big = results["sizes"][biggest]
            big["step_ratio"] = max(big["step_server_us_ratio"], big["run_step_mean_us_ratio"])
            ratio_ok = big["step_ratio"] <= 2.0
            call_ok = big["max_evict_call_us"] <= 1000
            small_ok = big["max_small_step_us"] <= 1000
            out(f"targets at {biggest:,}: step within 2x of {base_n:,}: {'met' if ratio_ok else 'MISSED'} "
                f"(worst {big['step_ratio']:.2f}x); no mc_evict call over 1 ms with max_units={STEP_UNITS}: "
                f"{'met' if call_ok else 'MISSED'} (longest {big['max_evict_call_us']:,} us server, "
                f"{big['step_client_max_us']:,.0f} us client), with max_units={SMALL_UNITS}: "
                f"{'met' if small_ok else 'MISSED'} (longest {big['max_small_step_us']:,} us server); "
                f"longest = the measured steps' commandstats maximum, or a SLOWLOG entry (calls over "
                f"{SLOW_US:,} us) of the steps and run_eviction if longer")
            results["put_over_capacity"] = _bench_put_over(url, r, server is not None, put_bytes, out)
            return results
        finally:
            if server is None:
                _fresh(r, False)
            r.close()


def _cli(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m mooncake_redis.bench.evict", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="10000,100000,1000000",
                   help="comma-separated store sizes in objects (default 10000,100000,1000000)")
    p.add_argument("--redis", default=None,
                   help="redis://... URL of a running server (uses namespace 'bevict', deletes bevict:* "
                        "before each size and after; changes slowlog settings and restores them); "
                        "default: start a private valkey-server")
    p.add_argument("--put-mib", type=int, default=256,
                   help="segment size in MiB of the 4x-over-capacity put test (default 256)")
    p.add_argument("--radix-depth", type=int, default=0,
                   help="radix index on, keys in chains of this depth (default 0: index off)")
    a = p.parse_args(argv)
    main(url=a.redis, sizes=[int(s.replace("_", "")) for s in a.sizes.split(",") if s], put_bytes=a.put_mib * 2**20,
         radix_depth=a.radix_depth)


if __name__ == "__main__":
    _cli(sys.argv[1:])
