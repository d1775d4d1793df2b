"""Upsert (Mooncake's UpsertStart / UpsertEnd / UpsertRevoke): insert an object, or replace the
bytes of one that exists. mc_upsert_start (lua/ops/upsert.lua) either turns an object of the same
size back into a put in progress at the same addresses (in place), or leaves no object behind
(none was there, or the old one went, its extents held while its lease runs) and names what the
new one inherits; put_start then allocates it with the old object's hard pin and group and what
was left of its soft pin and guarantee. upsert_end and upsert_revoke are put_end and put_revoke.

Readers never see a half-written object: while a put is in progress the object answers
REPLICA_IS_NOT_READY, between the two steps it is absent, and an object that was leased is never
rewritten in place (its readers keep reading the old bytes until their lease ends)."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Sequence

from . import wire
from .api import ApiBase
from .checks import _as_key, _as_keys
from .config import ReplicateConfig, SoftPinAction
from .errors import ErrorCode, MasterError
from .models import Replica, ReplicaStatus
from .steps import Steps

Result = Any  # a list of Replica, or an ErrorCode


class UpsertApi(ApiBase):
    if TYPE_CHECKING:  # ObjectsApi's, for the type checker (Master combines them)
        def put_end(self, client_id: str, key: Any, tenant_id: str = "default",
                    checksum: str | None = None) -> None: ...
        def put_revoke(self, client_id: str, key: Any, tenant_id: str = "default") -> None: ...
        def _put_head(self, client_id: str, tenant_id: str, config: ReplicateConfig | None) -> list[Any]: ...
        def _group_shard_ok(self, key: bytes, config: ReplicateConfig | None) -> bool: ...
        def batch_put_start_steps(self, client_id: str, keys: Sequence[Any], sizes: Sequence[int],
                                  config: ReplicateConfig | None = None,
                                  tenant_id: str = "default") -> Steps[list[Result]]: ...

    def upsert_start(self, client_id: str, key: Any, size: int, config: ReplicateConfig | None = None,
                     tenant_id: str = "default") -> list[Replica]:
        """Start writing `key` whether or not it exists (see the module's doc); raises the
        key's error (OBJECT_HAS_REPLICATION_TASK, NO_AVAILABLE_HANDLE, ...)."""
        result = self.batch_upsert_start(client_id, [_as_key(key)], [size], config, tenant_id)[0]
        if isinstance(result, ErrorCode):
            raise MasterError(result, f"upsert_start {_as_key(key)!r}")
        return result

    def batch_upsert_start(self, client_id: str, keys: Sequence[Any], sizes: Sequence[int],
                           config: ReplicateConfig | None = None, tenant_id: str = "default") -> list[Result]:
        return self.drive(self.batch_upsert_start_steps(client_id, keys, sizes, config, tenant_id))

    def batch_upsert_start_steps(self, client_id: str, keys: Sequence[Any], sizes: Sequence[int],
                                 config: ReplicateConfig | None = None,
                                 tenant_id: str = "default") -> Steps[list[Result]]:
        if len(keys) != len(sizes):
            raise MasterError(ErrorCode.INVALID_PARAMS, "keys and sizes differ in length")
        self._put_head(client_id, tenant_id, config)  # every option checked as put_start checks it
        c = config or ReplicateConfig()
        bkeys = _as_keys(keys)
        out: list[Result] = [None] * len(bkeys)
        todo = []
        for i, (key, size) in enumerate(zip(bkeys, sizes)):
            ok_size = not isinstance(size, bool) and isinstance(size, int) and 1 <= size < 2**53
            if not ok_size or not 1 <= len(key) <= self.config.max_key_length or not self._group_shard_ok(key, c):
                out[i] = ErrorCode.INVALID_PARAMS
            else:
                todo.append(i)
        head = wire.head(("key", "size"), client_id=client_id, tenant=tenant_id,
                         group=None if c.group_id in (None, "") else c.group_id,
                         soft_pin_action=SoftPinAction(c.soft_pin_action).value, soft_pin_ttl_ms=c.soft_pin_ttl_ms)
        replies = yield from self.transport.batch_steps("mc_upsert_start", head, [(bkeys[i], sizes[i]) for i in todo],
                                                        [bkeys[i] for i in todo])
        again: dict[ReplicateConfig, list[int]] = {}
        for i, reply in zip(todo, replies):
            if isinstance(reply, int):
                out[i] = ErrorCode(reply)
            elif reply[0] == b"inplace":
                out[i] = [Replica(reply[j].decode(errors="replace"), int(reply[j + 1]), sizes[i],
                                  ReplicaStatus.PROCESSING) for j in range(1, len(reply), 2)]
            else:
                again.setdefault(self._inherited(c, reply), []).append(i)
        for merged, idx in again.items():
            started = yield from self.batch_put_start_steps(client_id, [bkeys[i] for i in idx], [sizes[i] for i in idx],
                                                            merged, tenant_id)
            for i, r in zip(idx, started):
                out[i] = r
        return out

    def _inherited(self, c: ReplicateConfig, reply: list) -> ReplicateConfig:
        """The put_start config of a key whose old object went: its hard pin, group, and what was
        left of its soft pin and guarantee (never more than the store's maxima)."""
        hard_pin, group, soft_ms, guaranteed_ms = reply[1] == b"1", reply[2].decode(), int(reply[3]), int(reply[4])
        merged = dataclasses.replace(c, with_hard_pin=c.with_hard_pin or hard_pin,
                                     group_id=c.group_id if c.group_id not in (None, "") else (group or None))
        if soft_ms and SoftPinAction(c.soft_pin_action) == SoftPinAction.PRESERVE:
            merged = dataclasses.replace(merged, soft_pin_action=SoftPinAction.ENABLE,
                                         soft_pin_ttl_ms=min(soft_ms, self.config.max_kv_soft_pin_ttl))
        if guaranteed_ms > c.guaranteed_ttl_ms:
            merged = dataclasses.replace(merged, guaranteed_ttl_ms=min(guaranteed_ms, self.config.max_guaranteed_ttl))
        return merged

    def upsert_end(self, client_id: str, key: Any, tenant_id: str = "default", checksum: str | None = None) -> None:
        """put_end: the object becomes readable with its new bytes."""
        self.put_end(client_id, key, tenant_id, checksum)

    def upsert_revoke(self, client_id: str, key: Any, tenant_id: str = "default") -> None:
        """put_revoke: the upsert is abandoned and the object goes (its bytes may be half written)."""
        self.put_revoke(client_id, key, tenant_id)
