"""The read path's figures beside `bench instructions`: server instructions per call of the four
reads with the radix index off or on, and memory per complete object.

* instructions (`--radix` for the index on): a private valkey-server under callgrind
  (bench/instructions.py's CallgrindValkey), 2,000 objects of 64 KiB with one replica on one
  shard; with the index, each key is `<hash64>_0` of its own node, nodes registered in chains of
  8 (`--keys-per-node K`: keys `<hash64>_0` to `_<K-1>` of each node, as a page's k and v or
  tensor-parallel ranks are, 2,000 keys in all, a node's keys next to each other). Per figure,
  n calls of exist_key and get_replica_list (keys spread over the store), and n/8
  calls of their batches of 100 keys; instructions per call (per key for the batches), minus an
  empty window's, and the redis.calls made.
* memory (`--memory`, with `--radix` the index on, keys as above): a private valkey-server (no
  valgrind), N complete objects of one replica put in batches of 500, used_memory after minus
  before, divided by N, and `MEMORY USAGE` per object of each family of keys (`obj`, `rnode`,
  `rkids`, ..., and a shard's one-key structures by name: its tiers, `routbox`).

    python -m mooncake_redis.bench.reads [--n 400] [--radix [--keys-per-node 1]]
        [--memory [--objects 50000] [--key-format F]]
"""
from __future__ import annotations

import argparse
import contextlib
import tempfile
from typing import Any, Callable

import redis

from mooncake_redis import Master, MasterConfig
from mooncake_redis.server import EmbeddedValkey

from . import instructions as bi

STORE = 2000
BATCH = 100
CHAIN = 8


KEY_FORMAT = "{hash}_{i}"


def _radix_nodes(m: Master, nodes: int, per_node: int, key_format: str = KEY_FORMAT) -> list[str]:
    """Register `nodes` radix nodes in chains of CHAIN; their keys `key_format` with the node's
    64-hex hash and i from 0 to per_node - 1 (`<hash64>_0`, ... by default)."""
    hashes = [f"{i + 1:064x}" for i in range(nodes)]
    pairs: list[tuple[Any, Any]] = [(h, f"{int(h, 16) - 1:064x}" if int(h, 16) % CHAIN != 1 else None)
                                    for h in hashes]
    for i in range(0, len(pairs), 500):
        if any(c != 0 for c in m.batch_register_radix_nodes(pairs[i:i + 500])):
            raise RuntimeError("batch_register_radix_nodes failed")
    return [key_format.format(hash=h, i=j) for h in hashes for j in range(per_node)]


def _store(m: Master, radix: bool, per_node: int = 1) -> list[str]:
    m.mount_segment(bi.SEGMENT, bi.SEGMENT_SIZE, bi.CLIENT)
    keys = _radix_nodes(m, STORE // per_node, per_node) if radix else [f"obj-{i:06d}" for i in range(STORE)]
    bi.put_complete(m, keys, chunk=500)
    return keys


def instructions(n: int = 400, radix: bool = False, out: Callable[[str], None] = print,
                 keys_per_node: int = 1) -> dict[str, dict]:
    """Instructions per call (per key for the batches) and redis.calls of the four reads."""
    if not 1 <= keys_per_node <= BATCH:
        raise ValueError(f"keys_per_node must be in [1, {BATCH}]")
    with contextlib.ExitStack() as stack:
        config = MasterConfig(namespace=bi.NAMESPACE, shards=1, enable_radix_tree=radix)
        server, r, m = bi.callgrind_master(stack, config, "reads")
        keys = _store(m, radix, keys_per_node if radix else 1)
        store = len(keys)
        r.function_load(bi.LIBRARY, replace=True)  # mcb_gc, which every window calls
        server.calibrate(r)

        def key_at(j: int) -> str:
            return keys[(j * 7919) % store]

        def window_of(j: int) -> list[str]:
            s = (j * BATCH) % (store - BATCH + 1)
            return keys[s:s + BATCH]

        batches = max(1, n // 8)
        reads: dict[str, tuple[Callable[[], object], int, Callable[[], object]]] = {
            "exist_key": (lambda: [m.exist_key(key_at(j)) for j in range(n)], n, lambda: m.exist_key(key_at(0))),
            "get_replica_list": (lambda: [m.get_replica_list(key_at(j)) for j in range(n)], n,
                                 lambda: m.get_replica_list(key_at(0))),
            "batch_exist_key": (lambda: [m.batch_exist_key(window_of(j)) for j in range(batches)], batches * BATCH,
                                lambda: m.batch_exist_key(window_of(0))),
            "batch_get_replica_list": (lambda: [m.batch_get_replica_list(window_of(j)) for j in range(batches)],
                                       batches * BATCH, lambda: m.batch_get_replica_list(window_of(0))),
        }
        per = f", {keys_per_node} keys a node" if radix and keys_per_node > 1 else ""
        out(f"reads, radix index {'on' if radix else 'off'}{per}: n={n} calls, batches {batches} calls of {BATCH} keys "
            f"over {store} objects (instructions per call, per key for the batches)")
        got: dict[str, dict] = {}
        for name, (run, units, warm) in reads.items():
            for _ in range(bi.WARMUP):
                warm()
            w = server.window(r, run)
            got[name] = {"instructions": w.instructions / units, "redis_calls": sum(w.commands.values()) / units,
                         "commands": {c: v / units for c, v in sorted(w.commands.items())}}
            out(f"  {name:<26}{w.instructions / units:>12,.0f}   redis.calls {got[name]['redis_calls']:.2f}")
        return got


def _family(key: bytes) -> str:
    """The key schema's name for a key of a shard `<ns>:{<ns>:<shard>}<suffix>` (`obj`, `rnode`,
    `rkeys`, `evict`, ...; `shard` for the shard's hash itself, `other` for any other key)."""
    if b"}" not in key:
        return "other"
    rest = key.split(b"}", 1)[1].lstrip(b":")
    return rest.split(b":", 1)[0].decode(errors="replace") if rest else "shard"


def memory(objects: int = 50_000, out: Callable[[str], None] = print, radix: bool = False,
           keys_per_node: int = 1, key_format: str | None = None) -> dict[str, Any]:
    """used_memory per complete object of one replica (shards=1), and MEMORY USAGE per object of
    each family of keys. With `radix`, the keys of radix nodes in chains of CHAIN, as
    `instructions` puts them. `key_format`: the keys' shape from {hash} and {i} (e.g. SGLang's
    tagged "sglang_Qwen-Qwen3-8B_{hash}_{i}_k"; the key pattern must find the hash in it), for
    the index off too (the hashes of nodes 1, 2, ..., i = 0); default `<hash64>_<i>` with the
    index and `obj-<n>` without."""
    with contextlib.ExitStack() as stack:
        server = EmbeddedValkey(data_dir=stack.enter_context(tempfile.TemporaryDirectory(prefix="mooncake-mem-")))
        server.start()
        stack.callback(server.stop)
        m = Master.connect(server.url, MasterConfig(namespace=bi.NAMESPACE, shards=1, enable_radix_tree=radix))
        stack.callback(m.close)
        r = redis.Redis.from_url(server.url)
        stack.callback(r.close)
        m.mount_segment(bi.SEGMENT, bi.SEGMENT_SIZE, bi.CLIENT)
        m.batch_put_start(bi.CLIENT, ["warm-0"], [bi.OBJECT_SIZE])  # every per-shard structure exists first
        m.batch_put_end(bi.CLIENT, ["warm-0"])
        usage_before = _usage(r)
        before = int(r.info("memory")["used_memory"])
        if radix:
            keys = _radix_nodes(m, objects // keys_per_node, keys_per_node, key_format or KEY_FORMAT)
        elif key_format:
            keys = [key_format.format(hash=f"{i + 1:064x}", i=0) for i in range(objects)]
        else:
            keys = [f"obj-{i:06d}" for i in range(objects)]
        bi.put_complete(m, keys, chunk=500)
        per = (int(r.info("memory")["used_memory"]) - before) / len(keys)
        what = f"radix index on, {keys_per_node} key(s) a node, chains of {CHAIN}" if radix else "radix index off"
        if key_format:
            what += f", keys {key_format}"
        out(f"memory per complete object ({len(keys):,} objects of one replica, shards=1, {what}; "
            f"used_memory delta): {per:.1f} B")
        families = {f: (b - usage_before.get(f, 0)) / len(keys) for f, b in _usage(r).items()}
        out("  MEMORY USAGE per object, by key family: " + ", ".join(
            f"{f} {b:.1f}" for f, b in sorted(families.items(), key=lambda fb: -fb[1]) if abs(b) >= 0.5))
        return {"per_object": per, "families": families}


def _usage(r: redis.Redis) -> dict[str, int]:
    """MEMORY USAGE (SAMPLES 0: every element) summed per key family."""
    names = list(r.scan_iter(count=1000))
    got: dict[str, int] = {}
    for i in range(0, len(names), 1000):
        pipe = r.pipeline(transaction=False)
        for k in names[i:i + 1000]:
            pipe.memory_usage(k, samples=0)
        for k, b in zip(names[i:i + 1000], pipe.execute()):
            got[_family(k)] = got.get(_family(k), 0) + (b or 0)
    return got


def _cli() -> None:
    p = argparse.ArgumentParser(prog="python -m mooncake_redis.bench.reads", description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=400, help="calls per figure (default 400)")
    p.add_argument("--radix", action="store_true", help="the radix index on")
    p.add_argument("--keys-per-node", type=int, default=1, help="with --radix: keys of each node (default 1)")
    p.add_argument("--memory", action="store_true", help="memory per object instead (no valgrind)")
    p.add_argument("--objects", type=int, default=50_000, help="objects for --memory (default 50,000)")
    p.add_argument("--key-format", default=None,
                   help="with --memory: the keys' shape, from {hash} (64 hex) and {i} (default: {hash}_{i} with "
                        "--radix, obj-<n> without)")
    a = p.parse_args()
    if a.memory:
        memory(a.objects, radix=a.radix, keys_per_node=a.keys_per_node, key_format=a.key_format)
    else:
        instructions(a.n, a.radix, keys_per_node=a.keys_per_node)


if __name__ == "__main__":
    _cli()
