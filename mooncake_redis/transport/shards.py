"""Shard routing: `Shards`, the one way the package reaches a store's shards.

`Shards` holds the Redis client, the namespace, the shard count and every shard's keys
(`ShardKeys`). Master, Worker, fsck and the CLI share one (`master.transport`). Everything it
sends goes through transport.send.run: the library is reloaded once on "Function not found", error
replies and lost replies become MasterError. Every command is addressed to one shard (a function
call carries its shard key, a SCAN or a pipeline names its shard), so on Redis Cluster
(transport.cluster) each reaches the node that serves its shard's slot, batches grouped
and pipelined per node. With `wait` (min_replicas_ack), writes are followed by WAIT.
"""
from __future__ import annotations

import re
from collections import defaultdict
from typing import Any, Callable, Iterable, Iterator, Sequence

import redis

from ..config import NAME_RE
from ..keys import ShardKeys, group_shard_of, shard_of
from ..steps import Steps, drive
from . import cluster, resp
from .send import run

# Keys per FCALL, by function: sized so one call stays well under a millisecond of server time
# (a put_start allocates, a read touches a few fields). Larger batches become several calls.
BATCH_CHUNK = 128
CHUNK_OF = {"mc_put_start": 32, "mc_upsert_start": 32, "mc_put_revoke": 32, "mc_remove": 32, "mc_sweep_replicas": 32,
            "mc_put_end": 64}
SCAN_COUNT = 1000  # keys per SCAN step


class Shards:
    def __init__(self, client: redis.Redis, namespace: str, count: int, wait: tuple[int, int] | None = None,
                 key_pattern: re.Pattern | None = None):
        self.redis = client
        self.namespace = namespace
        self.count = count
        self.key_pattern = key_pattern  # the store's radix_key_pattern (None: the default)
        self.keys = [ShardKeys(namespace, shard) for shard in range(count)]
        self.wait = wait  # (replicas, timeout ms) for WAIT after writes, or None

    def shard_of(self, key: bytes) -> int:
        """The shard of a user key (or a group id): see keys.shard_of."""
        return shard_of(key, self.count, self.key_pattern)

    def group_shard(self, group: bytes) -> int:
        """The shard of a group id: see keys.group_shard_of."""
        return group_shard_of(group, self.count, self.key_pattern)

    # ---- commands --------------------------------------------------------------------
    def run(self, commands: Sequence[Sequence[Any]], raise_on_error: bool = True) -> list[Any]:
        """Run commands (several: one pipeline, no MULTI); replies in order (send.run)."""
        return run(self.redis, commands, raise_on_error, self.wait)

    def command(self, fn: str, shard: int, *args: Any) -> tuple:
        """The call of function `fn` on `shard`, for run()."""
        return ("FCALL", fn, 1, self.keys[shard].P, *args)

    def call(self, fn: str, shard: int, *args: Any) -> Any:
        return self.run([self.command(fn, shard, *args)])[0]

    def each(self, fn: str, *args: Any, raise_on_error: bool = True) -> list[Any]:
        """`fn` with the same arguments on every shard, pipelined; one reply per shard."""
        return self.run([self.command(fn, shard, *args) for shard in range(self.count)], raise_on_error)

    def batch(self, fn: str, head: Sequence[Any], rows: Sequence[Sequence[Any]], keys: Sequence[bytes],
              chunk: int | None = None, route: Callable[[bytes], int] | None = None) -> list[Any]:
        """Run `fn` over rows (each one key's ARGV tail, after the common `head`) grouped by the
        shard of `keys[i]` (`route`, default shard_of), at most `chunk` rows per call (default:
        CHUNK_OF), all calls pipelined; the per-key replies in input order."""
        return drive(self.batch_steps(fn, head, rows, keys, chunk, route), self.run)

    def batch_steps(self, fn: str, head: Sequence[Any], rows: Sequence[Sequence[Any]], keys: Sequence[bytes],
                    chunk: int | None = None, route: Callable[[bytes], int] | None = None) -> Steps[list[Any]]:
        """batch as steps (mooncake_redis.steps): one round trip."""
        size = chunk or CHUNK_OF.get(fn, BATCH_CHUNK)
        shard_of = route or self.shard_of
        by_shard: dict[int, list[int]] = defaultdict(list)
        for i, key in enumerate(keys):
            by_shard[shard_of(key)].append(i)
        calls = []
        for shard, idx in by_shard.items():
            for start in range(0, len(idx), size):
                part = idx[start:start + size]
                calls.append((shard, part, [a for i in part for a in rows[i]]))
        replies = (yield [self.command(fn, shard, *head, *argv) for shard, _, argv in calls]) if calls else []
        out: list[Any] = [None] * len(keys)
        for (_, part, _), reply in zip(calls, replies):
            for i, value in zip(part, reply):
                out[i] = value
        return out

    # ---- reading keys ----------------------------------------------------------------
    def scan(self, shard: int, match: bytes, count: int = SCAN_COUNT) -> Iterator[list[bytes]]:
        """SCAN `shard`'s keys matching `match` (a pattern under the shard key) in steps; yields
        each non-empty batch. As with any SCAN, a key may come twice."""
        cursor = 0
        while True:
            cursor, batch = self.scan_step(shard, cursor, match, count)
            if batch:
                yield batch
            if cursor == 0:
                return

    def scan_step(self, shard: int, cursor: int, match: bytes, count: int = SCAN_COUNT) -> tuple[int, list[bytes]]:
        """One SCAN step over `shard`'s server from `cursor`: (next cursor, 0 when the walk is
        done; the keys matching `match` it found, maybe none)."""
        nxt, batch = run(self.node(shard), [("SCAN", cursor, "MATCH", match, "COUNT", count)])[0]
        return int(nxt), list(batch)

    def scan_objects(self, shard: int, tenant_glob: str = "*") -> Iterator[tuple[str, list[bytes]]]:
        """SCAN one shard's object keys in steps; yields (tenant, [user key]) batches."""
        prefix = self.keys[shard].prefix("object")
        for batch in self.scan(shard, prefix + tenant_glob.encode() + b":*"):
            by_tenant: dict[str, list[bytes]] = defaultdict(list)
            for rkey in batch:
                tenant, _, key = rkey[len(prefix):].partition(b":")
                name = tenant.decode(errors="replace")
                if NAME_RE.fullmatch(name):  # a stray key is not an object of any tenant
                    by_tenant[name].append(key)
            yield from by_tenant.items()

    def pipeline(self, shard: int, transaction: bool = True) -> redis.client.Pipeline:
        """A pipeline (MULTI/EXEC when `transaction`) for commands on `shard`'s keys only; its
        replies and errors are redis-py's own."""
        return self.node(shard).pipeline(transaction=transaction)

    # ---- nodes -----------------------------------------------------------------------
    def node(self, shard: int) -> redis.Redis:
        """The client of the server that holds `shard` (on a cluster: its slot's node)."""
        return cluster.node_client(self.redis, self.keys[shard].P)

    def node_name(self, shard: int) -> str:
        """host:port of the cluster node that serves `shard` ("" when not a cluster)."""
        return cluster.node_name(self.redis, self.keys[shard].P)

    def spread(self, shards: Iterable[int]) -> list[int]:
        """`shards` reordered so that consecutive ones are served by different nodes where
        possible (round robin over the nodes): a worker's steps then take turns on the nodes."""
        by_node: dict[str, list[int]] = defaultdict(list)
        for shard in sorted(shards):
            by_node[self.node_name(shard)].append(shard)
        queues = list(by_node.values())
        return [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]

    def close(self) -> None:
        resp.close(self.redis)
        self.redis.close()
