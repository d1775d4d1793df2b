"""Mooncake's task queue: CreateCopyTask / CreateMoveTask ask the client that owns a replica's
segment to copy or move it (mooncake_redis.replication has the three steps it then runs);
FetchTasks hands a client its pending tasks, MarkTaskToComplete ends one, QueryTask reads one
(lua/ops/task_queue.lua has the rules). A task lives on its key's shard; its id (32 hex digits)
ends with that shard's number, so a query by id alone finds it. Delivery is at least once: a task
handed out and not completed within 5 minutes is handed out again, up to 10 times."""
from __future__ import annotations

import secrets
from typing import Any, NamedTuple

from . import wire
from .api import ApiBase
from .checks import _as_key, _check_int, _check_name, _check_tenant
from .errors import ErrorCode, MasterError

SHARD_DIGITS = 4  # the last hex digits of a task id: its shard (at most 16384 shards)


class Task(NamedTuple):
    """A task handed out by fetch_tasks."""
    id: str
    type: str            # "copy" or "move"
    tenant: str
    key: bytes
    source: str          # the segment of the replica to copy or move
    targets: list[str]
    created_ms: int
    attempts: int        # hand-outs so far, this one included


class TaskInfo(NamedTuple):
    id: str
    type: str
    status: str          # pending, processing, success, failed
    created_ms: int
    updated_ms: int
    client: str          # the client the task is assigned to
    message: str
    attempts: int


def _text(b: bytes) -> str:
    return b.decode(errors="backslashreplace")


class TaskQueueApi(ApiBase):
    def create_copy_task(self, key: Any, targets: list[str], tenant_id: str = "default") -> str:
        """Queue a copy of `key` onto `targets` for the owner of its first live replica's segment;
        returns the task id. Raises OBJECT_NOT_FOUND, INVALID_PARAMS (a target not mounted),
        UNAVAILABLE_IN_CURRENT_STATUS (a target being unmounted), TASK_PENDING_LIMIT_EXCEEDED."""
        return self._create(key, "copy", None, targets, tenant_id)

    def create_move_task(self, key: Any, source: str, target: str, tenant_id: str = "default") -> str:
        """Queue a move of `key`'s replica on `source` to `target` for the owner of `source`."""
        _check_name(source, "source", 1024)
        return self._create(key, "move", source, [target], tenant_id)

    def fetch_tasks(self, client_id: str, max_tasks: int = 16) -> list[Task]:
        """Hand out up to `max_tasks` of the client's pending tasks of each shard (they are
        processing from now on: complete_task ends them, or they are handed out again)."""
        _check_name(client_id, "client_id")
        _check_int(max_tasks, "max_tasks", 1, 64)
        args = wire.options(client_id=client_id, max=max_tasks)
        replies = self.transport.run([self.transport.command("mc_task_fetch", s, *args) for s in range(self.shards)])
        return [Task(_text(t[0]), _text(t[1]), _text(t[2]), t[3], _text(t[4]), [_text(x) for x in t[7:]],
                     int(t[5]), int(t[6])) for reply in replies for t in reply]

    def complete_task(self, client_id: str, task_id: str, success: bool, message: str = "") -> None:
        """End a task handed to `client_id` (a second call is OK). Raises TASK_NOT_FOUND or
        ILLEGAL_CLIENT."""
        _check_name(client_id, "client_id")
        args = wire.options(client_id=client_id, id=task_id, status="success" if success else "failed",
                            message=message or None)
        code = self.transport.call("mc_task_complete", self._task_shard(task_id), *args)
        if code != ErrorCode.OK:
            raise MasterError(ErrorCode(code), f"complete_task {task_id}")

    def query_task(self, task_id: str) -> TaskInfo:
        reply = self.transport.call("mc_task_query", self._task_shard(task_id), *wire.options(id=task_id))
        if isinstance(reply, int):
            raise MasterError(ErrorCode(reply), f"query_task {task_id}")
        t, status, created, updated, client, message, attempts = reply
        return TaskInfo(task_id, _text(t), _text(status), int(created), int(updated), _text(client),
                        _text(message), int(attempts))

    def _create(self, key: Any, kind: str, source: str | None, targets: list[str], tenant_id: str) -> str:
        _check_tenant(tenant_id)
        for t in targets:
            _check_name(t, "target", 1024)
        bkey = _as_key(key)
        shard = self.transport.shard_of(bkey)
        task_id = secrets.token_hex(16 - SHARD_DIGITS // 2) + f"{shard:0{SHARD_DIGITS}x}"
        head = wire.head(wire.KEY, id=task_id, type=kind, tenant=tenant_id, source=source, target=targets)
        reply = self.transport.call("mc_task_create", shard, *head, bkey)[0]
        if reply[0] != ErrorCode.OK:
            raise MasterError(ErrorCode(reply[0]), f"create_{kind}_task {key!r}")
        return task_id

    def _task_shard(self, task_id: str) -> int:
        if not isinstance(task_id, str) or len(task_id) != 32 or any(c not in "0123456789abcdef" for c in task_id):
            raise MasterError(ErrorCode.TASK_NOT_FOUND, f"not a task id: {task_id!r}")
        shard = int(task_id[-SHARD_DIGITS:], 16)
        if shard >= self.shards:
            raise MasterError(ErrorCode.TASK_NOT_FOUND, f"not a task id of this store: {task_id}")
        return shard
