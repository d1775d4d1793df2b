"""Replica copies and moves in flight (lua/lib/47_replication.lua): an object with repl_kind has
a replication whose deadline (repl_until) P:repl_due lists, which is how the worker revokes an
abandoned one. Per shard:

- a replication missing from P:repl_due or listed with another deadline (repl_unlisted: an
  abandoned one would keep its task reference, and so its object, forever). The repair revokes
  it (mc_replica_revoke as its client) after reading again that it is still unlisted: a client
  that ends it later gets OBJECT_NO_REPLICATION_TASK and reports its task failed.
An entry of P:repl_due with no replication in flight is no finding: a forced remove leaves it,
and the worker's sweep drops it at its deadline."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import wire
from .base import ERROR, Action, Checker, Finding, Kind, ObjectRead, _d, _Pass, _score


@dataclass(frozen=True)
class Revoke(Action):
    tenant: bytes
    key: bytes
    client: bytes
    kind: bytes
    until: int
    order = 5

    def apply(self, audit: Any) -> tuple[bool, str]:
        k = audit.keys(self.shard)
        pipe = audit.t.pipeline(self.shard)
        pipe.zscore(k.repl_due, self.tenant + b":" + self.key)
        pipe.hget(k.object(self.tenant, self.key), "repl_until")
        listed, until = pipe.execute()
        if listed is not None or until is None or int(until) != self.until:
            return False, "not repaired: the replication changed since fsck read it; rerun fsck"
        head = wire.head(wire.KEY, client_id=self.client, tenant=self.tenant, kind=self.kind)
        code = audit.fcall("mc_replica_revoke", self.shard, *head, self.key)[0]
        return code == 0, "" if code == 0 else f"revoke answered {code}"


KINDS: dict[str, Kind] = {
    "repl_unlisted": Kind(ERROR, True, "a replica copy or move in flight missing from P:repl_due or listed with "
                                       "another deadline: an abandoned one would keep its object forever"),
}


class Replications(Checker):
    name = "replication"
    kinds = KINDS
    actions = (Revoke,)

    def see_object(self, audit: Any, ps: _Pass, obj: ObjectRead) -> None:
        if isinstance(obj.h, dict) and b"repl_kind" in obj.h:
            ps.replications[obj.tenant + b":" + obj.key] = obj.h

    def shard(self, audit: Any, shard: int, ps: _Pass) -> list[Finding]:
        k = audit.keys(shard)
        listed = dict(audit.t.pipeline(shard).zrange(k.repl_due, 0, -1, withscores=True).execute()[0])
        out: list[Finding] = []
        for oid, h in sorted(ps.replications.items()):
            until = int(h.get(b"repl_until", b"0") or 0)
            if listed.get(oid) != until:
                tenant, _, key = oid.partition(b":")
                found = "absent" if oid not in listed else f"P:repl_due score {_score(listed[oid])}"
                out.append(audit.finding("repl_unlisted", shard, f"object {_d(oid)}", f"P:repl_due score {until}",
                                         found, Revoke(shard, tenant, key, h.get(b"repl_client", b""),
                                                       h.get(b"repl_kind", b""), until)))
        return out
