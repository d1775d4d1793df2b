"""Cluster throughput benchmark: the same load from several client processes against one
Valkey server and against a local Redis Cluster of 3 primaries, measured in the same run.
See docs/cluster.md.

Each topology gets a new store (shards 16, one segment, `--keys` stored objects of 64 KiB); then
`--processes` client processes, each with its own Master, call `batch_get_replica_list` on
`--batch` random stored keys (one FCALL per shard the keys fall on; a read leases, so it
writes) for `--seconds`, after a common start signal. Printed: calls/s and keys/s per topology,
summed over the processes, and the ratio 3 nodes / 1 node; the server CPU time the primaries
used (INFO cpu deltas) per call and per key, the figure a capacity plan needs.

    python -m mooncake_redis.bench.cluster [--processes 4] [--seconds 5] [--keys 2000] [--batch 1]

Both topologies run the embedded valkey-server on loopback, without persistence, on this
machine: its cores are shared by the clients and every node.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import time
from typing import Any

from mooncake_redis import Master, MasterConfig
from mooncake_redis.cluster import primary_clients
from mooncake_redis.server import EmbeddedCluster, private_valkey

SHARDS = 16
OBJECT_SIZE = 1 << 16
SEGMENT = "bench-seg"
CLIENT = "bench-client"


def _client_loop(url: str, keys: int, batch: int, seconds: float, start, out) -> None:
    m = Master.connect(url)
    rnd = random.Random(os.getpid())
    names = [f"bench-{i}".encode() for i in range(keys)]
    start.wait()
    calls, deadline = 0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        m.batch_get_replica_list(rnd.sample(names, batch))
        calls += 1
    m.close()
    out.put(calls)


def _cpu_seconds(url: str) -> float:
    """used_cpu_sys + used_cpu_user summed over the primaries."""
    from mooncake_redis.master import client_from_url

    client = client_from_url(url)
    try:
        return sum(float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
                   for info in (c.info("cpu") for c in primary_clients(client)))
    finally:
        client.close()


def measure(url: str, processes: int, seconds: float, keys: int, batch: int = 1) -> dict:
    m = Master.connect(url, MasterConfig(namespace="mc", shards=SHARDS))
    try:
        m.mount_segment(SEGMENT, OBJECT_SIZE * keys * 2, CLIENT)
        names = [f"bench-{i}".encode() for i in range(keys)]
        for i in range(0, keys, 256):
            part = names[i:i + 256]
            m.batch_put_start(CLIENT, part, [OBJECT_SIZE] * len(part))
            m.batch_put_end(CLIENT, part)
    finally:
        m.close()
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_client_loop, args=(url, keys, batch, seconds, start, out)) for _ in range(processes)]
    for p in procs:
        p.start()
    time.sleep(1.0)  # let every process connect before the common start (not a deadline wait)
    cpu_before = _cpu_seconds(url)
    start.set()
    calls = sum(out.get(timeout=seconds + 60) for _ in procs)
    cpu = _cpu_seconds(url) - cpu_before
    for p in procs:
        p.join()
    return {"calls": calls, "calls_per_s": calls / seconds, "keys_per_s": calls * batch / seconds,
            "server_cpu_s": cpu, "server_us_per_call": cpu * 1e6 / calls if calls else None,
            "server_us_per_key": cpu * 1e6 / (calls * batch) if calls else None}


def main(processes: int = 4, seconds: float = 5.0, keys: int = 2000, batch: int = 1, out=print) -> dict:
    if not 1 <= batch <= keys:
        raise ValueError("batch must be between 1 and keys")
    res: dict[str, Any] = {"processes": processes, "seconds": seconds, "keys": keys, "batch": batch, "shards": SHARDS,
           "cores": os.cpu_count(), "load_average_at_start": os.getloadavg()[0]}
    with private_valkey() as server:
        res["one_node"] = measure(server.url, processes, seconds, keys, batch)
    with EmbeddedCluster(primaries=3) as cluster:
        res["three_nodes"] = measure(cluster.url, processes, seconds, keys, batch)
    res["ratio"] = res["three_nodes"]["calls_per_s"] / res["one_node"]["calls_per_s"]
    out(f"batch_get_replica_list of {batch} key(s) from {processes} client processes for {seconds:g} s each, "
        f"shards {SHARDS}, {keys} objects, {res['cores']} cores shared by clients and servers, "
        f"load average {res['load_average_at_start']:.2f} at start")
    for name, label in (("one_node", "1 node "), ("three_nodes", "3 nodes")):
        r = res[name]
        out(f"  {label}  {r['calls_per_s']:>9,.0f} calls/s {r['keys_per_s']:>9,.0f} keys/s   server CPU "
            f"{r['server_cpu_s']:.2f} s ({r['server_us_per_call']:.1f} us/call, {r['server_us_per_key']:.1f} us/key, "
            f"summed over the primaries)")
    out(f"  3 nodes / 1 node: {res['ratio']:.2f}")
    return res


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python -m mooncake_redis.bench.cluster",
                                description="calls/s against 1 Valkey node and a 3-primary cluster")
    p.add_argument("--processes", type=int, default=4)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--keys", type=int, default=2000)
    p.add_argument("--batch", type=int, default=1, help="keys per batch_get_replica_list call")
    a = p.parse_args()
    main(a.processes, a.seconds, a.keys, a.batch)
