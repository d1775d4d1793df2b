"""The write path's figures beside `bench instructions`: server instructions per call of
put_start, put_end and remove, and per unit evicted, with the radix index off or on.

A private valkey-server under callgrind (bench/instructions.py's CallgrindValkey), one segment
of n objects on one shard, objects of 64 KiB with one replica, the high watermark at 50% and
the target at 25%. Per round, n keys are put (put_start, then put_end) and removed (last put
first), one call per key; with the index each key is `<hash64>_0` of its own node, a chain of 8
pages (each page's parent is the page before it, the first a root), so a put registers its node
under its parent. Then n keys are put again, filling the segment, and eviction steps
(mc_evict, 64 units a step) take the store to its target: with the index, each chain from its
leaf up. The same puts and removes in calls of 32 keys (batch_put_start with each key's parent,
batch_put_end, batch_remove) give the batch figures, per key. A warm-up round runs untimed; a
figure is the instructions per call (per key of a batch, per unit evicted) of the timed round,
minus an empty window's, and the redis.calls made.

    python -m mooncake_redis.bench.writes [--n 400] [--radix]
"""
from __future__ import annotations

import argparse
import contextlib
from typing import Callable

from mooncake_redis import MasterConfig, ReplicateConfig

from . import instructions as bi

CHAIN = 8
BATCH = 32  # keys per batched call (CHUNK_OF's for put_start and remove: one FCALL each)


def _pages(tag: str, n: int, radix: bool) -> list[tuple[str, ReplicateConfig | None]]:
    """n keys and the config each is put with (its parent's hash with the index on)."""
    if not radix:
        return [(f"{tag}-{i:06d}", None) for i in range(n)]
    out: list[tuple[str, ReplicateConfig | None]] = []
    for i in range(n):
        h = f"{tag}{i:0{64 - len(tag)}x}"
        parent = None if i % CHAIN == 0 else out[-1][0][:-2]
        out.append((h + "_0", ReplicateConfig(parent_block_hash=parent) if parent else None))
    return out


def instructions(n: int = 400, radix: bool = False, out: Callable[[str], None] = print) -> dict[str, dict]:
    """Instructions per call (per key of a batch) and redis.calls of put_start, put_end and remove,
    one key a call and in batches, and per unit evicted."""
    with contextlib.ExitStack() as stack:
        config = MasterConfig(namespace=bi.NAMESPACE, shards=1, enable_radix_tree=radix,
                              eviction_high_watermark_ratio=0.5, eviction_ratio=0.25)
        server, r, m = bi.callgrind_master(stack, config, "writes")
        m.mount_segment(bi.SEGMENT, max(n, CHAIN) * bi.OBJECT_SIZE, bi.CLIENT)
        r.function_load(bi.LIBRARY, replace=True)  # mcb_gc, which every window calls
        server.calibrate(r)

        def steps(pages: list[tuple[str, ReplicateConfig | None]]) -> dict[str, Callable[[], None]]:
            # (a refused call raises MasterError: the figure is never of failed calls)
            def put_starts() -> None:
                for k, c in pages:
                    m.put_start(bi.CLIENT, k, bi.OBJECT_SIZE, c)

            def put_ends() -> None:
                for k, _ in pages:
                    m.put_end(bi.CLIENT, k)

            def removes() -> None:
                for k, _ in reversed(pages):
                    m.remove(k)
            return {"put_start": put_starts, "put_end": put_ends, "remove": removes}

        def batches(pages: list[tuple[str, ReplicateConfig | None]]) -> dict[str, Callable[[], None]]:
            # the same writes in calls of BATCH keys (a chain's links within one call)
            keys = [k for k, _ in pages]
            parents = [c.parent_block_hash if c else None for _, c in pages] if radix else None
            parts = [(keys[i:i + BATCH], parents[i:i + BATCH] if parents else None) for i in range(0, len(keys), BATCH)]

            def put_starts() -> None:
                for part, ps in parts:
                    got = m.batch_put_start(bi.CLIENT, part, [bi.OBJECT_SIZE] * len(part), None, "default", ps)
                    if any(not isinstance(x, list) for x in got):
                        raise RuntimeError(f"batch_put_start refused a key: {got}")

            def put_ends() -> None:
                for part, _ in parts:
                    if any(c != 0 for c in m.batch_put_end(bi.CLIENT, part)):
                        raise RuntimeError("batch_put_end refused a key")

            def removes() -> None:
                for part, _ in reversed(parts):
                    if any(c != 0 for c in m.batch_remove(part[::-1])):
                        raise RuntimeError("batch_remove refused a key")
            return {"batch put_start": put_starts, "batch put_end": put_ends, "batch remove": removes}

        for run in [*steps(_pages("a", max(CHAIN, bi.WARMUP), radix)).values(),
                    *batches(_pages("e", max(CHAIN, bi.WARMUP), radix)).values()]:
            run()
        out(f"writes, radix index {'on' if radix else 'off'}: n={n} keys"
            f"{f' in chains of {CHAIN}' if radix else ''} (instructions per call)")
        got: dict[str, dict] = {}

        def figure(name: str, w: bi.Window, units: int) -> None:
            got[name] = {"instructions": w.instructions / units, "redis_calls": sum(w.commands.values()) / units,
                         "commands": {c: v / units for c, v in sorted(w.commands.items())}}
            out(f"  {name:<16}{w.instructions / units:>12,.0f}   redis.calls {got[name]['redis_calls']:.2f}")

        for name, run in steps(_pages("b", n, radix)).items():
            figure(name, server.window(r, run), n)
        for name, run in batches(_pages("d", n, radix)).items():
            figure(name, server.window(r, run), n)
        fill = steps(_pages("c", n, radix))
        fill["put_start"]()
        fill["put_end"]()
        evicted = [0]

        def evict() -> None:
            while (step := m.evict_step(0, 64)).state == "more":
                evicted[0] += step.units
            evicted[0] += step.units
        w = server.window(r, evict)
        if evicted[0] == 0:
            raise RuntimeError("eviction freed nothing")
        figure("evict", w, evicted[0])
        return got


def _cli() -> None:
    p = argparse.ArgumentParser(prog="python -m mooncake_redis.bench.writes", description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=400, help="keys per figure (default 400)")
    p.add_argument("--radix", action="store_true", help="the radix index on")
    a = p.parse_args()
    instructions(a.n, a.radix)


if __name__ == "__main__":
    _cli()
