"""One Mooncake client process of `bench gateway`: set up against a master, print "ready",
wait for a line on stdin (so that several processes start together), time each operation over
n calls, print one JSON object {operation: calls (or keys) per second, "cpu_us": {operation: this
process's CPU time (all its threads, user + system) per call}}, and close only when stdin ends
(objects may live in any client's segment: none may go while another still runs).

    python -m mooncake_redis.bench.gateway_client MASTER N TAG
"""
from __future__ import annotations

import json
import sys
import time

from mooncake.store import MooncakeDistributedStore

OBJECT = b"g" * 1024  # 1 KiB
BATCH = 100


CPU_US: dict[str, float] = {}  # operation -> this process's CPU time per call


def timed(calls: int, fn, op: str, per: int = 1) -> float:
    started, cpu = time.perf_counter(), time.process_time()
    fn()
    CPU_US[op] = (time.process_time() - cpu) * 1e6 * per / calls
    return calls / (time.perf_counter() - started)


def main(master: str, n: int, tag: str) -> None:
    store = MooncakeDistributedStore()
    if store.setup("127.0.0.1", "P2PHANDSHAKE", 256 << 20, 16 << 20, "tcp", "", master) != 0:
        print(json.dumps({"error": f"setup against {master} failed"}), flush=True)
        sys.exit(1)
    keys = [f"{tag}-{i:07d}" for i in range(n)]
    windows = [keys[(w * BATCH) % max(1, n - BATCH):][:BATCH] for w in range(max(10, n // 20))]
    print("ready", flush=True)
    sys.stdin.readline()

    def check(what: str, bad: int) -> None:
        if bad:
            print(json.dumps({"error": f"{what}: {bad} of the calls failed"}), flush=True)
            sys.exit(1)

    rates = {
        "put": timed(n, lambda: check("put", sum(store.put(k, OBJECT) != 0 for k in keys)), "put"),
        "is_exist": timed(n, lambda: check("is_exist", sum(store.is_exist(k) != 1 for k in keys)), "is_exist"),
        "batch_is_exist": timed(len(windows) * BATCH, lambda: check(
            "batch_is_exist", sum(sum(x != 1 for x in store.batch_is_exist(w)) for w in windows)),
            "batch_is_exist", BATCH),
        "get": timed(n, lambda: check("get", sum(len(store.get(k)) != len(OBJECT) for k in keys)), "get"),
        "remove": timed(n, lambda: check("remove", sum(store.remove(k, True) != 0 for k in keys)), "remove"),
    }
    print(json.dumps({**rates, "cpu_us": CPU_US}), flush=True)
    sys.stdin.read()
    store.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
