"""Maintenance: the shards' usage counters and eviction (evict_step, run_eviction). The
background loops that drive these steps are mooncake_redis.worker's."""
from __future__ import annotations

import math

from .api import ApiBase
from .checks import _check_int
from .figures import Figures, note, parse
from .keys import CLOCK_FIELD, TIERS
from .models import EvictionReport, EvictionStep, ShardStats, ShardUsage, Usage

EVICT_STEP_UNITS = 16  # units per eviction step (about 25-40 us of server time each)
USAGE_FIELDS = ("used_bytes", "capacity_bytes", "objects", "guaranteed_bytes")
WORKER_TEXT_FIELDS = frozenset({"last_worker"})  # the P:metrics fields that are not figures (as fsck's)


class MaintenanceApi(ApiBase):
    # ---- inspection ------------------------------------------------------------------
    def usage(self) -> Usage:
        """The shard counters (a malformed one reads as 0, with a logged warning: see
        mooncake_redis.figures; shard_stats() lists them)."""
        rows = self.transport.run([("HMGET", k.P, *USAGE_FIELDS) for k in self.transport.keys])
        ratio = self.config.guaranteed_capacity_ratio
        per = []
        for i, row in enumerate(rows):
            f = Figures("P.")
            used, cap, objects, guaranteed = (f.get(name, v) for name, v in zip(USAGE_FIELDS, row))
            note(self.malformed_seen, i, [f"P.{name}" for name in USAGE_FIELDS], f.malformed)
            per.append(ShardUsage(i, used, cap, objects, guaranteed, math.floor(cap * ratio)))
        return Usage(sum(s.used_bytes for s in per), sum(s.capacity_bytes for s in per),
                     sum(s.objects for s in per), per, sum(s.guaranteed_bytes for s in per),
                     sum(s.guaranteed_limit_bytes for s in per))

    def shard_stats(self) -> list[ShardStats]:
        """Every shard's figures in one round trip (a pipeline; on a cluster, per node). A
        malformed figure (a field of P, or of the workers' P:metrics, that is not an integer:
        mooncake_redis.figures) reads as 0, is listed in ShardStats.malformed and left out of
        worker_figures, and is logged once as a warning."""
        per_shard = []
        for k in self.transport.keys:
            per_shard += [("HGETALL", k.P),
                          *(("ZCARD", key) for key in (k.processing, k.held, k.clients, k.segments, k.draining,
                                                      k.guaranteed, *k.tiers)),
                          ("HGET", k.config, CLOCK_FIELD), ("GET", k.worker), ("HGETALL", k.metrics)]
        replies = self.transport.run(per_shard)
        width = len(per_shard) // len(self.transport.keys)
        out = []
        for shard in range(len(self.transport.keys)):
            row = replies[shard * width:(shard + 1) * width]
            counters, zcards, (clock, claim, figures) = row[0], row[1:-3], row[-3:]
            f = Figures("P.")
            for name, raw in counters.items():  # every field of P is a figure
                f.get(name.decode(errors="replace"), raw)
            capacity, used, objects, guaranteed = (f.get(name, counters.get(name.encode()))
                                                   for name in ("capacity_bytes", "used_bytes", "objects",
                                                                "guaranteed_bytes"))
            w = Figures("P:metrics.")
            worker_figures = {}
            for name_b, raw in figures.items():
                name = name_b.decode(errors="replace")
                if name in WORKER_TEXT_FIELDS or parse(raw) is not None:
                    worker_figures[name] = raw.decode(errors="replace")
                else:
                    w.get(name, raw)
            c = Figures()
            clock_ms = c.get("P:config.clock", clock) if clock is not None else None  # the hook set: frozen
            malformed = {**f.malformed, **w.malformed, **c.malformed}
            note(self.malformed_seen, shard, "P.", f.malformed)
            note(self.malformed_seen, shard, "P:metrics.", w.malformed)
            note(self.malformed_seen, shard, ["P:config.clock"], c.malformed)
            busy, held, clients, segments, draining, guaranteed_objects = zcards[:6]
            out.append(ShardStats(shard, capacity, used, objects, guaranteed, busy, held, clients, segments, draining,
                                  guaranteed_objects,
                                  candidates={name: n for (name, _), n in zip(TIERS, zcards[6:])},
                                  clock_ms=clock_ms, claim=claim,
                                  worker_figures=worker_figures, malformed=malformed))
        return out

    # ---- eviction --------------------------------------------------------------------
    def evict_step(self, shard: int, max_units: int = EVICT_STEP_UNITS) -> EvictionStep:
        _check_int(shard, "shard", 0, self.shards - 1)
        _check_int(max_units, "max_units", 1, 1024)
        state, units, objects, nbytes, used, target, queued = self.transport.call("mc_evict", shard, max_units)
        return EvictionStep(shard, state.decode(), int(units), int(objects), int(nbytes), int(used), int(target),
                            int(queued))

    def run_eviction(self, max_units_per_step: int = EVICT_STEP_UNITS) -> EvictionReport:
        """Evict now, in bounded steps, until every shard is at its target (or has nothing
        evictable left)."""
        units = objects = nbytes = steps = queued = 0
        last: dict[int, EvictionStep] = {}
        todo = list(range(self.shards))
        while todo:
            for shard in todo:
                while True:
                    step = self.evict_step(shard, max_units_per_step)
                    steps += 1
                    units, objects, nbytes = units + step.units, objects + step.objects, nbytes + step.bytes
                    queued += step.queued
                    if step.state != "more":
                        last[shard] = step
                        break
            # with the radix index, unlinks to parents on other shards make them candidates: deliver
            # them, and go on on the shards that were blocked
            if not self.config.enable_radix_tree or self.drain_radix_outbox(todo) == 0:
                break
            todo = [s for s in range(self.shards) if last[s].state == "blocked"]
        return EvictionReport(units, objects, nbytes, steps, [last[s] for s in range(self.shards)], queued)
