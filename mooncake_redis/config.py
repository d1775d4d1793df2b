"""Configuration: MasterConfig (store-wide, kept in Redis) and ReplicateConfig (per put)."""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, fields
from enum import Enum

from .errors import ErrorCode, MasterError
from .keys import CUSTOM_PROFILE, DEFAULT_KEY_PROFILE, KEY_PROFILES, LEGACY_KEY_PATTERN, compile_key_pattern, profile_of

NAME_RE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")  # namespaces and tenant ids: use fullmatch


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
    guaranteed_ttl_ms: int = 0         # > 0: guaranteed against eviction until put_start + this (ms)
    guarantee_fallback: bool = False   # past the guaranteed-capacity limit: write an ordinary object
    # Mooncake's host_id and prefer_alloc_in_same_node: the writer's node, and whether one replica
    # goes to a segment mounted with that host (mount_segment's host) when one has room
    host: str | None = None
    prefer_same_host: bool = False
    # the radix index (MasterConfig.enable_radix_tree): the prefix hash of the parent node of the
    # keys' node (ignored while the index is off)
    parent_block_hash: str | bytes | None = None


MAX_INT = 2**53 - 1  # integers travel as Lua doubles: exact up to here
MAX_TTL = 10**15     # durations (ms): now + MAX_TTL stays far below MAX_INT (Lua's MAX_TTL)
MAX_KEY_LENGTH = 1 << 20
MAX_EVENTS = 100_000_000  # a shard's KV event stream holds at most about this many entries

# Integer fields: (lowest, highest) accepted value. Durations are ms; 0 is allowed only where it
# means something (a lease of 0 = reads grant none; a retention or limit of 0 = none). The fields
# the functions read have the same ranges in lua/lib/00_base.lua (CONFIG_RANGES; a test checks
# that they agree): a configuration accepted here is one every function runs on.
INT_RANGES = {
    "shards": (1, 16384),
    "default_kv_lease_ttl": (0, MAX_TTL),
    "kv_lease_slack": (0, MAX_TTL),
    "default_kv_soft_pin_ttl": (1, MAX_TTL),
    "max_kv_soft_pin_ttl": (1, MAX_TTL),
    "put_start_discard_timeout": (1, MAX_TTL),
    "put_start_release_timeout": (1, MAX_TTL),
    "client_ttl": (1, MAX_TTL),
    "offload_queue_limit": (0, MAX_INT),
    "offload_task_timeout": (1, MAX_TTL),
    "offload_max_attempts": (1, 1000),
    "disk_removal_queue_limit": (0, MAX_INT),
    "max_retained_groups": (0, MAX_INT),
    "max_group_retention": (0, MAX_TTL),
    "max_retained_groups_per_tenant": (0, MAX_INT),
    "max_key_length": (1, MAX_KEY_LENGTH),
    "max_guaranteed_ttl": (0, MAX_TTL),
    "min_replicas_ack": (0, 64),
    "replica_ack_timeout": (1, MAX_INT),
    "kv_events_maxlen": (0, MAX_EVENTS),
}
# Fields that name one of a few choices (the functions read the same in lua/lib/00_base.lua's
# CONFIG_RANGES, {'choice', ...}; a test checks that they agree).
CHOICES = {
    # where put_start places replicas after the preferred segments and the writer's host:
    # most_free (the segments with the most free bytes), random (uniform among segments with
    # room, as Mooncake's default), free_ratio_first (the highest free / size, Mooncake's)
    "allocation_strategy": ("most_free", "random", "free_ratio_first"),
}
_INT_TEXT = re.compile(r"-?[0-9]{1,17}")  # stored numbers: only forms Lua's tonumber reads the same
_FLOAT_TEXT = re.compile(r"-?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?")


def _bad(message: str) -> MasterError:
    return MasterError(ErrorCode.INVALID_PARAMS, message)


@dataclass(frozen=True)
class MasterConfig:
    """Store-wide settings, named after Mooncake's master flags; durations in milliseconds.

    Every field except `namespace` is written to each shard's `<ns>:{<ns>:<i>}:config` hash,
    where the functions read it."""

    namespace: str = "mc"
    shards: int = 1
    default_kv_lease_ttl: int = 10_000
    # a read renews a lease only when it ends before now + default_kv_lease_ttl, and then to that
    # + kv_lease_slack: a key read again within the slack is a read that writes nothing
    kv_lease_slack: int = 0
    default_kv_soft_pin_ttl: int = 30 * 60 * 1000
    max_kv_soft_pin_ttl: int = 24 * 3600 * 1000
    # A small headroom: puts evict what they need (evict_on_put), so the background loop only
    # keeps most puts from having to (docs/configuration.md, "Why the watermarks default to 0.99 / 0.01").
    eviction_high_watermark_ratio: float = 0.99
    eviction_ratio: float = 0.01
    allow_evict_soft_pinned_objects: bool = True
    put_start_discard_timeout: int = 30_000
    put_start_release_timeout: int = 600_000
    client_ttl: int = 10_000
    offload_queue_limit: int = 50_000
    max_retained_groups: int = 65_536
    max_group_retention: int = 24 * 3600 * 1000
    max_key_length: int = 4096
    evict_on_put: bool = True  # a put_start that finds no space evicts candidates of its shard first
    guaranteed_capacity_ratio: float = 0.5  # share of each shard's capacity guaranteed bytes may hold (0: off)
    guaranteed_tenant_ratio: float = 1.0    # share of that limit one tenant may hold
    max_guaranteed_ttl: int = 24 * 3600 * 1000
    # group retention (retain_groups): one tenant's share of max_retained_groups (None: all of it),
    # and whether retained groups may be evicted once no ordinary candidate is left
    max_retained_groups_per_tenant: int | None = None
    allow_evict_retained_groups: bool = True
    # the radix index (lua/lib/32_radix.lua): off means no index writes at all; the pattern is a
    # regex with one group capturing a key's prefix hash, the one extraction rule of routing,
    # the index and expire_guaranteed (keys.prefix_of). key_profile names the pattern of an
    # engine's key format (keys.KEY_PROFILES, docs/engines.md); give one or the other: the
    # other follows ("" = unset; neither: the default profile; a pattern of no profile is
    # profile "custom")
    enable_radix_tree: bool = False
    key_profile: str = ""
    radix_key_pattern: str = ""
    # SSD offload (mooncake_redis.offload): queue each object at its first readable put_end for
    # the disk of the client owning its memory replica; a task handed out and not acknowledged
    # in offload_task_timeout is handed out again (HIGH: until it succeeds; NORMAL and LOW: up to
    # offload_max_attempts hand-outs, then dropped and counted)
    offload_on_put: bool = False
    # eviction queues an evictable object that has no disk copy for offload instead of dropping
    # it (its memory goes once the copy is recorded, or when the offload is refused or not handed
    # out within offload_task_timeout); allocation-time eviction (evict_on_put) still drops
    offload_on_evict: bool = False
    offload_task_timeout: int = 60_000
    offload_max_attempts: int = 3
    # per client: the files whose disk replica went and that its agent is still to remove (split
    # over the shards as offload_queue_limit is); past it a removal is counted as orphaned and
    # left to the agent's garbage collection (offload-gc)
    disk_removal_queue_limit: int = 50_000
    # durability: each batch of writes waits (WAIT) until this many replicas of its server hold
    # it, or replica_ack_timeout ms pass (then the call fails OUTCOME_UNKNOWN); 0: no wait
    # (Redis replication is asynchronous: an acknowledged write may die with its primary)
    min_replicas_ack: int = 0
    replica_ack_timeout: int = 1000
    # KV events (mooncake_redis.events): > 0 appends every change to the stored objects and
    # their replicas to the shard's stream <ns>:{<ns>:<i>}:events in the call that makes it,
    # trimmed to about this many entries (XADD MAXLEN ~); 0: off (no stream, no cost)
    kv_events_maxlen: int = 0
    # placement (lua/ops/put_start.lua; CHOICES above)
    allocation_strategy: str = "most_free"

    def __post_init__(self) -> None:
        if not isinstance(self.namespace, str) or not NAME_RE.fullmatch(self.namespace):
            raise _bad("namespace must match [A-Za-z0-9_.-]{1,64}")
        self._resolve_key_profile()
        if self.max_retained_groups_per_tenant is None:
            object.__setattr__(self, "max_retained_groups_per_tenant", self.max_retained_groups)
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "bool":
                if not isinstance(value, bool):
                    raise _bad(f"{f.name} must be a bool, not {type(value).__name__}")
            elif f.type in ("int", "int | None"):
                lo, hi = INT_RANGES[f.name]
                if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                    raise _bad(f"{f.name} must be an integer in [{lo}, {hi}], not {value!r}")
            elif f.type == "float":
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    raise _bad(f"{f.name} must be a finite number, not {value!r}")
                object.__setattr__(self, f.name, float(value))
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                raise _bad(f"{name} must be one of {', '.join(allowed)}, not {getattr(self, name)!r}")
        if not 0 < self.eviction_high_watermark_ratio <= 1:
            raise _bad("eviction_high_watermark_ratio must be in (0, 1]")
        if not 0 <= self.eviction_ratio <= self.eviction_high_watermark_ratio or self.eviction_ratio >= 1:
            raise _bad("eviction_ratio must be in [0, 1) and at most eviction_high_watermark_ratio")
        for name in ("guaranteed_capacity_ratio", "guaranteed_tenant_ratio"):
            if not 0 <= getattr(self, name) <= 1:
                raise _bad(f"{name} must be in [0, 1]")
        # as Mooncake's master
        if self.default_kv_soft_pin_ttl > self.max_kv_soft_pin_ttl:
            raise _bad("default_kv_soft_pin_ttl must not exceed max_kv_soft_pin_ttl")
        if self.put_start_release_timeout <= self.put_start_discard_timeout:
            raise _bad("put_start_release_timeout must be greater than put_start_discard_timeout")

    def _resolve_key_profile(self) -> None:
        """key_profile and radix_key_pattern, each from the other (or the default profile);
        INVALID_PARAMS for an unknown profile, a bad pattern, or a profile and a pattern that
        disagree."""
        profile, pattern = self.key_profile, self.radix_key_pattern
        chosen = bool(profile or pattern)
        if not isinstance(profile, str):
            raise _bad("key_profile must be a str")
        if not isinstance(pattern, str):
            raise _bad("radix_key_pattern must be a str")
        if profile and profile != CUSTOM_PROFILE and profile not in KEY_PROFILES:
            raise _bad(f"key_profile must be one of {sorted(KEY_PROFILES)} (or {CUSTOM_PROFILE!r} with "
                       f"a radix_key_pattern), not {profile!r}")
        if not pattern:
            if profile == CUSTOM_PROFILE:
                raise _bad(f"key_profile {CUSTOM_PROFILE!r} needs a radix_key_pattern")
            pattern = KEY_PROFILES[profile or DEFAULT_KEY_PROFILE]
        try:
            compile_key_pattern(pattern)
        except ValueError as exc:
            raise _bad(f"radix_key_pattern {pattern!r}: {exc}") from None
        named = profile_of(pattern)
        if profile and profile != CUSTOM_PROFILE and named != profile:
            raise _bad(f"key_profile {profile!r} is radix_key_pattern {KEY_PROFILES[profile]!r}, "
                       f"not {pattern!r} (give one of the two)")
        object.__setattr__(self, "key_profile", named)
        object.__setattr__(self, "radix_key_pattern", pattern)
        # not a field: whether the caller chose the pattern (Master.connect keeps an existing
        # store's own pattern for a config that did not)
        object.__setattr__(self, "_pattern_chosen", chosen)

    @property
    def pattern_chosen(self) -> bool:
        """Did the caller give key_profile or radix_key_pattern (rather than take the default)?"""
        return bool(getattr(self, "_pattern_chosen", True))

    def to_redis(self) -> dict[str, str]:
        """The stored form: integers in decimal, booleans as 0/1, ratios as repr (finite, so
        Lua's tonumber reads back the same double)."""
        out = {}
        for name, value in asdict(self).items():
            if isinstance(value, str):
                if name != "namespace":
                    out[name] = value
            elif name != "namespace":
                out[name] = str(int(value)) if isinstance(value, bool) else repr(value)
        return out

    @classmethod
    def from_redis(cls, namespace: str, stored: dict) -> "MasterConfig":
        """The configuration stored in `<ns>:{<ns>:0}:config` (fields missing there keep their
        defaults); a corrupt value is INTERNAL_ERROR naming the field."""
        where = f"stored configuration {namespace}:{{{namespace}:0}}:config"
        kwargs: dict = {}
        legacy = stored and b"radix_key_pattern" not in stored  # written before the pattern was configurable
        if legacy:
            kwargs["radix_key_pattern"] = LEGACY_KEY_PATTERN
        # key_profile follows the stored pattern: a store written before profiles (no such
        # field) gets the profile of its pattern ("hash-first": the former default), so a new
        # default never reinterprets an existing store's keys
        skip = {"namespace"} | ({"key_profile"} if legacy else set())
        for f in fields(cls):
            raw = stored.get(f.name.encode()) if f.name not in skip else None
            if raw is None:
                continue
            try:
                kwargs[f.name] = _parse_stored(str(f.type), raw.decode())  # a str: annotations are strings here
            except (UnicodeDecodeError, ValueError):
                raise MasterError(ErrorCode.INTERNAL_ERROR,
                                  f"{where}: field {f.name} has a corrupt value {raw!r}") from None
        try:
            return cls(namespace=namespace, **kwargs)
        except MasterError as exc:
            raise MasterError(ErrorCode.INTERNAL_ERROR, f"{where} is invalid: {exc.message}") from None


def _parse_stored(kind: str, text: str):
    if kind == "str":
        return text
    if kind == "bool":
        if text not in ("0", "1"):
            raise ValueError(text)
        return text == "1"
    if kind in ("int", "int | None"):
        if not _INT_TEXT.fullmatch(text):
            raise ValueError(text)
        return int(text)
    if not _FLOAT_TEXT.fullmatch(text):
        raise ValueError(text)
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value
