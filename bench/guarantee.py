"""Explicit-caching figures for `bench ops` (bench/ops.py runs them after its own):

* put_start + put_end with a guarantee beside plain ones, and get_replica_list with
  guaranteed_ttl_ms (renewing an active guarantee) beside plain reads of plain objects, in the
  same repeats, alternating which goes first (target: within 1.15x of plain);
* expire_guaranteed of one prefix of 64 keys in stores of 10k and 1M guaranteed objects (target:
  the 1M figure within 1.5x of the 10k one): wall time per call and the server's (INFO
  commandstats of FCALL).

Each store is its own namespace "bench.g<...>" on the same server (bench/ops.py deletes every
bench.* key before and after a run)."""
from __future__ import annotations

import statistics
import time
from typing import Any

import redis

from mooncake_redis import Master, MasterConfig, ReplicateConfig

TTL = 3_600_000
OBJ = 64                  # bytes per object: the store is never full
PREFIX_KEYS = 64          # keys per prefix hash
CHUNK = 128               # keys per batch_put_start / batch_put_end
EXPIRE_CALLS = 50         # expire_guaranteed calls timed per store (a fresh prefix each)
CONFIG: dict[str, Any] = dict(guaranteed_capacity_ratio=1.0)


def _fcall_usec(r: redis.Redis) -> tuple[int, int]:
    stats = r.info("commandstats").get("cmdstat_fcall", {})
    return int(stats.get("calls", 0)), int(stats.get("usec", 0))


def _prefix(i: int) -> str:
    return f"{i:064x}"  # a 64-hex prefix hash: its keys "<prefix>_<n>" route and index together


def _put_pairs(m: Master, keys: list[str], config: ReplicateConfig | None) -> float:
    ps, pe = m.put_start, m.put_end
    t0 = time.perf_counter()
    for key in keys:
        ps("bench", key, OBJ, config)
        pe("bench", key)
    return len(keys) / (time.perf_counter() - t0)


def _reads(m: Master, keys: list[str], ttl: int) -> float:
    g = m.get_replica_list
    t0 = time.perf_counter()
    for key in keys:
        g(key, guaranteed_ttl_ms=ttl)
    return len(keys) / (time.perf_counter() - t0)


def _fill(m: Master, objects: int, out) -> None:
    """`objects` guaranteed objects, PREFIX_KEYS per prefix hash."""
    keys = [f"{_prefix(i // PREFIX_KEYS)}_{i % PREFIX_KEYS}" for i in range(objects)]
    g = ReplicateConfig(guaranteed_ttl_ms=TTL)
    t0 = time.perf_counter()
    for i in range(0, objects, CHUNK):
        chunk = keys[i:i + CHUNK]
        bad = [x for x in m.batch_put_start("bench", chunk, [OBJ] * len(chunk), g) if not isinstance(x, list)]
        if bad:
            raise RuntimeError(f"guaranteed batch_put_start failed: {bad[0]!r}")
        m.batch_put_end("bench", chunk)
    out(f"  (filled {objects:,} guaranteed objects in {time.perf_counter() - t0:.0f} s)")


def _expire_cost(m: Master, r: redis.Redis, objects: int) -> tuple[float, float]:
    """Median wall us per expire_guaranteed call of one 64-key prefix, and server us per FCALL."""
    prefixes = objects // PREFIX_KEYS
    calls = min(EXPIRE_CALLS, prefixes)
    walls = []
    c0, u0 = _fcall_usec(r)
    for j in range(calls):
        p = _prefix(j * prefixes // calls)  # distinct prefixes spread over the store
        t0 = time.perf_counter()
        ended = m.expire_guaranteed([p])
        walls.append((time.perf_counter() - t0) * 1e6)
        assert ended == [PREFIX_KEYS], ended
    c1, u1 = _fcall_usec(r)
    return statistics.median(walls), (u1 - u0) / max(c1 - c0, 1)


def figures(url: str, r: redis.Redis, n: int, repeats: int, out,
            sizes: tuple[int, ...] = (10_000, 1_000_000)) -> dict:
    res: dict = {}
    # ---- put and read, guaranteed beside plain ----
    m = Master.connect(url, MasterConfig(namespace="bench.gops", **CONFIG))
    try:
        m.mount_segment("seg", 1 << 40, "bench")
        rates: dict[str, list[float]] = {"put": [], "put_guaranteed": [], "get": [], "get_guaranteed": []}
        g = ReplicateConfig(guaranteed_ttl_ms=TTL)
        for rep in range(repeats):
            plain = [f"p{rep}-{i}" for i in range(n)]
            guaranteed = [f"{_prefix(rep * n + i)}_g" for i in range(n)]
            puts = [("put", plain, None), ("put_guaranteed", guaranteed, g)]
            for name, keys, config in (puts if rep % 2 == 0 else puts[::-1]):
                rates[name].append(_put_pairs(m, keys, config))
            gets = [("get", plain, 0), ("get_guaranteed", guaranteed, TTL + 1000 * (rep + 1))]
            for name, keys, ttl in (gets if rep % 2 == 0 else gets[::-1]):
                rates[name].append(_reads(m, keys, ttl))
    finally:
        m.close()
    for name, values in rates.items():
        res[f"{name}_ops_per_s"] = statistics.median(values)
    res["put_guaranteed_slowdown"] = res["put_ops_per_s"] / res["put_guaranteed_ops_per_s"]
    res["get_guaranteed_slowdown"] = res["get_ops_per_s"] / res["get_guaranteed_ops_per_s"]
    out(f"{'put pair, guaranteed':<26}{res['put_guaranteed_ops_per_s']:>8,.0f} pairs/s   plain "
        f"{res['put_ops_per_s']:,.0f}: {res['put_guaranteed_slowdown']:.2f}x the time (target within 1.15)")
    out(f"{'get, renewing guarantee':<26}{res['get_guaranteed_ops_per_s']:>8,.0f} ops/s     plain "
        f"{res['get_ops_per_s']:,.0f}: {res['get_guaranteed_slowdown']:.2f}x the time (target within 1.15)")
    # ---- expire_guaranteed of a 64-key prefix, by store size ----
    for objects in sizes:
        m = Master.connect(url, MasterConfig(namespace=f"bench.gexp{objects}", **CONFIG))
        try:
            m.mount_segment("seg", 1 << 40, "bench")
            _fill(m, objects, out)
            wall, srv = _expire_cost(m, r, objects)
        finally:
            m.close()
        res[f"expire_guaranteed_{objects}_us"], res[f"expire_guaranteed_{objects}_server_us"] = wall, srv
        out(f"{'expire_guaranteed x64':<22} {wall:>8,.1f} us/call   server {srv:.1f} us/FCALL   "
            f"in a store of {objects:,} guaranteed objects "
            f"(median of {min(EXPIRE_CALLS, objects // PREFIX_KEYS)} calls)")
    if len(sizes) >= 2:
        lo, hi = sizes[0], sizes[-1]
        res["expire_guaranteed_size_ratio"] = res[f"expire_guaranteed_{hi}_us"] / res[f"expire_guaranteed_{lo}_us"]
        res["expire_guaranteed_size_server_ratio"] = (res[f"expire_guaranteed_{hi}_server_us"]
                                                     / res[f"expire_guaranteed_{lo}_server_us"])
        out(f"{'':<22}  {hi:,} vs {lo:,} objects: {res['expire_guaranteed_size_ratio']:.2f} "
            f"(server {res['expire_guaranteed_size_server_ratio']:.2f}; target within 1.5)")
    return res
