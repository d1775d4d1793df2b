"""Maintenance: the shards' usage counters and eviction (evict_step, run_eviction). The
background loops that drive these steps are mooncake_redis.worker's."""
from __future__ import annotations

import math

from .models import EvictionReport, EvictionStep, ShardUsage, Usage
from .api import ApiBase
from .checks import _check_int

EVICT_STEP_UNITS = 16  # units per eviction step (about 25-40 us of server time each)


class MaintenanceApi(ApiBase):
    # ---- inspection ------------------------------------------------------------------
    def usage(self) -> Usage:
        rows = self.transport.run([("HMGET", k.P, "used_bytes", "capacity_bytes", "objects", "guaranteed_bytes")
                                   for k in self.transport.keys])
        ratio = self.config.guaranteed_capacity_ratio
        per = []
        for i, row in enumerate(rows):
            used, cap, objects, guaranteed = (int(v or 0) for v in row)
            per.append(ShardUsage(i, used, cap, objects, guaranteed, math.floor(cap * ratio)))
        return Usage(sum(s.used_bytes for s in per), sum(s.capacity_bytes for s in per),
                     sum(s.objects for s in per), per, sum(s.guaranteed_bytes for s in per),
                     sum(s.guaranteed_limit_bytes for s in per))

    # ---- eviction --------------------------------------------------------------------
    def evict_step(self, shard: int, max_units: int = EVICT_STEP_UNITS) -> EvictionStep:
        _check_int(shard, "shard", 0, self.shards - 1)
        _check_int(max_units, "max_units", 1, 1024)
        state, units, objects, nbytes, used, target = self.transport.call("mc_evict", shard, max_units)
        return EvictionStep(shard, state.decode(), int(units), int(objects), int(nbytes), int(used), int(target))

    def run_eviction(self, max_units_per_step: int = EVICT_STEP_UNITS) -> EvictionReport:
        """Evict now, in bounded steps, until every shard is at its target (or has nothing
        evictable left)."""
        units = objects = nbytes = steps = 0
        last: dict[int, EvictionStep] = {}
        todo = list(range(self.shards))
        while todo:
            for shard in todo:
                while True:
                    step = self.evict_step(shard, max_units_per_step)
                    steps += 1
                    units, objects, nbytes = units + step.units, objects + step.objects, nbytes + step.bytes
                    if step.state != "more":
                        last[shard] = step
                        break
            # with the radix index, unlinks to parents on other shards make them candidates: deliver
            # them, and go on on the shards that were blocked
            if not self.config.enable_radix_tree or self.drain_radix_outbox(todo) == 0:
                break
            todo = [s for s in range(self.shards) if last[s].state == "blocked"]
        return EvictionReport(units, objects, nbytes, steps, [last[s] for s in range(self.shards)])
