"""Prometheus metrics of a store, read from Redis at each scrape (prometheus-client).

The numbers are the store's own, not a process's: every exporter of one store (serve, any
worker, `mooncake-redis metrics`) reports the same values, so scrape one of them, or aggregate
several with max(), not sum(). Only what the store keeps is exported: the shard counters and
index sizes (one pipelined read of O(1) commands per shard), and the workers' `*_total`
counters of `<P>:metrics` (published by any worker after a pass that did work, else every 5 s), and the SSD offload tier
(each client's disk and queues, and the offload counters, as `mooncake-redis status` reads
them). A worker process adds its own pass durations (`mooncake_worker_pass_duration_seconds`).
The names and labels are listed in METRICS and in docs/operations.md (Metrics).
"""
from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Iterator

import redis
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from .errors import MasterError
from .worker import _TOTALS

if TYPE_CHECKING:
    from .master import Master
    from .worker import Worker

log = logging.getLogger(__name__)

PREFIX = "mooncake_"

# per-shard gauges: name -> (help, the ShardStats attribute it shows)
SHARD_GAUGES = {
    "capacity_bytes": ("Bytes of the shard's slices of all mounted segments.", "capacity_bytes"),
    "used_bytes": ("Bytes allocated on the shard (complete objects, puts in progress, held extents).", "used_bytes"),
    "objects": ("Objects on the shard (complete and in progress).", "objects"),
    "puts_in_progress": ("Puts started and not yet ended or revoked.", "puts_in_progress"),
    "held_extents": ("Extents of preempted or discarded puts, held until their release time.", "held_extents"),
    "clients": ("Clients known to the shard (mounted, not expired).", "clients"),
    "segments": ("Segments mounted on the shard.", "segments"),
    "groups_draining": ("Groups whose eviction is under way.", "groups_draining"),
    "guaranteed_bytes": ("Bytes of live replicas of guaranteed objects (explicit context caching).",
                         "guaranteed_bytes"),
    "guaranteed_objects": ("Objects with a guarantee not yet swept (P:guaranteed).", "guaranteed_objects"),
}

# group retention, per shard (mc_retention_usage, as `mooncake-redis status` shows it):
# name -> (help, the ShardRetention attribute it shows)
RETENTION_GAUGES = {
    "retained_groups": ("Groups whose retention is active (retained_until ahead of the store clock).", "active"),
    "retention_records": ("Retention records holding an admission slot (active, or expired and not yet swept).",
                          "held"),
    "retained_groups_limit": ("The shard's share of max_retained_groups.", "share"),
}

# the SSD offload tier, per client with a local disk (label client), summed over the shards as
# `mooncake-redis status` shows them (OffloadApi.offload_clients): name -> (help, attribute)
DISK_GAUGES = {
    "disk_enabled": ("1 if offloading to the client's disk is on.", "enabled"),
    "disk_capacity_bytes": ("The client's last reported SSD capacity (absent until it reports).", "capacity_bytes"),
    "disk_used_bytes": ("Bytes of the client's live disk replicas.", "used_bytes"),
    "disk_inflight_bytes": ("Bytes of the offload tasks handed to the client and not yet acknowledged.",
                            "inflight_bytes"),
    "offload_inflight_tasks": ("Offload tasks handed to the client and not yet acknowledged.", "inflight"),
    "disk_removals_pending": ("Files of the client's disk queued for removal, or handed out and not yet "
                              "acknowledged.", "removals"),
}

METRICS = (
    ["mooncake_up"]
    + [f"{PREFIX}shard_{name}" for name in SHARD_GAUGES]
    + [f"{PREFIX}shard_{name}" for name in RETENTION_GAUGES] + [f"{PREFIX}shard_retained_group_members"]
    + [f"{PREFIX}shard_eviction_candidates", f"{PREFIX}shard_clock_frozen",
       f"{PREFIX}shard_last_worker_pass_timestamp_seconds", f"{PREFIX}worker_passes_total"]
    + [f"{PREFIX}{field}" for field in _TOTALS]
    + [f"{PREFIX}shard_malformed_figures"]
    + [f"{PREFIX}{name}" for name in DISK_GAUGES]
    + [f"{PREFIX}offload_queued_tasks", f"{PREFIX}disk_orphaned_removals_total", f"{PREFIX}offload_events_total"]
)


class StoreCollector(Collector):
    """A prometheus-client collector for one store (a Master's Redis and namespace)."""

    def __init__(self, master: "Master", worker: "Worker | None" = None):
        self.master = master
        self.worker = worker  # its pass durations are exported too

    def describe(self):
        return []  # no registration-time scrape of Redis

    def collect(self) -> Iterator:
        up = GaugeMetricFamily(f"{PREFIX}up", "1 if the last scrape read the store from Redis, else 0.")
        try:
            families = self._read()
        except (MasterError, redis.RedisError) as exc:
            log.warning("metrics: cannot read the store: %s", exc)
            up.add_metric([], 0)
            yield up
        except Exception:  # a scrape answers, whatever the store holds: no HTTP 500
            log.exception("metrics: cannot make sense of the store's figures")
            up.add_metric([], 0)
            yield up
        else:
            up.add_metric([], 1)
            yield up
            yield from families
        if self.worker is not None:
            yield from self._worker_families(self.worker)

    def _read(self) -> list:
        gauges = {name: GaugeMetricFamily(f"{PREFIX}shard_{name}", text, labels=["shard"])
                  for name, (text, _) in SHARD_GAUGES.items()}
        candidates = GaugeMetricFamily(f"{PREFIX}shard_eviction_candidates",
                                       "Eviction units in a candidate tier (in eviction order: ordinary, "
                                       "soft_pinned, retained, soft_pinned_retained).", labels=["shard", "tier"])
        frozen = GaugeMetricFamily(f"{PREFIX}shard_clock_frozen",
                                   "1 if the shard's clock test hook is set (never in production).", labels=["shard"])
        last_pass = GaugeMetricFamily(f"{PREFIX}shard_last_worker_pass_timestamp_seconds",
                                      "Store-clock time of the last worker pass over the shard.", labels=["shard"])
        passes = CounterMetricFamily(f"{PREFIX}worker_passes", "Worker passes over the shard, by all workers.",
                                     labels=["shard"])
        totals = {field: CounterMetricFamily(f"{PREFIX}{field.removesuffix('_total')}",
                                             f"Sum over all workers' passes: {attr.replace('_', ' ')}.",
                                             labels=["shard"])
                  for field, attr in _TOTALS.items()}
        malformed = GaugeMetricFamily(f"{PREFIX}shard_malformed_figures",
                                      "Figures of the shard stored malformed (not integers: P and P:metrics "
                                      "fields, the clock hook); their own series are left out. Run fsck.",
                                      labels=["shard"])
        for stats in self.master.shard_stats():
            label = [str(stats.shard)]
            malformed.add_metric(label, len(stats.malformed))
            for name, (_, attr) in SHARD_GAUGES.items():
                if f"P.{attr}" not in stats.malformed:  # a figure read as 0 is not exported as one
                    gauges[name].add_metric(label, getattr(stats, attr))
            for tier, n in stats.candidates.items():
                candidates.add_metric([str(stats.shard), tier], n)
            frozen.add_metric(label, int(stats.clock_ms is not None))
            m = {k: int(v) for k, v in stats.worker_figures.items() if v.lstrip("-").isdigit()}
            if "last_pass_ms" in m:
                last_pass.add_metric(label, m["last_pass_ms"] / 1000)
            if "P:metrics.passes_total" not in stats.malformed:
                passes.add_metric(label, m.get("passes_total", 0))
            for field, family in totals.items():
                if f"P:metrics.{field}" not in stats.malformed:
                    family.add_metric(label, m.get(field, 0))
        return [*gauges.values(), *self._retention(), candidates, frozen, last_pass, passes, *totals.values(),
                malformed, *self._offload()]

    def _retention(self) -> list:
        gauges = {name: GaugeMetricFamily(f"{PREFIX}shard_{name}", text, labels=["shard"])
                  for name, (text, _) in RETENTION_GAUGES.items()}
        for row in self.master.retention_usage():
            for name, (_, attr) in RETENTION_GAUGES.items():
                gauges[name].add_metric([str(row.shard)], getattr(row, attr))
        members = GaugeMetricFamily(f"{PREFIX}shard_retained_group_members",
                                    "Members of the groups whose retention is active (radix-indexed ones too).",
                                    labels=["shard"])
        for shard, n in enumerate(self.master.retention_members()):
            members.add_metric([str(shard)], n)
        return [*gauges.values(), members]

    def _offload(self) -> list:
        """The offload tier: each client's disk and queues, and the store's offload counters."""
        gauges = {name: GaugeMetricFamily(f"{PREFIX}{name}", text, labels=["client"])
                  for name, (text, _) in DISK_GAUGES.items()}
        queued = GaugeMetricFamily(f"{PREFIX}offload_queued_tasks",
                                   "Offload tasks queued for the client's disk (HIGH includes its overflow).",
                                   labels=["client", "priority"])
        orphaned = CounterMetricFamily(f"{PREFIX}disk_orphaned_removals",
                                       "Removals of the client's files that found its removal queue full "
                                       "(left to offload-gc).", labels=["client"])
        for c in self.master.offload_clients():
            for name, (_, attr) in DISK_GAUGES.items():
                value = getattr(c, attr)
                if value is not None:
                    gauges[name].add_metric([c.client], int(value))
            for priority, depth in c.queued.items():
                queued.add_metric([c.client, priority], depth)
            orphaned.add_metric([c.client], c.orphaned)
        events = CounterMetricFamily(f"{PREFIX}offload_events",
                                     "The store's offload counters, by event (OffloadApi.offload_counters).",
                                     labels=["event"])
        for event, n in self.master.offload_counters().items():
            events.add_metric([event], n)
        return [*gauges.values(), queued, orphaned, events]

    def _worker_families(self, w: "Worker") -> Iterator:
        summary = SummaryMetricFamily(f"{PREFIX}worker_pass_duration_seconds",
                                      "Duration of this worker process's passes.", labels=["worker"])
        summary.add_metric([w.worker_id], count_value=w.pass_count, sum_value=w.pass_seconds_total)
        yield summary


def registry_for(master: "Master", worker: "Worker | None" = None) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(master, worker))
    return registry


def metric_families(master: "Master", worker: "Worker | None" = None) -> list[dict]:
    """The metrics as plain data (`mooncake-redis metrics --json`): per family `name`, `type`,
    `help` and `samples` (`name`, `labels`, `value`: an integer when whole, null when not finite)."""
    out = []
    for family in registry_for(master, worker).collect():
        samples = [{"name": s.name, "labels": dict(s.labels), "value": _number(s.value)} for s in family.samples]
        out.append({"name": family.name, "type": family.type, "help": family.documentation, "samples": samples})
    return out


def _number(value: float) -> int | float | None:
    if not math.isfinite(value):
        return None
    return int(value) if float(value).is_integer() else value


def exposition(master: "Master", worker: "Worker | None" = None) -> str:
    """The metrics in Prometheus's text exposition format."""
    from prometheus_client import generate_latest

    return generate_latest(registry_for(master, worker)).decode()


def serve_metrics(master: "Master", port: int, addr: str = "127.0.0.1", worker: "Worker | None" = None):
    """Serve /metrics on addr:port from a background thread; returns the HTTP server (call
    .shutdown() to stop it)."""
    from prometheus_client import start_http_server

    server, _thread = start_http_server(port, addr=addr, registry=registry_for(master, worker))
    return server
