"""Configuration: MasterConfig (store-wide, kept in Redis) and ReplicateConfig (per put)."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields
from enum import Enum

from .errors import ErrorCode, MasterError

NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")  # namespaces and tenant ids


class SoftPinAction(str, Enum):
    PRESERVE = "preserve"  # keep the object's soft pin as it is (a new object has none)
    ENABLE = "enable"      # pin until first-readable put_end + soft_pin_ttl_ms
    DISABLE = "disable"    # clear the soft pin


@dataclass(frozen=True)
class ReplicateConfig:
    replica_num: int = 1
    soft_pin_action: SoftPinAction = SoftPinAction.PRESERVE
    soft_pin_ttl_ms: int | None = None
    with_hard_pin: bool = False
    preferred_segments: tuple[str, ...] = ()
    group_id: str | None = None


@dataclass(frozen=True)
class MasterConfig:
    """Store-wide settings, named after Mooncake's master flags; durations in milliseconds.

    Every field except `namespace` is written to each shard's `<ns>:{<ns>:<i>}:config` hash,
    where the functions read it."""

    namespace: str = "mc"
    shards: int = 1
    default_kv_lease_ttl: int = 10_000
    default_kv_soft_pin_ttl: int = 30 * 60 * 1000
    max_kv_soft_pin_ttl: int = 24 * 3600 * 1000
    eviction_high_watermark_ratio: float = 0.90
    eviction_ratio: float = 0.05
    allow_evict_soft_pinned_objects: bool = True
    put_start_discard_timeout: int = 30_000
    put_start_release_timeout: int = 600_000
    client_ttl: int = 10_000
    offload_queue_limit: int = 50_000
    max_retained_groups: int = 65_536
    max_group_retention: int = 24 * 3600 * 1000
    max_key_length: int = 4096
    evict_on_put: bool = True  # a put_start that finds no space evicts candidates of its shard first

    def __post_init__(self) -> None:
        if not NAME_RE.match(str(self.namespace)):
            raise MasterError(ErrorCode.INVALID_PARAMS, "namespace must match [A-Za-z0-9_.-]{1,64}")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", "float") and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise MasterError(ErrorCode.INVALID_PARAMS, f"{f.name} must be a number")
        if not 1 <= self.shards <= 16384:
            raise MasterError(ErrorCode.INVALID_PARAMS, "shards must be in [1, 16384]")
        if not 0 < self.eviction_high_watermark_ratio <= 1 or not 0 <= self.eviction_ratio < 1:
            raise MasterError(ErrorCode.INVALID_PARAMS, "eviction ratios out of range")

    def to_redis(self) -> dict[str, str]:
        out = {}
        for name, value in asdict(self).items():
            if name != "namespace":
                out[name] = str(int(value)) if isinstance(value, bool) else str(value)
        return out

    @classmethod
    def from_redis(cls, namespace: str, stored: dict) -> "MasterConfig":
        kwargs = {}
        for f in fields(cls):
            raw = stored.get(f.name.encode()) if f.name != "namespace" else None
            if raw is None:
                continue
            raw = raw.decode()
            kwargs[f.name] = bool(int(raw)) if f.type == "bool" else (float(raw) if f.type == "float" else int(raw))
        return cls(namespace=namespace, **kwargs)
