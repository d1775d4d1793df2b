"""Replay policies: how an engine reads and writes a request's blocks under one caching design.
A policy is a small class overriding the hooks it changes; bench/replay.py's StoreReplay calls
them for every request, on a fresh instance per run (a policy may keep online state, never
look ahead in the trace). POLICIES maps the names `mooncake-redis replay --policy` accepts."""
from __future__ import annotations

from typing import Any

from mooncake_redis import Master, ReplicateConfig

from .replay import TENANT, Request

PutBatch = tuple[list[int], "ReplicateConfig | None"]  # indexes into the request's blocks, their config


class Policy:
    """Plain reads and writes: the base every policy starts from."""

    name = ""
    summary = ""

    def master_config(self) -> dict[str, Any]:
        """MasterConfig overrides of the policy's store."""
        return {}

    def key(self, block: int) -> bytes:
        """The store key of a trace block."""
        return b"blk-%d" % block

    def lookup(self, m: Master, req: Request, keys: list[bytes], now: int) -> list[bool]:
        """Which of the request's blocks the store holds, read in order (a read leases them)."""
        return m.batch_exist_key(keys, TENANT)

    def put_batches(self, req: Request, missing: list[int], now: int) -> list[PutBatch]:
        """The missing blocks to write (indexes into req.blocks), as batches of one config each."""
        return [(missing, None)] if missing else []

    def guaranteed_bytes(self, m: Master) -> int:
        """Bytes the store holds under a guarantee now (0 for policies without guarantees)."""
        return 0


class Lru(Policy):
    name = "lru"
    summary = "plain leases: a read leases a block for default_kv_lease_ttl; the least recently leased go first"


POLICIES: dict[str, type[Policy]] = {p.name: p for p in (Lru,)}


def make_policy(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICIES)})") from None
