"""Capacity benchmark: the block hit rate a store of a given size reaches on a replayed trace,
next to an ideal LRU of the same size replayed in the same run. See docs/bench.md.

The trace is Mooncake's JSONL format: one request a line with `timestamp` (ms from the trace's
start) and `hash_ids`, the request's chain of prefix blocks (block i's parent is block i-1).
Each request, as an inference engine would issue it:

  1. look up all its blocks in order with one batch_exist_key; the hits are the leading run of
     blocks found (a prefix match: a block past the first miss is of no use). exist_key leases
     what it finds, as a read does;
  2. write the blocks the lookup did not find, batch_put_start + batch_put_end (a block found
     past the first miss is not written again: its put would be refused, and the lookup's lease
     has already refreshed it).

The store runs on a private Valkey (no AOF): one segment of capacity x block bytes, shards 1,
the default MasterConfig, its clock frozen and moved to each request's timestamp (never slept).
The client pings once a second of trace time, as a live client does. Two runs on fresh stores:
with no worker (only evict-on-put makes room), and with Worker.run_once after every request
(the background loop: eviction from the high watermark down to the target).

The ideal LRU holds the same number of blocks and uses the same lookup rule; every block of a
request ends most recent (the hit run as read, the rest as written or, when found past the first
miss, refreshed as the store's lease refreshes it), and the least recent goes when it is full.

    python -m mooncake_redis.bench.capacity [--trace PATH] [--limit-requests K]
        [--capacity-blocks 5859] [--block-bytes 65536]
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import platform
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TextIO

import redis

from .common import cpu_model
from mooncake_redis import ErrorCode, Master, MasterConfig
from mooncake_redis.worker import Worker

# the repository's ../shared/traces (a source checkout only; otherwise --trace is required)
DEFAULT_TRACE = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "conversation_trace.jsonl"
BLOCK_BYTES = 64 * 1024
CAPACITY_BLOCKS = 5859
NAMESPACE = "bcap"
CLIENT = "bench-capacity"
SEGMENT = "bench-seg"
T0 = 1_700_000_000_000   # store clock at the trace's timestamp 0
PING_EVERY_MS = 1000      # trace time between the client's pings (client_ttl is 10 s)


@dataclass(frozen=True)
class Request:
    timestamp: int         # ms from the trace's start
    blocks: tuple[int, ...]


def load_trace(path: str | os.PathLike, limit: int | None = None) -> list[Request]:
    """The first `limit` requests (all when None) of a Mooncake-format JSONL trace. Raises
    ValueError naming the line of a malformed one; timestamps must not go back."""
    out: list[Request] = []
    last = 0
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if limit is not None and len(out) >= limit:
                break
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                ts, ids = row["timestamp"], row["hash_ids"]
            except (ValueError, TypeError, KeyError) as exc:
                raise ValueError(f"{path}:{lineno}: not a trace request ({exc})") from None
            if isinstance(ts, bool) or not isinstance(ts, int) or ts < last:
                raise ValueError(f"{path}:{lineno}: timestamp must be an integer >= the one before, not {ts!r}")
            if not isinstance(ids, list) or not all(isinstance(b, int) and not isinstance(b, bool) for b in ids):
                raise ValueError(f"{path}:{lineno}: hash_ids must be a list of integers")
            last = ts
            out.append(Request(ts, tuple(ids)))
    if not out:
        raise ValueError(f"{path}: no requests")
    return out


def leading_run(found: list[bool]) -> int:
    """Blocks of the prefix match: how many lead the request before the first miss."""
    n = 0
    for hit in found:
        if not hit:
            break
        n += 1
    return n


def ideal_lru(requests: list[Request], capacity: int) -> int:
    """Block hits of an ideal LRU cache of `capacity` blocks over the requests (see the module doc)."""
    cache: collections.OrderedDict[int, None] = collections.OrderedDict()
    hits = 0
    for req in requests:
        hits += leading_run([b in cache for b in req.blocks])
        for b in req.blocks:
            if b in cache:
                cache.move_to_end(b)
            else:
                cache[b] = None
                if len(cache) > capacity:
                    cache.popitem(last=False)
    return hits


@dataclass
class StoreRun:
    hits: int = 0
    blocks: int = 0
    written: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # ErrorCode name -> puts (start or end) refused
    seconds: float = 0.0
    objects_left: int = 0
    used_ratio: float = 0.0
    worker_evicted: int = 0  # objects the worker evicted (0 without a worker)


class Progress:
    """Progress on stderr once a run has taken a second: a line rewritten twice a second on a
    terminal, else a line every 10 s."""

    def __init__(self, label: str, total: int, stream: TextIO | None):
        self.label, self.total, self.stream = label, total, stream
        self.tty = stream is not None and stream.isatty()
        self.t0 = self.shown = time.monotonic()
        self.printed = False

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if self.stream is None or now - self.t0 < 1.0 or now - self.shown < (0.5 if self.tty else 10.0):
            return
        self.shown, self.printed = now, True
        line = f"  {self.label}: {done:,}/{self.total:,} requests"
        self.stream.write("\r" + line if self.tty else line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.printed and self.tty:
            self.stream.write(f"\r  {self.label}: {self.total:,}/{self.total:,} requests\n")
            self.stream.flush()


def replay_store(url: str, requests: list[Request], capacity_blocks: int, block_bytes: int,
                 with_worker: bool, progress: Callable[[int], None] = lambda done: None) -> StoreRun:
    """Replay the requests through a fresh store (FLUSHALL first) on the server at `url`."""
    r = redis.Redis.from_url(url)
    try:
        r.flushall()
    finally:
        r.close()
    m = Master.connect(url, MasterConfig(namespace=NAMESPACE, shards=1))
    res = StoreRun()
    try:
        clock = T0 + requests[0].timestamp
        m.freeze_clock(clock)
        m.mount_segment(SEGMENT, capacity_blocks * block_bytes, CLIENT)
        worker = Worker(m) if with_worker else None
        pinged = clock
        t0 = time.perf_counter()
        for i, req in enumerate(requests):
            now = T0 + req.timestamp
            if now != clock:
                m.freeze_clock(now)
                clock = now
            if now - pinged >= PING_EVERY_MS:
                m.ping(CLIENT)
                pinged = now
            keys = [f"blk-{b}" for b in req.blocks]
            found = m.batch_exist_key(keys)
            res.hits += leading_run(found)
            res.blocks += len(keys)
            missing = [k for k, hit in zip(keys, found) if not hit]
            started = m.batch_put_start(CLIENT, missing, [block_bytes] * len(missing))
            ok = []
            for key, got in zip(missing, started):
                if isinstance(got, ErrorCode):
                    res.refused[got.name] = res.refused.get(got.name, 0) + 1
                else:
                    ok.append(key)
            for code in m.batch_put_end(CLIENT, ok):
                if code != ErrorCode.OK:
                    res.refused[code.name] = res.refused.get(code.name, 0) + 1
                else:
                    res.written += 1
            if worker is not None:
                res.worker_evicted += worker.run_once().evicted_objects
            progress(i + 1)
        res.seconds = time.perf_counter() - t0
        u = m.usage()
        res.objects_left, res.used_ratio = u.objects, u.used_bytes / max(u.capacity_bytes, 1)
    finally:
        m.close()
    return res


def _pct(hits: int, blocks: int) -> float:
    return 100.0 * hits / blocks if blocks else 0.0


def main(trace: str | os.PathLike | None = None, limit_requests: int | None = None,
         capacity_blocks: int = CAPACITY_BLOCKS, block_bytes: int = BLOCK_BYTES, out=print,
         progress: TextIO | None = sys.stderr) -> dict[str, Any]:
    """Run the benchmark; print its figures through `out` (progress on `progress`, None for
    none); return them. Raises ValueError for bad arguments or a malformed trace."""
    if trace is None:
        if not DEFAULT_TRACE.exists():
            raise ValueError(f"no trace: pass one (the default {DEFAULT_TRACE} does not exist)")
        trace = DEFAULT_TRACE
    if capacity_blocks < 1 or block_bytes < 1 or (limit_requests is not None and limit_requests < 1):
        raise ValueError("capacity_blocks, block_bytes and limit_requests must be >= 1")
    requests = load_trace(trace, limit_requests)
    blocks = sum(len(q.blocks) for q in requests)
    distinct = len({b for q in requests for b in q.blocks})
    res: dict[str, Any] = {"trace": str(trace), "requests": len(requests), "blocks": blocks,
                           "distinct_blocks": distinct, "capacity_blocks": capacity_blocks,
                           "block_bytes": block_bytes,
                           "trace_seconds": (requests[-1].timestamp - requests[0].timestamp) / 1000,
                           "infinite_cache_hit_rate": _pct(blocks - distinct, blocks)}
    from mooncake_redis.server import EmbeddedValkey

    server = EmbeddedValkey(appendonly=False).start()
    try:
        r = redis.Redis.from_url(server.url)
        version = r.info("server").get("valkey_version") or r.info("server").get("redis_version")
        r.close()
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        out(f"bench.capacity  {datetime.datetime.now().isoformat(timespec='seconds')}  "
            f"embedded valkey-server (appendonly no) {version}  CPU {cpu_model()} x{os.cpu_count()}  "
            f"load avg {load:.2f}  python {platform.python_version()}")
        out(f"trace    {trace}: {len(requests):,} requests, {blocks:,} block lookups, {distinct:,} distinct "
            f"blocks, {res['trace_seconds']:,.0f} s of trace time; an infinite cache would hit at most "
            f"{res['infinite_cache_hit_rate']:.2f}% (the repeated references)")
        out(f"store    {capacity_blocks:,} blocks of {block_bytes:,} B (one segment of "
            f"{capacity_blocks * block_bytes:,} B = {capacity_blocks * block_bytes / 2**20:,.1f} MiB), shards 1, default config (high watermark "
            f"{MasterConfig.eviction_high_watermark_ratio:.2f}, eviction to "
            f"{MasterConfig.eviction_high_watermark_ratio - MasterConfig.eviction_ratio:.2f}, "
            f"lease {MasterConfig.default_kv_lease_ttl} ms), store clock frozen at the trace's timestamps")

        t0 = time.perf_counter()
        lru_hits = ideal_lru(requests, capacity_blocks)
        res["lru"] = {"hits": lru_hits, "hit_rate": _pct(lru_hits, blocks), "seconds": time.perf_counter() - t0}
        out(f"{'ideal LRU':<34} hit rate {res['lru']['hit_rate']:6.2f}%  ({lru_hits:,} of {blocks:,} blocks)")

        for name, label, with_worker in (("evict_on_put", "store, no worker (evict-on-put)", False),
                                         ("worker", "store, Worker.run_once per request", True)):
            bar = Progress(label, len(requests), progress)
            try:
                run = replay_store(server.url, requests, capacity_blocks, block_bytes, with_worker, bar)
            finally:
                bar.close()
            rate = _pct(run.hits, run.blocks)
            fig = {"hits": run.hits, "hit_rate": rate, "lru_minus_store_points": res["lru"]["hit_rate"] - rate,
                   "written": run.written, "refused": dict(run.refused), "seconds": run.seconds,
                   "requests_per_s": len(requests) / run.seconds if run.seconds else None,
                   "objects_left": run.objects_left, "used_ratio": run.used_ratio,
                   "worker_evicted_objects": run.worker_evicted}
            res[name] = fig
            refused = ", ".join(f"{k} {v:,}" for k, v in sorted(run.refused.items())) or "none"
            out(f"{label:<34} hit rate {rate:6.2f}%  (LRU - store {fig['lru_minus_store_points']:+.2f} points)   "
                f"puts refused: {refused}   {fig['requests_per_s']:,.0f} requests/s ({run.seconds:.1f} s)   "
                f"{run.written:,} blocks written, {run.objects_left:,} left, used {run.used_ratio:.1%}"
                + (f", {run.worker_evicted:,} evicted by the worker" if with_worker else ""))
        return res
    finally:
        server.stop()
        shutil.rmtree(server.data_dir, ignore_errors=True)


def _cli(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m mooncake_redis.bench.capacity", description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", default=None,
                   help=f"Mooncake-format JSONL trace (default: {DEFAULT_TRACE}, when it exists)")
    p.add_argument("--limit-requests", type=int, default=None, help="replay only the first K requests")
    p.add_argument("--capacity-blocks", type=int, default=CAPACITY_BLOCKS,
                   help=f"store and LRU capacity in blocks (default {CAPACITY_BLOCKS})")
    p.add_argument("--block-bytes", type=int, default=BLOCK_BYTES, help=f"bytes per block (default {BLOCK_BYTES})")
    a = p.parse_args(argv)
    try:
        main(a.trace, a.limit_requests, a.capacity_blocks, a.block_bytes)
    except (ValueError, OSError) as exc:
        p.error(str(exc))


if __name__ == "__main__":
    _cli(sys.argv[1:])
