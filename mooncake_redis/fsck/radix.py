"""fsck of the radix index (lua/lib/32_radix.lua), shard by shard:

- a node with a parent is listed among that parent's children, on the parent's shard, unless
  its link is still in the outbox (radix_child_unlisted: the unsafe direction, a parent that
  may be evicted under a live child);
- every child a node lists exists, on its shard, with that node as its parent
  (radix_phantom_child: the safe direction, a parent kept too long);
- a node with neither keys nor children older than the grace period (radix_empty_node);
- outbox entries parse and name their parent's shard (radix_outbox).
A step still in an outbox is no drift: a child whose link waits is not reported unlisted, a
child whose unlink waits is not reported a phantom.
A node's keys against their objects, its counters and its unit's tier are audited with the
groups' checks (the node is the composite unit r:<tenant>:<hash>, see groups.check_group).
Repairs go through the index's own idempotent, seq-ordered steps (mc_radix_probe then
mc_radix_apply), so a repair racing a live writer can only leave a phantom, never drop a link."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..keys import node_shard
from ..radix import DEFAULT_GRACE_MS, parse_outbox_entry
from .base import (
    CRITICAL,
    ERROR,
    SCAN_COUNT,
    WARNING,
    Action,
    Checker,
    Finding,
    Kind,
    _Pass,
)


@dataclass(frozen=True)
class RadixOutbox(Action):
    """Drop a malformed outbox entry (mc_radix_ack)."""
    entry: bytes
    order = 6

    def apply(self, audit: Any) -> tuple[bool, str]:
        audit.fcall("mc_radix_ack", self.shard, self.entry)
        return True, ""


@dataclass(frozen=True)
class RadixEmpty(Action):
    """Reconcile the shard's radix nodes: empty ones past the grace period go."""
    order = 7

    def apply(self, audit: Any) -> tuple[bool, str]:
        cursor = 0
        while True:
            cursor, _, _ = audit.master.reconcile_radix(self.shard, DEFAULT_GRACE_MS, cursor)
            if cursor == 0:
                return True, ""


@dataclass(frozen=True)
class RadixLink(Action):
    """node (on this shard) is a live child its parent does not list: deliver the link."""
    tenant: bytes
    node: bytes
    parent: bytes
    order = 6

    def apply(self, audit: Any) -> tuple[bool, str]:
        child, parent, pshard = self.node, self.parent, node_shard(self.parent, audit.t.count)
        alive, seq = audit.fcall("mc_radix_probe", self.shard, self.tenant, child, parent)
        if not alive:
            return False, "not repaired: the child is gone since fsck read it"
        return _deliver(audit, b"link", seq, pshard, self.tenant, parent, child)


@dataclass(frozen=True)
class RadixUnlink(Action):
    """node (on this shard) lists a child that is gone: deliver the unlink."""
    tenant: bytes
    node: bytes
    child: bytes
    order = 6

    def apply(self, audit: Any) -> tuple[bool, str]:
        child, parent, pshard = self.child, self.node, self.shard
        alive, seq = audit.fcall("mc_radix_probe", node_shard(child, audit.t.count), self.tenant, child, parent)
        if alive:
            return False, "not repaired: the child exists again"
        return _deliver(audit, b"unlink", seq, pshard, self.tenant, parent, child)


def _deliver(audit: Any, op: bytes, seq: int, pshard: int, tenant: bytes, parent: bytes,
             child: bytes) -> tuple[bool, str]:
    entry = b"%s %d %d %s %d %s%s" % (op, seq, pshard, tenant, len(parent), parent, child)
    audit.fcall("mc_radix_apply", pshard, entry)
    return True, ""


KINDS: dict[str, Kind] = {
    "radix_child_unlisted": Kind(CRITICAL, True, "a node's parent does not list it (and no link is pending): the "
                                                 "parent could be evicted under it"),
    "radix_phantom_child": Kind(WARNING, True, "a node lists a child that is gone or has another parent (protected "
                                               "too long)"),
    "radix_empty_node": Kind(WARNING, True, "a node with neither keys nor children past the grace period"),
    "radix_outbox": Kind(ERROR, True, "a malformed outbox entry"),
}


class Radix(Checker):
    name = "radix"
    kinds = KINDS
    actions = (RadixLink, RadixUnlink, RadixOutbox, RadixEmpty)

    def shard(self, audit: Any, shard: int, ps: _Pass) -> list[Finding]:
        return radix_findings(audit, shard) if audit.radix_present(shard) else []


def _records(audit: Any, shard: int) -> set[tuple[bytes, bytes]]:
    prefix = audit.keys(shard).prefix("radix_node")
    out = set()
    for key in audit.scan(shard, prefix + b"*"):
        tenant, _, h = key[len(prefix):].partition(b":")
        if h:
            out.add((tenant, h))
    return out


def _pending_unlinks(audit: Any) -> set[tuple[bytes, bytes, bytes]]:
    """(tenant, parent, child) of every unlink waiting in an outbox (read once per audit): such a
    child is gone and its parent still lists it until the entry is delivered, which is no drift."""
    if getattr(audit, "radix_pending", None) is None:
        pending = set()
        for k in audit.t.keys:
            for entry, _ in audit.r.zscan_iter(k.radix_outbox, count=SCAN_COUNT):
                try:
                    op, _, _, tenant, parent, child = parse_outbox_entry(entry)
                except ValueError:
                    continue
                if op == "unlink":
                    pending.add((tenant.encode(), parent, child))
        audit.radix_pending = pending
    return audit.radix_pending


def radix_findings(audit: Any, shard: int) -> list[Finding]:
    k, r, shards = audit.keys(shard), audit.r, audit.t.count
    out = []
    records = _records(audit, shard)
    now = int(audit.t.call("mc_now", shard))
    for tenant, h in sorted(records):
        pipe = audit.t.pipeline(shard, transaction=False)
        pipe.hgetall(k.radix_node(tenant, h))
        pipe.zrange(k.radix_kids(tenant, h), 0, -1)
        rec, kids = pipe.execute()
        if not rec:
            continue
        if b"kid" in rec:  # the child its record lists (lua/lib/32_radix.lua)
            kids = [rec[b"kid"], *kids]
        subject = (tenant + b":" + h).decode(errors="replace")
        parent = rec.get(b"parent")
        if parent is not None and b"link_pending" not in rec:
            pk = audit.keys(node_shard(parent, shards))
            listed = (r.hget(pk.radix_node(tenant, parent), "kid") == h
                      or r.zscore(pk.radix_kids(tenant, parent), h) is not None)
            if not listed:
                out.append(audit.finding("radix_child_unlisted", shard, subject,
                                         f"listed by parent {parent.decode(errors='replace')}",
                                         "not listed", RadixLink(shard, tenant, h, parent)))
        for kid in kids:
            if (tenant, h, kid) in _pending_unlinks(audit):
                continue
            kk = audit.keys(node_shard(kid, shards))
            if r.hget(kk.radix_node(tenant, kid), "parent") != h:
                out.append(audit.finding("radix_phantom_child", shard,
                                         f"{subject} child {kid.decode(errors='replace')}", "a live child",
                                         "gone or another parent's", RadixUnlink(shard, tenant, h, kid)))
        empty = not kids and int(rec.get(b"members", 0) or 0) == 0 and rec.get(b"draining") != b"1"
        if empty and int(rec.get(b"created", 0)) + DEFAULT_GRACE_MS <= now:
            out.append(audit.finding("radix_empty_node", shard, subject, "keys or children", "neither",
                                     RadixEmpty(shard)))
    for entry, _ in r.zscan_iter(k.radix_outbox, count=SCAN_COUNT):
        try:
            op, _, pshard, _, parent, _ = parse_outbox_entry(entry)
            ok = op in ("link", "unlink") and pshard == node_shard(parent, shards)
        except ValueError:
            ok = False
        if not ok:
            out.append(audit.finding("radix_outbox", shard, entry.decode(errors="replace"), "a well-formed entry",
                                     "malformed", RadixOutbox(shard, entry)))
    return out

