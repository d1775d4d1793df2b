"""Capacity benchmark: the block hit rate a store of a given size reaches on a replayed trace,
next to an ideal LRU of the same size replayed in the same run. See docs/bench.md.

The trace, the per-request lookup and write, the store (one segment of capacity x block bytes,
the default MasterConfig, its clock frozen at the trace's timestamps, a ping a second of trace
time) and the ideal LRU are bench/replay.py's, under its `lru` policy (plain leases); see that
module. This benchmark runs the store twice on a private Valkey (no AOF), shards 1: with no worker
(only evict-on-put makes room), and with Worker.run_once after every request (the background
loop: eviction from the high watermark down to the target). `mooncake-redis replay` compares
policies and capacities.

    python -m mooncake_redis.bench.capacity [--trace PATH] [--limit-requests K]
        [--capacity-blocks 5859] [--block-bytes 65536]
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, TextIO

import redis

from mooncake_redis import MasterConfig
from mooncake_redis.server import private_valkey

from . import replay
from .common import cpu_model
from .replay import DEFAULT_TRACE, Progress, Request, leading_run, load_trace  # noqa: F401  (this module's API)
from .replay_policies import Lru

BLOCK_BYTES = replay.BLOCK_BYTES
CAPACITY_BLOCKS = replay.CAPACITY_BLOCKS


def ideal_lru(requests: list[Request], capacity: int) -> int:
    """Block hits of an ideal LRU cache of `capacity` blocks over the requests (see the module doc)."""
    return replay.ideal_lru(requests, capacity).hits


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


def replay_store(url: str, requests: list[Request], capacity_blocks: int, block_bytes: int,
                 with_worker: bool, progress: Callable[[int], None] = lambda done: None) -> StoreRun:
    """Replay the requests through a fresh store on the server at `url` (plain leases: the
    replay's `lru` policy)."""
    st = replay.replay_store(url, requests, Lru(), capacity_blocks, block_bytes, worker=with_worker,
                             progress=progress)
    return StoreRun(st.hits, st.blocks, st.written, dict(st.puts_refused), st.seconds, st.objects_left,
                    st.used_ratio, st.worker_evicted)


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
    with private_valkey() as server:
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
            f"{capacity_blocks * block_bytes:,} B = {capacity_blocks * block_bytes / 2**20:,.1f} MiB), shards 1, "
            f"default config (high watermark "
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
