"""The key schema and shard routing.

Every key of shard i starts with the shard key `<ns>:{<ns>:<i>}`; the braces make it a Redis
Cluster hash tag, so one shard's keys share a slot. An object's shard comes from its routing
part: a `{tag}` inside the user key if present, else the prefix hash if the key looks like
`<hex prefix hash>[_suffix]`, else the whole key; shard = first 8 bytes of blake3(routing part),
big-endian, modulo the shard count.
"""
from __future__ import annotations

import re

from blake3 import blake3

PREFIX_KEY_RE = re.compile(rb"^([0-9a-f]{32,128})(?:_|$)")


def shard_key(namespace: str, shard: int) -> str:
    return f"{namespace}:{{{namespace}:{shard}}}"


def routing_part(key: bytes) -> bytes:
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            return key[start + 1:end]
    m = PREFIX_KEY_RE.match(key)
    return m.group(1) if m else key


def shard_of(key: bytes, shards: int) -> int:
    if shards == 1:
        return 0
    digest = blake3(routing_part(key)).digest(8)
    return int.from_bytes(digest, "big") % shards


def object_key(namespace: str, shard: int, tenant: str, key: bytes) -> bytes:
    return f"{shard_key(namespace, shard)}:obj:{tenant}:".encode() + key


def segment_slice(base: int, size: int, shard: int, shards: int) -> tuple[int, int]:
    """The part of a segment that shard `shard` allocates from: (slice base, slice size)."""
    lo = base + shard * size // shards
    hi = base + (shard + 1) * size // shards
    return lo, hi - lo
