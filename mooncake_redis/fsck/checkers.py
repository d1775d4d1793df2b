"""The checkers fsck runs, in order: the one list a new checker joins (a module under
mooncake_redis/fsck/ with a Checker subclass; see base.Checker for the hooks). Their order is the
order of their hooks within each phase, and so the order of the findings; repairs run in the
order their actions declare."""
from __future__ import annotations

from .base import Checker, Kind
from .counters import ShardCounters
from .drains import Drains
from .gateway import Gateway
from .groups import Groups
from .guarantees import Guarantees
from .hosts import Hosts
from .indexed import IndexedMembers
from .objects import Objects
from .offload import Offload
from .radix import Radix
from .replication import Replications
from .retention import Retention
from .segments import Segments
from .tasks import Tasks

CHECKERS: tuple[Checker, ...] = (
    Objects(),        # object hashes, their index entries and placement (drives the object pass)
    Segments(),       # segment records, P:segs, free lists and the allocator's tiling
    Drains(),         # graceful unmounts: draining slices and P:segs_draining
    Hosts(),          # the host index: P:hsegs:<host> and the slices mounted with a host
    Guarantees(),     # guaranteed bytes per tenant and segment, prefix sets
    ShardCounters(),  # P.used_bytes, capacity_bytes, objects, guaranteed_bytes
    Groups(),         # groups and radix nodes' keys (composite units)
    Retention(),      # group retention counts
    IndexedMembers(), # grouped radix keys: their groups' and nodes' membership
    Radix(),          # the radix index
    Offload(),        # the SSD offload tier
    Replications(),   # replica copies and moves in flight
    Tasks(),          # Mooncake's task queue: task records, their indexes, P.tasks_pending
    Gateway(),        # the Mooncake wire gateway's segment records (shard 0)
)


def _kinds(checkers: tuple[Checker, ...]) -> dict[str, Kind]:
    out: dict[str, Kind] = {}
    for c in checkers:
        for kind, spec in c.kinds.items():
            if kind in out:
                raise ValueError(f"fsck kind {kind!r} declared twice (checker {c.name})")
            out[kind] = spec
    return out


KINDS: dict[str, Kind] = _kinds(CHECKERS)  # kind -> (severity, repairable, what it means)
