"""Mooncake's task queue (lua/ops/task_queue.lua): task records P:task:<id> and their indexes.
Per shard:

- a task record whose indexes do not hold it as its status needs (task_unindexed): a pending
  task in its client's queue P:taskq:<client> and in P:tasks_due (else it is never handed out,
  or never times out), a processing one in P:tasks_due, a finished one in P:tasks_done (else it
  is never dropped past the bound). Not repaired: the record says what it is, not how long it
  has waited; the task's client can create it again.
- a member of a client's queue with no pending record (task_queue_stale): task_fetch would hand
  out a task that is not there and count P.tasks_pending down for it. Not repaired.
- P.tasks_pending, which bounds the pending tasks of the shard, against the pending records
  (shard_tasks_pending), repaired by mc_fsck_counters (compare-and-add).
Members of P:tasks_due and P:tasks_done without a record are no finding: the sweep drops them."""
from __future__ import annotations

from typing import Any

from .base import ERROR, Checker, Finding, Kind, _d, _Pass
from .counters import Counters

INDEXES_OF = {b"pending": ("queue", "due"), b"processing": ("due",), b"success": ("done",), b"failed": ("done",)}


KINDS: dict[str, Kind] = {
    "task_unindexed": Kind(ERROR, False, "a task record missing from an index its status needs (its client's queue, "
                                         "P:tasks_due or P:tasks_done): never handed out, timed out or dropped"),
    "task_queue_stale": Kind(ERROR, False, "a member of a client's task queue with no pending task record: a fetch "
                                           "would hand out a task that is not there"),
    "shard_tasks_pending": Kind(ERROR, True, "P.tasks_pending differs from the shard's pending task records"),
}


def task_findings(audit: Any, shard: int) -> list[Finding]:
    k = audit.keys(shard)
    prefix, qprefix = k.task(b""), k.task_queue(b"")
    ids = sorted(key[len(prefix):] for key in audit.scan(shard, prefix + b"*"))
    pipe = audit.t.pipeline(shard)
    for i in ids:
        pipe.hmget(k.task(i), "status", "client")
    records = {i: (status, client) for i, (status, client) in zip(ids, pipe.execute() if ids else [])
               if status is not None}
    queues = {key[len(qprefix):]: set(audit.zall(key)) for key in audit.scan(shard, qprefix + b"*")}
    pipe = audit.t.pipeline(shard)
    pipe.zrange(k.tasks_due, 0, -1)
    pipe.zrange(k.tasks_done, 0, -1)
    pipe.hget(k.P, "tasks_pending")
    due, done, counter = pipe.execute()
    due, done, counted = set(due), set(done), int(counter or 0)
    out: list[Finding] = []
    for i, (status, client) in sorted(records.items()):
        held = {"queue": i in queues.get(client or b"", set()), "due": i in due, "done": i in done}
        missing = [name for name in INDEXES_OF.get(status, ()) if not held[name]]
        if missing:
            where = {"queue": f"P:taskq:{_d(client or b'')}", "due": "P:tasks_due", "done": "P:tasks_done"}
            out.append(audit.finding("task_unindexed", shard, f"task {_d(i)} ({_d(status)})",
                                     "in " + ", ".join(where[m] for m in missing), "absent"))
    for client, members in sorted(queues.items()):
        for i in sorted(members):
            if records.get(i, (None, None)) != (b"pending", client):
                found = _d(records[i][0]) if i in records else "no record"
                out.append(audit.finding("task_queue_stale", shard, f"P:taskq:{_d(client)} member {_d(i)}",
                                         "a pending task of that client", found))
    pending = sum(1 for status, _ in records.values() if status == b"pending")
    if pending != counted:
        out.append(audit.finding("shard_tasks_pending", shard, "P.tasks_pending", pending, counted,
                                 Counters(shard, (("tasks_pending", counted, pending - counted),))))
    return out


class Tasks(Checker):
    name = "tasks"
    kinds = KINDS
    actions = (Counters,)

    def shard(self, audit: Any, shard: int, ps: _Pass) -> list[Finding]:
        return task_findings(audit, shard)
