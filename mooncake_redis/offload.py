"""The SSD offload tier, master side (as Mooncake's MountLocalDiskSegment, ReportSsdCapacity,
OffloadObjectHeartbeat, NotifyOffloadSuccess): a client mounts its local disk on every shard,
pulls the tasks of its memory replicas (heartbeat), copies the bytes and reports disk replicas.

Each shard keeps each client's queue (lua/lib/45_offload.lua): HIGH (guaranteed), NORMAL (soft
pin or retained group), LOW (the rest), FIFO inside a priority, bounded by the shard's share of
`MasterConfig.offload_queue_limit`. A heartbeat asks the shards priority by priority, so a HIGH
task on any shard goes out before a NORMAL one on another, and hands out at most `max_tasks`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from . import wire
from .api import ApiBase
from .checks import _as_key, _check_bool, _check_int, _check_name, _check_tenant
from .errors import ErrorCode, MasterError
from .models import OffloadTask

PRIORITIES = ("high", "normal", "low")  # rank 0, 1, 2
MAX_TASKS = 1024  # the functions' cap per call
COUNTERS = ("enqueued", "done", "redelivered", "stale", "dropped_high", "dropped_normal", "dropped_low")


@dataclass(frozen=True)
class OffloadClientStats:
    """One client's offload state, summed over the shards."""
    client: str
    enabled: bool
    capacity_bytes: int
    queued: dict[str, int]  # priority -> entries queued (HIGH includes its overflow)
    overflow: int           # HIGH entries waiting in the overflow
    inflight: int           # tasks handed out and not yet acknowledged


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
        """Record the client's disk capacity (status shows it); each shard keeps the figure."""
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
            return self._tasks(t.call("mc_offload_heartbeat", 0, *wire.options(client_id=client_id, max_tasks=max_tasks)))
        tasks: list[OffloadTask] = []
        for rank in range(len(PRIORITIES)):
            active = list(range(t.count))
            while active and len(tasks) < max_tasks:
                left = max_tasks - len(tasks)
                asks = [(shard, left // len(active) + (1 if i < left % len(active) else 0))
                        for i, shard in enumerate(active)]
                waiting = [shard for shard, n in asks if n == 0]  # not asked this round: first in the next
                asks = [(shard, n) for shard, n in asks if n > 0]
                replies = t.run([t.command("mc_offload_heartbeat", shard,
                                           *wire.options(client_id=client_id, max_tasks=n, max_rank=rank))
                                 for shard, n in asks])
                active = waiting
                for (shard, n), reply in zip(asks, replies):
                    tasks += self._tasks(reply)
                    if len(reply) == n:  # the shard may have more of this priority
                        active.append(shard)
        return tasks

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
            rows = [(k,) for k in bkeys]
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

    # ---- inspection ------------------------------------------------------------------
    def offload_counters(self) -> dict[str, int]:
        """The offload counters summed over the shards (COUNTERS)."""
        fields = [f"offload_{c}" for c in COUNTERS]
        rows = self.transport.run([("HMGET", k.P, *fields) for k in self.transport.keys])
        return {c: sum(int(row[i] or 0) for row in rows) for i, c in enumerate(COUNTERS)}

    def offload_clients(self) -> list[OffloadClientStats]:
        """Every client with a local disk segment, with its queue depths per priority."""
        t = self.transport
        names = sorted({c for row in t.run([("ZRANGE", k.disks, 0, -1) for k in t.keys]) for c in row})
        out = []
        for name in names:
            commands = []
            for k in t.keys:
                queue, overflow = k.offload_queue(name), k.offload_overflow(name)
                commands += [("HMGET", k.disk(name), "enabled", "capacity_bytes", "inflight"), ("ZCARD", overflow)]
                commands += [("ZCOUNT", queue, rank * 2**44, f"({(rank + 1) * 2**44}") for rank in range(3)]
            r = t.run(commands)
            queued = dict.fromkeys(PRIORITIES, 0)
            overflow = inflight = capacity = 0
            enabled = False
            for s in range(t.count):
                row, over, *depths = r[5 * s:5 * s + 5]
                enabled |= row[0] == b"1"
                capacity = max(capacity, int(row[1] or 0))
                inflight += int(row[2] or 0)
                overflow += over
                for p, d in zip(PRIORITIES, depths):
                    queued[p] += d
            queued["high"] += overflow
            out.append(OffloadClientStats(name.decode(errors="replace"), enabled, capacity, queued, overflow, inflight))
        return out
