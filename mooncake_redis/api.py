"""Master's API by family. Each family is a module of this package holding one mixin over the
shard transport (`self.transport`) and the store's configuration (ApiBase); Master
(master.py) combines them, so a new family (groups, radix, offload) is one more module and base:

  objects.py      ObjectsApi: puts, reads, removal, task references, describe
  segments.py     SegmentsApi: mounting and unmounting segments (with the dead-replica sweep), pings
  maintenance.py  MaintenanceApi: usage counters, eviction steps
  clock.py        ClockApi: the store clock's test hook
  queries.py      QueriesApi: cache statistics, segment names and usage (read only)
  checks.py       the argument checks they share

A family that calls another's method (objects.py puts register radix nodes, offload sweeps a
shard) finds it declared on ApiBase for the type checker.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from redis import Redis

from .config import MasterConfig
from .steps import Steps, drive
from .transport import Shards

T = TypeVar("T")


class ApiBase:
    """Set by Master.__init__: the store's configuration and the one transport to its shards."""
    config: MasterConfig
    transport: Shards
    redis: Redis
    ns: str       # the namespace
    shards: int   # the shard count
    key_pattern: re.Pattern  # radix_key_pattern, compiled (keys.compile_key_pattern)
    malformed_seen: dict[str, str]  # malformed figures already logged (mooncake_redis.figures.note)
    read_heads: dict[tuple[str, str], list]  # a read's ARGV head per function and tenant (ObjectsApi._read_head)

    if TYPE_CHECKING:
        # What one family calls on another; Master combines them all. Declared for the type
        # checker only: the definitions are the families' (the signatures must stay the same).
        def node_shard(self, prefix_hash: bytes) -> int: ...  # RadixApi
        def radix_prefix(self, key: bytes) -> bytes: ...  # RadixApi
        def drain_radix_outbox(self, shards: Any = None, max_entries: int = ...) -> int: ...  # RadixApi
        def sweep_shard(self, shard: int, on_batch: Callable[[int], Any] | None = None) -> int: ...  # SegmentsApi

    def drive(self, steps: Steps[T]) -> T:
        return drive(steps, self.transport.run)
