"""The radix index (MasterConfig.enable_radix_tree): nodes are prefix hashes with a parent; a
node's keys are one eviction unit, and a node with a live child is never a candidate, so
eviction takes leaves first (lua/lib/32_radix.lua holds the model and the key schema).

A node lives on `keys.node_shard(hash)`, which is also the shard of every key whose prefix hash
it is. A child and its parent on different shards are joined through the child shard's outbox:
`drain_radix_outbox` applies each entry on the parent's shard and then acknowledges it; puts
drain their own links before returning, workers drain the rest, and `reconcile_radix` removes
what a crash left (phantom children, empty nodes past a grace period)."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Sequence

from . import wire
from .api import ApiBase
from .checks import _as_key, _check_int, _check_tenant
from .errors import ErrorCode, MasterError
from .keys import node_shard, prefix_of

MAX_HASH = 256           # bytes of a prefix hash
OUTBOX_STEP = 256        # outbox entries a drain takes per call
RECONCILE_STEP = 64      # nodes a reconciliation call looks at (and at most 256 children)
RECONCILE_SCAN = 512     # keys a reconciliation step's SCAN looks at (COUNT): a worker pass's share
STATS_STEP = 10_000      # node records a stats call counts (and the SCAN COUNT of radix_stats)
DEFAULT_GRACE_MS = 60_000  # an empty node (no keys, no children) is dropped after this long
MAX_SUBTREE_DEPTH = 64
MAX_SUBTREE_NODES = 65_536


@dataclass(frozen=True)
class RadixNodeInfo:
    prefix_hash: bytes
    tenant_id: str
    shard: int
    parent: bytes | None
    children: list[bytes]
    keys: list[bytes]
    created_ms: int
    link_pending: bool  # its link to a parent on another shard is still in the outbox
    why: str            # unit_rule's answer: "" evictable, "has_children", "no_members" (a shell), ...

    @property
    def shell(self) -> bool:
        """No keys registered (yet): a node known only as a parent, or registered ahead of its keys."""
        return not self.keys


@dataclass(frozen=True)
class RadixShardStats:
    shard: int
    nodes: int
    shells: int
    leaves: int
    outbox: int


def _hash(h: Any, what: str = "prefix_hash") -> bytes:
    b = _as_key(h)
    if not 1 <= len(b) <= MAX_HASH:
        raise MasterError(ErrorCode.INVALID_PARAMS, f"{what} must be 1-{MAX_HASH} bytes")
    return b


def parse_outbox_entry(e: bytes) -> tuple[str, int, int, str, bytes, bytes]:
    """op, seq, parent shard, tenant, parent, child of an outbox entry (format: 32_radix.lua)."""
    op, seq, pshard, tenant, plen, rest = e.split(b" ", 5)
    n = int(plen)
    return op.decode(), int(seq), int(pshard), tenant.decode(), rest[:n], rest[n:]


class RadixApi(ApiBase):
    # ---- the client's own routing -------------------------------------------------------
    def node_shard(self, prefix_hash: bytes) -> int:
        return node_shard(prefix_hash, self.shards)

    def radix_prefix(self, key: bytes) -> bytes:
        """The node a key registers under: its prefix hash (keys.prefix_of with the store's
        pattern), or b"" when it is not indexed: a key routed elsewhere by a {tag}, or whose
        prefix is longer than 256 bytes."""
        p = prefix_of(key, self.transport.key_pattern)
        if len(p) > MAX_HASH or self.node_shard(p) != self.transport.shard_of(key):
            return b""
        return p

    # ---- registration (path B) ----------------------------------------------------------
    def register_radix_node(self, prefix_hash: Any, parent_hash: Any = None, tenant_id: str = "default") -> None:
        code = self.batch_register_radix_nodes([(prefix_hash, parent_hash)], tenant_id)[0]
        if code != ErrorCode.OK:
            raise MasterError(code, f"register_radix_node {prefix_hash!r}")

    def batch_register_radix_nodes(self, pairs: Sequence[tuple[Any, Any]],
                                   tenant_id: str = "default") -> list[ErrorCode]:
        """Register (prefix_hash, parent_hash or None) pairs; per pair OK, or INVALID_PARAMS (a
        bad hash, or the node already has another parent: a chained hash has one parent)."""
        self._radix_on()
        _check_tenant(tenant_id)
        out: list[ErrorCode] = [ErrorCode.INVALID_PARAMS] * len(pairs)
        rows, nodes, todo = [], [], []
        for i, (h, parent) in enumerate(pairs):
            try:
                b = _hash(h)
                p = b"" if parent is None else _hash(parent, "parent_hash")
            except MasterError:
                continue
            rows.append((b, p, self.node_shard(p) if p else b""))
            nodes.append(b)
            todo.append(i)
        head = wire.head(("node", "parent", "parent_shard"), tenant=tenant_id)
        replies = self._batch_by_node("mc_radix_register", head, rows, nodes)
        for i, r in zip(todo, replies):
            out[i] = ErrorCode(r)
        self.drain_radix_outbox({self.node_shard(n) for n, r in zip(nodes, replies) if r == 0})
        return out

    def _radix_on(self) -> None:
        if not self.config.enable_radix_tree:
            raise MasterError(ErrorCode.INVALID_PARAMS, "the radix index is off (MasterConfig.enable_radix_tree)")

    def _batch_by_node(self, fn: str, head: list, rows: list, nodes: list[bytes]) -> list[Any]:
        by_shard: dict[int, list[int]] = defaultdict(list)
        for i, n in enumerate(nodes):
            by_shard[self.node_shard(n)].append(i)
        calls = []
        for shard, idx in by_shard.items():
            for start in range(0, len(idx), 128):
                part = idx[start:start + 128]
                calls.append((shard, part))
        replies = self.transport.run([self.transport.command(fn, shard, *head, *(x for i in part for x in rows[i]))
                                      for shard, part in calls])
        out: list[Any] = [None] * len(nodes)
        for (_, part), reply in zip(calls, replies):
            for i, r in zip(part, reply):
                out[i] = r
        return out

    # ---- queries ------------------------------------------------------------------------
    def get_keys_by_prefix(self, prefix_hash: Any, tenant_id: str = "default") -> list[bytes]:
        """The node's registered keys (sorted); one call on the node's shard, whatever the
        store's size. An unknown node has none."""
        _check_tenant(tenant_id)
        h = _hash(prefix_hash)
        keys, _ = self._nodes([h], tenant_id)[0]
        return sorted(keys)

    def get_subtree_keys(self, prefix_hash: Any, max_depth: int, tenant_id: str = "default") -> list[bytes]:
        """The keys of the node and its descendants down to max_depth levels below it (0: the
        node alone), breadth-first, level by level (each level one pipelined round of calls,
        one per shard); at most MAX_SUBTREE_NODES nodes."""
        _check_tenant(tenant_id)
        _check_int(max_depth, "max_depth", 0, MAX_SUBTREE_DEPTH)
        level, seen, out = [_hash(prefix_hash)], set(), []
        for depth in range(max_depth + 1):
            level = [n for n in dict.fromkeys(level) if n not in seen]
            if not level:
                break
            seen.update(level)
            if len(seen) > MAX_SUBTREE_NODES:
                raise MasterError(ErrorCode.INVALID_PARAMS, f"subtree larger than {MAX_SUBTREE_NODES} nodes")
            nxt = []
            for keys, kids in self._nodes(level, tenant_id):
                out.extend(sorted(keys))
                nxt.extend(sorted(kids))
            level = nxt if depth < max_depth else []
        return out

    def _nodes(self, nodes: list[bytes], tenant_id: str) -> list[tuple[list[bytes], list[bytes]]]:
        head = wire.head(("node",), tenant=tenant_id)
        replies = self._batch_by_node("mc_radix_nodes", head, [(n,) for n in nodes], nodes)
        return [(list(k), list(c)) for k, c in replies]

    def describe_radix_node(self, prefix_hash: Any, tenant_id: str = "default") -> RadixNodeInfo:
        """The node as stored; OBJECT_NOT_FOUND when unknown."""
        _check_tenant(tenant_id)
        h = _hash(prefix_hash)
        shard = self.node_shard(h)
        reply = self.transport.call("mc_radix_describe", shard, *wire.options(tenant=tenant_id, node=h))
        if isinstance(reply, int):
            raise MasterError(ErrorCode(reply), f"describe_radix_node {prefix_hash!r}")
        parent, kids, keys, created, pending, why = reply
        return RadixNodeInfo(h, tenant_id, shard, parent or None, sorted(kids), sorted(keys), int(created),
                             bool(pending), why.decode())

    def radix_stats(self) -> list[RadixShardStats]:
        """Per shard: nodes, shells (no keys), leaves (no children) and outbox entries (a SCAN walk
        of the shard's node records, counted in bounded calls; as with any SCAN, a node may count
        twice while the server resizes its key table)."""
        out = []
        for shard in range(self.shards):
            cursor, nodes, shells, leaves, outbox = 0, 0, 0, 0, 0
            while True:
                cursor, ids = self._node_ids(shard, cursor, STATS_STEP)
                for i in range(0, max(len(ids), 1), STATS_STEP):
                    n, s, lv, outbox = self.transport.call("mc_radix_stats", shard, *ids[i:i + STATS_STEP])
                    nodes, shells, leaves = nodes + n, shells + s, leaves + lv
                if cursor == 0:
                    break
            out.append(RadixShardStats(shard, nodes, shells, leaves, outbox))
        return out

    def _node_ids(self, shard: int, cursor: int, count: int) -> tuple[int, list[bytes]]:
        """One SCAN step over `shard`'s node records (P:rnode:*): (next cursor, 0 when the walk is
        done; the ids "<tenant>:<hash>" of the records found)."""
        prefix = self.transport.keys[shard].prefix("radix_node")
        nxt, keys = self.transport.scan_step(shard, cursor, prefix + b"*", count)
        return nxt, [k[len(prefix):] for k in keys]

    # ---- cross-shard steps ----------------------------------------------------------------
    def drain_radix_outbox(self, shards: Any = None, max_entries: int = 4 * OUTBOX_STEP) -> int:
        """Apply the outbox entries of `shards` (default: all) on their parents' shards, then
        acknowledge them; at most max_entries per shard. Returns the entries acknowledged."""
        done = 0
        for shard in sorted(range(self.shards) if shards is None else shards):
            left = max_entries
            while left > 0:
                entries = self.transport.call("mc_radix_outbox", shard, min(OUTBOX_STEP, left))
                if not entries:
                    break
                by_parent: dict[int, list[bytes]] = defaultdict(list)
                for e in entries:
                    by_parent[parse_outbox_entry(e)[2]].append(e)
                self.transport.run([self.transport.command("mc_radix_apply", p, *es) for p, es in by_parent.items()])
                done += self.transport.call("mc_radix_ack", shard, *entries)
                left -= len(entries)
                if len(entries) < OUTBOX_STEP:
                    break
        return done

    def reconcile_radix(self, shard: int, grace_ms: int = DEFAULT_GRACE_MS, cursor: int = 0,
                        scan_count: int = RECONCILE_SCAN) -> tuple[int, int, int]:
        """One bounded reconciliation step on `shard` from `cursor` (a SCAN of about scan_count
        keys for node records, then calls of at most RECONCILE_STEP nodes each): drops empty
        nodes older than grace_ms and unlinks children that are gone (probed on their own shard).
        Returns (next cursor, 0 when the walk is done; nodes dropped; phantom children removed)."""
        nxt, ids = self._node_ids(shard, cursor, scan_count)
        dropped = phantoms = 0
        while ids:
            seen, d, remote = self.transport.call("mc_radix_reconcile", shard, grace_ms, *ids[:RECONCILE_STEP])
            ids = ids[int(seen):]
            dropped += int(d)
            phantoms += self._unlink_phantoms(shard, remote)
        return nxt, dropped, phantoms

    def _unlink_phantoms(self, shard: int, remote: list) -> int:
        """Probe the children a reconciliation call found not alive on `shard` on their own
        shards, and unlink those gone there: how many were unlinked."""
        triples = [(remote[i], remote[i + 1], remote[i + 2]) for i in range(0, len(remote), 3)]
        if not triples:
            return 0
        probes = self.transport.run([self.transport.command("mc_radix_probe", self.node_shard(kid), tenant, kid, parent)
                                     for tenant, parent, kid in triples])
        unlinks = [b"unlink %d %d %s %d %s%s" % (seq, shard, tenant, len(parent), parent, kid)
                   for (tenant, parent, kid), (alive, seq) in zip(triples, probes) if not alive]
        if unlinks:
            self.transport.call("mc_radix_apply", shard, *unlinks)
        return len(unlinks)

    def reconcile_radix_all(self, grace_ms: int = DEFAULT_GRACE_MS) -> tuple[int, int]:
        """Drain every outbox, then a full reconciliation walk of every shard: (dropped, phantoms)."""
        self.drain_radix_outbox()
        dropped = phantoms = 0
        for shard in range(self.shards):
            cursor = 0
            while True:
                cursor, d, p = self.reconcile_radix(shard, grace_ms, cursor)
                dropped, phantoms = dropped + d, phantoms + p
                if cursor == 0:
                    break
        return dropped, phantoms
