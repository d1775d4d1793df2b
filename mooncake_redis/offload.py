"""The SSD offload tier, master side (as Mooncake's MountLocalDiskSegment, ReportSsdCapacity,
OffloadObjectHeartbeat, NotifyOffloadSuccess): a client mounts its local disk on every shard,
pulls the tasks of its memory replicas (heartbeat), copies the bytes and reports disk replicas.

Each shard keeps each client's queue (lua/lib/45_offload.lua): HIGH (guaranteed), NORMAL (soft
pin or retained group), LOW (the rest), FIFO inside a priority, bounded by the shard's share of
`MasterConfig.offload_queue_limit`. A heartbeat asks the shards priority by priority, so a HIGH
task on any shard goes out before a NORMAL one on another, and hands out at most `max_tasks`.

Disk space: each shard keeps its share of the client's reported capacity and the bytes of the
client's live disk replicas there; a task is handed out only while it fits. When a live disk
replica goes, its file's removal is queued for the client (as Mooncake's RemoveObjectHeartbeat):
`remove_object_heartbeat` hands the removals out, `ack_remove_object_heartbeat` ends them."""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Sequence

from . import wire
from .api import ApiBase
from .checks import _as_key, _check_bool, _check_int, _check_name, _check_tenant
from .errors import ErrorCode, MasterError
from .figures import Figures, note
from .models import DiskRemoval, OffloadTask

PRIORITIES = ("high", "normal", "low")  # rank 0, 1, 2
MAX_TASKS = 1024  # the functions' cap per call
COUNTERS = ("enqueued", "done", "redelivered", "stale", "dropped_high", "dropped_normal", "dropped_low",
            "deferred", "orphaned", "evict_queued", "evict_refused")


@dataclass(frozen=True)
class OffloadClientStats:
    """One client's offload state, summed over the shards."""
    client: str
    enabled: bool
    capacity_bytes: int | None  # the sum of the shards' shares of its last report (None: never reported)
    queued: dict[str, int]  # priority -> entries queued (HIGH includes its overflow)
    overflow: int           # HIGH entries waiting in the overflow
    inflight: int           # tasks handed out and not yet acknowledged
    used_bytes: int = 0     # the sizes of its live disk replicas
    inflight_bytes: int = 0  # the sizes of its tasks in flight
    removals: int = 0       # files queued for removal (or handed out and not yet acknowledged)
    orphaned: int = 0       # removals that found the removal queue full (left to offload-gc)


class OffloadApi(ApiBase):
    def mount_local_disk_segment(self, client_id: str, enable_offloading: bool = True) -> None:
        """Mount the client's local disk on every shard (idempotent; mounting again switches
        offloading on or off)."""
        _check_name(client_id, "client_id")
        _check_bool(enable_offloading, "enable_offloading")
        self.transport.each("mc_mount_local_disk", *wire.options(client_id=client_id,
                                                                  enable_offloading=int(enable_offloading)))

    def unmount_local_disk_segment(self, client_id: str) -> int:
        """Unmount the client's local disk: its disk replicas die at once and are swept out of
        the object hashes (an object left with no replica is deleted: returned count)."""
        _check_name(client_id, "client_id")
        results = self.transport.each("mc_unmount_local_disk", *wire.options(client_id=client_id),
                                      raise_on_error=False)
        errors = [r for r in results if isinstance(r, MasterError)]
        if len(errors) == len(results):
            raise errors[0]
        return sum(self.sweep_shard(shard) for shard in range(self.shards))

    def report_ssd_capacity(self, client_id: str, capacity_bytes: int) -> None:
        """Record the client's disk capacity: each shard keeps its share (capacity / shards, the
        first capacity mod shards shards one byte more) and hands out tasks only while the
        client's disk replicas and tasks in flight there fit in it. Until a first report a disk
        has no bound."""
        _check_name(client_id, "client_id")
        _check_int(capacity_bytes, "capacity_bytes", 0)
        self.transport.each("mc_report_ssd_capacity", *wire.options(client_id=client_id, capacity_bytes=capacity_bytes))

    def offload_object_heartbeat(self, client_id: str, max_tasks: int = 256) -> list[OffloadTask]:
        """The client's next tasks, HIGH first, then NORMAL, then LOW, FIFO inside a priority (per
        shard; across shards a priority is served before the next). Each task protects its object
        from eviction until notify_offload_success/failure or offload_task_timeout."""
        _check_name(client_id, "client_id")
        _check_int(max_tasks, "max_tasks", 1, MAX_TASKS)
        t = self.transport
        if t.count == 1:
            return self._tasks(t.call("mc_offload_heartbeat", 0,
                                      *wire.options(client_id=client_id, max_tasks=max_tasks)))
        tasks: list[OffloadTask] = []
        for rank in range(len(PRIORITIES)):
            tasks += self._tasks(self._gather("mc_offload_heartbeat", "max_tasks", max_tasks - len(tasks),
                                              client_id=client_id, max_rank=rank))
        return tasks

    def _gather(self, fn: str, size_option: str, limit: int, **opts: Any) -> list:
        """Up to `limit` items of `fn` over the shards, in rounds: the items left are split over
        the shards still asked (the shards that get none this round come first in the next); a
        shard that replies fewer than it was asked is done. The shards are taken from a random
        start, so that calls asking fewer items than there are shards serve every shard."""
        t = self.transport
        start = random.randrange(t.count)
        active = [(start + i) % t.count for i in range(t.count)]
        out: list = []
        while active and len(out) < limit:
            left = limit - len(out)
            asks = [(shard, left // len(active) + (1 if i < left % len(active) else 0))
                    for i, shard in enumerate(active)]
            waiting = [shard for shard, n in asks if n == 0]
            asks = [(shard, n) for shard, n in asks if n > 0]
            replies = t.run([t.command(fn, shard, *wire.options(**opts, **{size_option: n})) for shard, n in asks])
            active = waiting
            for (shard, n), reply in zip(asks, replies):
                out += reply
                if len(reply) == n:  # the shard may have more
                    active.append(shard)
        return out

    @staticmethod
    def _tasks(reply: Any) -> list[OffloadTask]:
        return [OffloadTask(key=bytes(r[0]), tenant_id=r[1].decode(), size=int(r[2]), priority=r[3].decode(),
                            segment=r[4].decode(errors="replace"), offset=int(r[5]), attempt=int(r[6]))
                for r in reply]

    def _done(self, client_id: str, keys: Sequence[Any], locations: Sequence[str] | None, tenant_id: str,
              result: str) -> list[ErrorCode]:
        _check_name(client_id, "client_id")
        _check_tenant(tenant_id)
        bkeys = [_as_key(k) for k in keys]
        if locations is None:
            head = wire.head(wire.KEY, client_id=client_id, tenant=tenant_id, result=result)
            rows: list[tuple] = [(k,) for k in bkeys]
        else:
            if len(locations) != len(bkeys):
                raise MasterError(ErrorCode.INVALID_PARAMS, "keys and locations differ in length")
            for loc in locations:
                _check_name(loc, "location", 4096)
            head = wire.head(("key", "location"), client_id=client_id, tenant=tenant_id, result=result)
            rows = list(zip(bkeys, locations))
        return [ErrorCode(r) for r in self.transport.batch("mc_offload_done", head, rows, bkeys)]

    def notify_offload_success(self, client_id: str, keys: Sequence[Any], locations: Sequence[str],
                               tenant_id: str = "default") -> list[ErrorCode]:
        """Record each key's disk replica on the client's disk at `locations[i]` and end its task
        (idempotent: a repeat, or a success after the task timed out, records the same replica)."""
        return self._done(client_id, keys, locations, tenant_id, "success")

    def notify_offload_failure(self, client_id: str, keys: Sequence[Any],
                               tenant_id: str = "default") -> list[ErrorCode]:
        """End each key's task: HIGH is queued again; NORMAL and LOW until offload_max_attempts."""
        return self._done(client_id, keys, None, tenant_id, "failure")

    def redeliver_offload_tasks(self, shard: int | None = None, batch: int = 256) -> dict[str, int]:
        """End the tasks whose deadline passed (as failures: queued again or dropped), on one shard
        or all, in bounded calls. Returns {timed_out, requeued, dropped}."""
        _check_int(batch, "batch", 1, MAX_TASKS)
        out = {"timed_out": 0, "requeued": 0, "dropped": 0}
        for s in range(self.shards) if shard is None else [shard]:
            while True:
                timed_out, requeued, dropped = self.transport.call("mc_offload_sweep", s, batch)
                out["timed_out"] += timed_out
                out["requeued"] += requeued
                out["dropped"] += dropped
                if timed_out < batch:
                    break
        return out

    # ---- removal of disk files -------------------------------------------------------
    def remove_object_heartbeat(self, client_id: str, max_items: int = 256) -> list[DiskRemoval]:
        """Files the client is to remove from its disk (their disk replicas went), oldest first,
        at most `max_items`. Each is handed out again after offload_task_timeout until
        acknowledged; none is handed out while a live disk replica points at its location."""
        _check_name(client_id, "client_id")
        _check_int(max_items, "max_items", 1, MAX_TASKS)
        reply = self._gather("mc_disk_removal_heartbeat", "max_items", max_items, client_id=client_id)
        return [DiskRemoval(key=bytes(r[0]), tenant_id=r[1].decode(), location=r[2].decode(errors="surrogateescape"))
                for r in reply]

    def ack_remove_object_heartbeat(self, client_id: str, removals: Sequence[DiskRemoval]) -> list[ErrorCode]:
        """The removals are done: forget them. Per removal OK, or OBJECT_NOT_FOUND when the
        master no longer had it (acknowledged before, or dropped with an unmounted disk)."""
        return self._rows("mc_disk_removal_ack", client_id, removals)

    def disk_referenced(self, client_id: str, files: Sequence[DiskRemoval]) -> list[bool]:
        """Whether a live disk replica of the client points at each (key, tenant, location):
        the check of the agent's garbage collection (a file answered False is nobody's)."""
        return [bool(r) for r in self._rows("mc_disk_referenced", client_id, files, codes=False)]

    def _rows(self, fn: str, client_id: str, items: Sequence[DiskRemoval], codes: bool = True) -> list[Any]:
        _check_name(client_id, "client_id")
        by_tenant: dict[str, list[int]] = {}
        for i, item in enumerate(items):
            _check_tenant(item.tenant_id)
            _check_name(item.location, "location", 4096)
            by_tenant.setdefault(item.tenant_id, []).append(i)
        out: list[Any] = [None] * len(items)
        for tenant, idx in by_tenant.items():
            keys = [_as_key(items[i].key) for i in idx]
            head = wire.head(("key", "location"), client_id=client_id, tenant=tenant)
            rows = [(k, items[i].location.encode(errors="surrogateescape")) for k, i in zip(keys, idx)]
            for i, r in zip(idx, self.transport.batch(fn, head, rows, keys)):
                out[i] = ErrorCode(r) if codes else r
        return out

    # ---- inspection ------------------------------------------------------------------
    def offload_counters(self) -> dict[str, int]:
        """The offload counters summed over the shards (COUNTERS)."""
        fields = [f"offload_{c}" for c in COUNTERS]
        rows = self.transport.run([("HMGET", k.P, *fields) for k in self.transport.keys])
        out = dict.fromkeys(COUNTERS, 0)
        for shard, row in enumerate(rows):
            f = Figures("P.")  # a malformed counter reads as 0, with a warning
            for c, field, raw in zip(COUNTERS, fields, row):
                out[c] += f.get(field, raw)
            note(self.malformed_seen, shard, [f"P.{field}" for field in fields], f.malformed)
        return out

    def offload_clients(self) -> list[OffloadClientStats]:
        """Every client with a local disk segment, with its queue depths per priority (two
        round trips: the clients, then every client's figures on every shard in one pipeline)."""
        t = self.transport
        names = sorted({c for row in t.run([("ZRANGE", k.disks, 0, -1) for k in t.keys]) for c in row})
        commands: list[tuple] = []
        for name in names:
            for k in t.keys:
                queue, overflow = k.offload_queue(name), k.offload_overflow(name)
                commands += [("HMGET", k.disk(name), "enabled", "capacity_bytes", "inflight", "used_bytes",
                              "inflight_bytes", "orphaned"), ("ZCARD", overflow), ("ZCARD", k.disk_removals(name))]
                commands += [("ZCOUNT", queue, rank * 2**44, f"({(rank + 1) * 2**44}") for rank in range(3)]
        replies = t.run(commands) if commands else []
        per_client = 6 * t.count
        out = []
        for i, name in enumerate(names):
            r = replies[i * per_client:(i + 1) * per_client]
            queued = dict.fromkeys(PRIORITIES, 0)
            n = dict.fromkeys(("overflow", "inflight", "used", "inflight_bytes", "removals", "orphaned"), 0)
            capacity: int | None = None
            enabled = False
            for s in range(t.count):
                row, over, removals, *depths = r[6 * s:6 * s + 6]
                enabled |= row[0] == b"1"
                fig = Figures(f"P:disk:{name.decode(errors='replace')}.")  # malformed: 0, with a warning
                if row[1] is not None:
                    capacity = (capacity or 0) + fig.get("capacity_bytes", row[1])
                for f, field, v in zip(("inflight", "used", "inflight_bytes", "orphaned"),
                                       ("inflight", "used_bytes", "inflight_bytes", "orphaned"), row[2:]):
                    n[f] += fig.get(field, v)
                note(self.malformed_seen, s, [fig.where + x for x in ("capacity_bytes", "inflight", "used_bytes",
                                                                     "inflight_bytes", "orphaned")], fig.malformed)
                n["overflow"] += over
                n["removals"] += removals
                for p, d in zip(PRIORITIES, depths):
                    queued[p] += d
            queued["high"] += n["overflow"]
            out.append(OffloadClientStats(name.decode(errors="replace"), enabled, capacity, queued, n["overflow"],
                                          n["inflight"], n["used"], n["inflight_bytes"], n["removals"], n["orphaned"]))
        return out
