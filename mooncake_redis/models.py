"""Plain result types returned by Master."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class ReplicaStatus(str, Enum):
    PROCESSING = "processing"  # allocated, put not yet ended
    COMPLETE = "complete"      # readable


@dataclass(frozen=True)
class Replica:
    segment: str
    offset: int   # absolute address: the segment's base plus the offset inside it
    size: int
    status: ReplicaStatus
    kind: str = "memory"        # "memory", or "disk": a copy on a client's local disk (segment "", offset 0)
    client: str | None = None   # disk: the client whose disk holds it
    location: str | None = None  # disk: where on that disk (as the client reported it)


@dataclass(frozen=True)
class ReplicaListResult:
    replicas: list[Replica]  # memory replicas first, then disk replicas
    lease_ttl_ms: int
    checksum: str | None = None  # as given to put_end (the data plane's blake3 hex digest)


@dataclass(frozen=True)
class ObjectInfo:
    key: bytes
    tenant_id: str
    size: int
    status: ReplicaStatus
    writer: str
    put_started_ms: int | None     # while the put is in progress (put_end drops it)
    lease_until_ms: int
    soft_pin_until_ms: int | None
    hard_pinned: bool
    group_id: str | None
    replicas: list[Replica]
    guaranteed_until_ms: int | None = None  # None when no guarantee is active
    fields: dict[str, str] = field(repr=False, default_factory=dict)  # the raw hash
    dead_replicas: list[Replica] = field(default_factory=list)  # on segments unmounted since (swept later)


@dataclass(frozen=True)
class ShardUsage:
    shard: int
    used_bytes: int
    capacity_bytes: int
    objects: int
    guaranteed_bytes: int = 0        # live replicas of objects with a guarantee (until the sweep ends it)
    guaranteed_limit_bytes: int = 0  # floor(capacity_bytes x guaranteed_capacity_ratio)


@dataclass(frozen=True)
class Usage:
    used_bytes: int
    capacity_bytes: int
    objects: int
    shards: list[ShardUsage]
    guaranteed_bytes: int = 0
    guaranteed_limit_bytes: int = 0


@dataclass(frozen=True)
class ShardStats:
    """One shard's figures, read at one moment (MaintenanceApi.shard_stats): what `status`, the
    metrics and the benchmarks show."""
    shard: int
    capacity_bytes: int
    used_bytes: int
    objects: int
    guaranteed_bytes: int
    puts_in_progress: int          # P:processing
    held_extents: int              # P:held
    clients: int                   # P:clients
    segments: int                  # P:segs
    groups_draining: int           # P:evict:draining
    guaranteed_objects: int        # P:guaranteed
    candidates: dict[str, int]     # eviction units per tier (keys.TIERS names), every tier
    clock_ms: int | None           # the clock test hook's value, None when not frozen
    claim: bytes | None            # P:worker: "<worker id> <until ms>"
    worker_figures: dict[str, str] = field(default_factory=dict)  # P:metrics, the workers' figures
    # figures stored malformed (not integers: mooncake_redis.figures), read as 0 above and left out of
    # worker_figures: "P.<field>" or "P:metrics.<field>" -> the value as stored
    malformed: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class EvictionStep:
    """One mc_evict call on one shard."""
    shard: int
    state: str          # idle | target | more | blocked
    units: int
    objects: int
    bytes: int
    used_bytes: int
    target_bytes: int
    queued: int = 0     # objects queued for offload instead of evicted (offload_on_evict)


@dataclass(frozen=True)
class EvictionReport:
    evicted_units: int
    evicted_objects: int
    evicted_bytes: int
    steps: int
    final: list[EvictionStep]  # the last step of each shard
    queued_objects: int = 0    # objects queued for offload instead of evicted (offload_on_evict)


@dataclass(frozen=True)
class OffloadTask:
    """One object for a client to copy to its local disk (offload_object_heartbeat)."""
    key: bytes
    tenant_id: str
    size: int
    priority: str  # high | normal | low
    segment: str   # the memory replica to copy from
    offset: int
    attempt: int = 1  # 1 for the first hand-out, more after timeouts or failures


@dataclass(frozen=True)
class DiskRemoval:
    """A file a client is to remove from its local disk: the disk replica of `key` at `location`
    went (remove_object_heartbeat; acknowledge with ack_remove_object_heartbeat)."""
    key: bytes
    tenant_id: str
    location: str
