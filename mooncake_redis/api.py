"""Master's API by family. Each family is a module of this package holding one mixin over the
shard transport (`self.transport`) and the store's configuration (ApiBase); Master
(master.py) combines them, so a new family (groups, radix, offload) is one more module and base:

  objects.py      ObjectsApi: puts, reads, removal, task references, describe
  segments.py     SegmentsApi: mounting and unmounting segments (with the dead-replica sweep), pings
  maintenance.py  MaintenanceApi: usage counters, eviction steps
  clock.py        ClockApi: the store clock's test hook
  checks.py       the argument checks they share
"""
from __future__ import annotations

from typing import TypeVar

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

    def drive(self, steps: Steps[T]) -> T:
        return drive(steps, self.transport.run)
