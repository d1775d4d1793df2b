"""The Mooncake wire gateway's segment records, on shard 0 (lua/ops/gateway.lua, docs/gateway.md
"Keys"): P:gwseg:<segment> hashes (uuid, client, endpoint, ...), P:gwsegids (uuid -> segment) and
P:gwsegs (segment -> when mc_gw_reap looks at it next). gw_segment_record writes all three at
once and gw_drop_segment removes all three, so they must agree:

- every record's uuid maps back to its segment in P:gwsegids (gateway_segment_id), and every
  P:gwsegids entry names a segment whose record holds that uuid (gateway_stale_id);
- P:gwsegs lists exactly the recorded segments (gateway_segment_unlisted, gateway_stale_listing);
- a recorded segment is mounted (gateway_segment_unmounted, a warning: the worker's mc_gw_reap
  forgets it, and fsck asks that rule, mc_fsck_gateway 'unmounted', rather than re-deriving it).

The three keys (and every record and the mount rule's answer) are read in one MULTI on shard 0,
repeated until P:gwsegids and P:gwsegs read the same as in the read before, which named the
segments to look at. Repairs: mc_fsck_gateway, which re-derives what it writes from the keys as
they are inside the call."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .base import ERROR, WARNING, Action, Checker, Finding, Kind, _d, _Pass, _score

UNMOUNTED_PER_CALL = 256  # names per mc_fsck_gateway 'unmounted' call (its cap)
READS = 4                 # snapshots tried before the shard is reported unverified


@dataclass(frozen=True)
class GatewaySegment(Action):
    """Re-derive one segment's P:gwsegids entry and P:gwsegs listing from its record."""
    name: bytes
    order = 0

    def apply(self, audit: Any) -> tuple[bool, str]:
        reply = audit.fcall("mc_fsck_gateway", self.shard, "segment", self.name)
        if reply in (b"conflict", "conflict"):
            return False, "not repaired: another segment's record holds the same uuid; forget one of them"
        return True, ""


@dataclass(frozen=True)
class GatewayId(Action):
    """Delete a P:gwsegids entry whose segment does not hold that uuid."""
    uuid: bytes
    order = 0

    def apply(self, audit: Any) -> tuple[bool, str]:
        audit.fcall("mc_fsck_gateway", self.shard, "uuid", self.uuid)
        return True, ""


@dataclass(frozen=True)
class GatewayReap(Action):
    """Forget a recorded segment that is not mounted, as mc_gw_reap does."""
    name: bytes
    order = 1

    def apply(self, audit: Any) -> tuple[bool, str]:
        if audit.fcall("mc_fsck_gateway", self.shard, "reap", self.name) == 1:
            return True, ""
        return False, "not repaired: the segment is mounted again (or no longer recorded); rerun fsck"


KINDS: dict[str, Kind] = {
    "gateway_segment_id": Kind(ERROR, True, "a P:gwseg:<segment> record whose uuid has no P:gwsegids entry, or "
                                            "one naming another segment"),
    "gateway_stale_id": Kind(ERROR, True, "a P:gwsegids entry whose segment has no record, or a record with "
                                          "another uuid"),
    "gateway_segment_unlisted": Kind(ERROR, True, "a recorded segment missing from P:gwsegs (mc_gw_reap never "
                                                  "looks at it)"),
    "gateway_stale_listing": Kind(ERROR, True, "a P:gwsegs member without a P:gwseg:<segment> record"),
    "gateway_segment_unmounted": Kind(WARNING, True, "a recorded segment that is not mounted (no P:seg:<segment> "
                                                     "on shard 0; the worker's mc_gw_reap forgets it)"),
    "gateway_bad_record": Kind(ERROR, False, "a P:gwseg:<segment> key that is not a hash with a uuid"),
}


def _snapshot(audit: Any, names: list[bytes]) -> tuple[dict, dict, list, list]:
    """One MULTI on shard 0: P:gwsegids, P:gwsegs, each named record, the unmounted ones."""
    k = audit.keys(0)
    if not names:
        return {}, {}, [], []
    pipe = audit.t.pipeline(0)
    pipe.hgetall(k.gw_segment_ids)
    pipe.zrange(k.gw_segments, 0, -1, withscores=True)
    for n in names:
        pipe.hgetall(k.gw_segment(n))
    for i in range(0, len(names), UNMOUNTED_PER_CALL):
        pipe.execute_command("FCALL", "mc_fsck_gateway", 1, k.P, "unmounted", *names[i:i + UNMOUNTED_PER_CALL])
    res = pipe.execute(raise_on_error=False)
    for i, x in enumerate(res):
        if isinstance(x, Exception) and not 2 <= i < 2 + len(names):
            raise x  # only a record key of the wrong type is tolerated (reported as gateway_bad_record)
    unmounted = [n for part in res[2 + len(names):] for n in part]
    return res[0], dict(res[1]), res[2:2 + len(names)], unmounted


def gateway_findings(audit: Any) -> list[Finding]:
    k = audit.keys(0)
    prefix = k.gw_segment(b"")
    scanned = {key[len(prefix):] for key in audit.scan(0, prefix + b"*")}
    ids = audit.r.hgetall(k.gw_segment_ids)
    listed = dict(audit.r.zrange(k.gw_segments, 0, -1, withscores=True))
    for _ in range(READS):
        names = sorted(scanned | set(ids.values()) | set(listed))
        ids2, listed2, rows, unmounted = _snapshot(audit, names)
        if (ids2, listed2) == (ids, listed):
            break
        ids, listed = ids2, listed2
    else:
        audit.unverify(0, "the gateway's segment records changed during each read (rerun fsck)")
        return []
    out: list[Finding] = []
    records: dict[bytes, bytes] = {}  # segment -> uuid
    bad: set[bytes] = set()
    for name, row in zip(names, rows):
        subject = f"segment {_d(name)}"
        if isinstance(row, Exception) or (row and not row.get(b"uuid")):
            bad.add(name)
            out.append(audit.finding("gateway_bad_record", 0, subject, "a hash with a uuid",
                                     str(row) if isinstance(row, Exception) else "no uuid"))
            continue
        if not row:
            continue
        uuid = records[name] = row[b"uuid"]
        holder = ids.get(uuid)
        if holder != name:
            out.append(audit.finding("gateway_segment_id", 0, subject, f"P:gwsegids {_d(uuid)} -> {_d(name)}",
                                     "no entry" if holder is None else f"-> {_d(holder)}",
                                     GatewaySegment(0, name)))
        if name not in listed:
            out.append(audit.finding("gateway_segment_unlisted", 0, subject, "in P:gwsegs", "absent",
                                     GatewaySegment(0, name)))
    for uuid, name in sorted(ids.items()):
        if records.get(name) != uuid and name not in bad:
            why = "no record" if name not in records else f"its record has uuid {_d(records[name])}"
            out.append(audit.finding("gateway_stale_id", 0, f"P:gwsegids {_d(uuid)}",
                                     f"no entry (segment {_d(name)}: {why})", f"-> {_d(name)}", GatewayId(0, uuid)))
    for name in sorted(listed):
        if name not in records and name not in bad:
            out.append(audit.finding("gateway_stale_listing", 0, f"segment {_d(name)}",
                                     "not in P:gwsegs (no record)", f"P:gwsegs score {_score(listed[name])}",
                                     GatewaySegment(0, name)))
    for name in unmounted:
        if name in records:
            out.append(audit.finding("gateway_segment_unmounted", 0, f"segment {_d(name)}",
                                     "mounted (P:seg on shard 0)", "not mounted", GatewayReap(0, name),
                                     note="the worker's mc_gw_reap forgets it"))
    return out


class Gateway(Checker):
    name = "gateway"
    kinds = KINDS
    actions = (GatewaySegment, GatewayId, GatewayReap)

    def shard(self, audit: Any, shard: int, ps: _Pass) -> list[Finding]:
        return gateway_findings(audit) if shard == 0 else []
