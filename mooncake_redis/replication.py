"""Replica copy and move (Mooncake's CopyStart/CopyEnd/CopyRevoke and MoveStart/MoveEnd/MoveRevoke):
a client adds replicas of a complete object on named segments, or moves one of its replicas to
another segment, in three steps (lua/lib/47_replication.lua has the rules): start allocates the
targets (held extents, invisible to readers), the client writes the bytes, end makes them
replicas (a move then drops its source) or revoke gives them back. One replication per object
at a time; while it runs the object holds a task reference (protected from eviction and from
remove without force). A replication not ended within put_start_discard_timeout is revoked by
the worker (and by the next step on the object)."""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Sequence

from . import wire
from .api import ApiBase
from .checks import _as_key, _check_name, _check_tenant
from .errors import ErrorCode, MasterError
from .models import Replica, ReplicaStatus

KINDS = ("copy", "move")


class ReplicationStart(NamedTuple):
    source: Replica          # the replica to read from (complete)
    targets: list[Replica]   # the new replicas to write (processing); [] when every target had one


class ReplicationApi(ApiBase):
    def replica_copy_start(self, client_id: str, key: Any, source: str, targets: Sequence[str],
                           tenant_id: str = "default") -> ReplicationStart:
        """Allocate replicas of `key` on each of `targets` that has none yet, to be written from
        its replica on `source`; raises the key's code (see docs/protocol.md, mc_replica_start)."""
        return self._start("copy", client_id, key, source, list(targets), tenant_id)

    def replica_move_start(self, client_id: str, key: Any, source: str, target: str,
                           tenant_id: str = "default") -> ReplicationStart:
        """Allocate a replica of `key` on `target` (none when it has one) that replaces the one on
        `source` at replica_end."""
        return self._start("move", client_id, key, source, [target], tenant_id)

    def replica_end(self, client_id: str, key: Any, kind: str, tenant_id: str = "default") -> None:
        """The targets written: they become replicas (a move drops its source). Raises
        REPLICA_IS_GONE when the source or a target died meanwhile (what lives is kept)."""
        self._step("mc_replica_end", client_id, key, kind, tenant_id)

    def replica_revoke(self, client_id: str, key: Any, kind: str, tenant_id: str = "default") -> None:
        """Give the targets back; the object stays as it was."""
        self._step("mc_replica_revoke", client_id, key, kind, tenant_id)

    def _start(self, kind: str, client_id: str, key: Any, source: str, targets: list[str],
               tenant_id: str) -> ReplicationStart:
        bkey = self._checked(client_id, key, kind, tenant_id)
        _check_name(source, "source", 1024)
        for t in targets:
            _check_name(t, "target", 1024)
        head = wire.head(wire.KEY, client_id=client_id, tenant=tenant_id, kind=kind, source=source, target=targets)
        reply = self.transport.call("mc_replica_start", self.transport.shard_of(bkey), *head, bkey)[0]
        if isinstance(reply, int):
            raise MasterError(ErrorCode(reply), f"replica_{kind}_start {key!r}")
        size = int(reply[0])
        pairs = [Replica(reply[i].decode(errors="replace"), int(reply[i + 1]), size, ReplicaStatus.PROCESSING)
                 for i in range(1, len(reply), 2)]
        return ReplicationStart(dataclasses.replace(pairs[0], status=ReplicaStatus.COMPLETE), pairs[1:])

    def _step(self, fn: str, client_id: str, key: Any, kind: str, tenant_id: str) -> None:
        bkey = self._checked(client_id, key, kind, tenant_id)
        head = wire.head(wire.KEY, client_id=client_id, tenant=tenant_id, kind=kind)
        code = self.transport.call(fn, self.transport.shard_of(bkey), *head, bkey)[0]
        if code != ErrorCode.OK:
            raise MasterError(ErrorCode(code), f"{fn[3:]} {key!r}")

    @staticmethod
    def _checked(client_id: str, key: Any, kind: str, tenant_id: str) -> bytes:
        _check_name(client_id, "client_id")
        _check_tenant(tenant_id)
        if kind not in KINDS:
            raise MasterError(ErrorCode.INVALID_PARAMS, f"kind must be one of {KINDS}")
        return _as_key(key)
