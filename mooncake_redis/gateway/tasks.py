"""The task RPCs of Mooncake's master: CreateCopyTask, CreateMoveTask, FetchTasks,
MarkTaskToComplete and QueryTask over the store's task queue (mooncake_redis.task_queue), and
the replication steps the client runs for a task, CopyStart/End/Revoke and MoveStart/End/Revoke
(mooncake_redis.replication). Task ids are the store's (32 hex digits) as Mooncake UUIDs;
segment names are the store's, which are Mooncake's for a client's first segment."""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Sequence

from ..errors import ErrorCode, MasterError
from ..models import Replica
from ..steps import Steps
from . import schema
from .codec import Err
from .queries import _text, uuid_client, uuid_text

if TYPE_CHECKING:
    from ..master import Master

PROCESSING, COMPLETE = 2, 3  # Mooncake's ReplicaStatus
TASK_TYPES = {"copy": schema.TaskType.REPLICA_COPY, "move": schema.TaskType.REPLICA_MOVE}
TASK_STATUSES = {"pending": schema.TaskStatus.PENDING, "processing": schema.TaskStatus.PROCESSING,
                 "failed": schema.TaskStatus.FAILED, "success": schema.TaskStatus.SUCCESS}
MAX_RETRY_ATTEMPTS = 10  # TaskAssignment.max_retry_attempts: the client's retries of a failed allocation
MAX_FETCH = 64           # tasks a FetchTasks hands out per shard


def task_uuid(task_id: str) -> tuple[int, int]:
    return int(task_id[:16], 16), int(task_id[16:], 16)


def task_id_of(pair: Sequence[int]) -> str:
    return f"{pair[0]:016x}{pair[1]:016x}"


def payload(task: Any) -> bytes:
    """The task's payload as Mooncake's client parses it (struct_json of ReplicaCopyPayload or
    ReplicaMovePayload)."""
    common = {"tenant_id": task.tenant, "key": _text(task.key), "source": task.source}
    if task.type == "copy":
        body = {**common, "targets": task.targets, "dynamic_replication_lease_id_high": 0,
                "dynamic_replication_lease_id_low": 0, "dynamic_replication_version_epoch": 0}
    else:
        body = {**common, "target": task.targets[0]}
    return json.dumps(body, separators=(",", ":")).encode()


class TaskHandlers:
    master: "Master"
    if TYPE_CHECKING:
        def descriptors_steps(self, replica_lists: list[list[Replica]], status: int) -> Steps[list[Any]]: ...

    # ---- the task queue --------------------------------------------------------------------
    def CreateCopyTask(self, key: bytes, tenant: bytes, targets: Sequence[bytes]) -> Any:
        return task_uuid(self.master.create_copy_task(key, [_text(t) for t in targets], _text(tenant) or "default"))

    def CreateMoveTask(self, key: bytes, tenant: bytes, source: bytes, target: bytes) -> Any:
        return task_uuid(self.master.create_move_task(key, _text(source), _text(target), _text(tenant) or "default"))

    def FetchTasks(self, client: Sequence[int], batch_size: int) -> list:
        tasks = self.master.fetch_tasks(uuid_text(client), max(1, min(int(batch_size), MAX_FETCH)))
        return [schema.TaskAssignment(id=task_uuid(t.id), type=TASK_TYPES[t.type], payload=payload(t),
                                      created_at_ms_epoch=t.created_ms, max_retry_attempts=MAX_RETRY_ATTEMPTS)
                for t in tasks]

    def MarkTaskToComplete(self, client: Sequence[int], request: Any) -> Any:
        if request.status not in (schema.TaskStatus.SUCCESS, schema.TaskStatus.FAILED):
            return Err(int(ErrorCode.INVALID_PARAMS))
        self.master.complete_task(uuid_text(client), task_id_of(request.id),
                                  request.status == schema.TaskStatus.SUCCESS, _text(request.message))
        return None

    def QueryTask(self, task: Sequence[int]) -> Any:
        info = self.master.query_task(task_id_of(task))
        client = uuid_client(info.client)
        return schema.QueryTaskResponse(id=tuple(task), type=TASK_TYPES[info.type], status=TASK_STATUSES[info.status],
                                        created_at_ms_epoch=info.created_ms, last_updated_at_ms_epoch=info.updated_ms,
                                        assigned_client=client, message=info.message.encode())

    # ---- the replication steps -------------------------------------------------------------
    def _described(self, replicas: list[Replica], status: int) -> list[Any]:
        (described,) = self.master.drive(self.descriptors_steps([replicas], status))
        if isinstance(described, Err):
            raise MasterError(ErrorCode(described.code), "a replica outside its segment")
        return described

    def CopyStart(self, client: Sequence[int], key: bytes, tenant: bytes, source: bytes,
                  targets: Sequence[bytes]) -> Any:
        started = self.master.replica_copy_start(uuid_text(client), key, _text(source), [_text(t) for t in targets],
                                                 _text(tenant) or "default")
        return schema.CopyStartResponse(source=self._described([started.source], COMPLETE)[0],
                                        targets=self._described(started.targets, PROCESSING))

    def MoveStart(self, client: Sequence[int], key: bytes, tenant: bytes, source: bytes, target: bytes) -> Any:
        started = self.master.replica_move_start(uuid_text(client), key, _text(source), _text(target),
                                                 _text(tenant) or "default")
        targets = self._described(started.targets, PROCESSING)
        return schema.MoveStartResponse(source=self._described([started.source], COMPLETE)[0],
                                        target=targets[0] if targets else None)

    def _step(self, step: Any, client: Sequence[int], key: bytes, kind: str, tenant: bytes) -> None:
        step(uuid_text(client), key, kind, _text(tenant) or "default")

    def CopyEnd(self, client: Sequence[int], key: bytes, tenant: bytes) -> None:
        self._step(self.master.replica_end, client, key, "copy", tenant)

    def CopyRevoke(self, client: Sequence[int], key: bytes, tenant: bytes) -> None:
        self._step(self.master.replica_revoke, client, key, "copy", tenant)

    def MoveEnd(self, client: Sequence[int], key: bytes, tenant: bytes) -> None:
        self._step(self.master.replica_end, client, key, "move", tenant)

    def MoveRevoke(self, client: Sequence[int], key: bytes, tenant: bytes) -> None:
        self._step(self.master.replica_revoke, client, key, "move", tenant)
