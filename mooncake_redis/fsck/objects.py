"""Objects and their placement: each object hash, read atomically with its index entries
(processing, candidate tier and deadline entries, guarantee), against the rules: well-formed
fields, the processing index, the tier the evictability rule (mc_unit_state, in Lua only) names,
and at least one live replica. The object pass also gathers, for the other checkers, every live
extent (segments), guaranteed bytes (guarantees) and live disk bytes (offload); afterwards the
units and processing entries no object accounted for are re-read and judged."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import wire
from ..keys import CLOCK_FIELD, K
from ..layout import COMPLETE, stored_replicas, stored_status
from ..transport.replies import missing_functions, reload
from .base import (
    _ID_RE,
    _UNIT_RE,
    ERROR,
    WARNING,
    Action,
    Checker,
    Finding,
    Kind,
    ObjectRead,
    _d,
    _int,
    _Pass,
    _score,
)


@dataclass(frozen=True)
class Place(Action):
    """Re-place one object (mc_fsck_place): its processing, tier, deadline, guarantee and prefix
    entries re-derived from its hash inside the call (prefix: a P:gpfx set to leave)."""
    tenant: bytes
    key: bytes
    prefix: bytes | None = None
    order = 0

    def apply(self, audit: Any) -> tuple[bool, str]:
        audit.fcall("mc_fsck_place", self.shard, self.tenant, self.key,
                    *(() if self.prefix is None else (self.prefix,)))
        return True, ""


@dataclass(frozen=True)
class Unit(Action):
    """Re-place (or drop) one unit named in the tiers (mc_fsck_unit)."""
    unit: bytes
    order = 0

    def apply(self, audit: Any) -> tuple[bool, str]:
        audit.fcall("mc_fsck_unit", self.shard, self.unit)
        return True, ""


@dataclass(frozen=True)
class Sweep(Action):
    """Delete an object none of whose replicas is live (mc_sweep_replicas)."""
    tenant: bytes
    key: bytes
    order = 5

    def apply(self, audit: Any) -> tuple[bool, str]:
        audit.fcall("mc_sweep_replicas", self.shard, *wire.head(wire.KEY, tenant=self.tenant), self.key)
        return True, ""


KINDS: dict[str, Kind] = {
    "bad_object": Kind(ERROR, False, "an object hash with missing or malformed fields"),
    "no_live_replica": Kind(WARNING, True, "an object whose replicas are all on unmounted segments, and no sweep "
                                           "is owed (P:sweep_pending unset)"),
    "processing_missing": Kind(ERROR, True, "a processing object is not in P:processing"),
    "processing_score": Kind(ERROR, True, "the P:processing score differs from put_started"),
    "processing_stale": Kind(ERROR, True, "P:processing holds an object that is complete or missing"),
    "unit_missing": Kind(ERROR, True, "an evictable unit is in no candidate tier"),
    "unit_wrong_tier": Kind(ERROR, True, "a unit sits in the wrong tier for its soft pin"),
    "unit_in_both_tiers": Kind(ERROR, True, "a unit sits in both candidate tiers"),
    "unit_score": Kind(ERROR, True, "a unit's tier score differs from its lease (below the lease_until of its hash)"),
    "read_mark_missing": Kind(ERROR, True, "an object with a guarantee, pin, task reference or disk replica lacks "
                              "the read mark (special): reads would answer it as a plain object"),
    "soft_deadline": Kind(ERROR, True, "a soft-tier unit without the right P:deadline:soft_pin entry"),
    "stray_deadline": Kind(WARNING, True, "a P:deadline:soft_pin entry for a unit not in the soft tier"),
    "stray_unit": Kind(ERROR, True,
                       "a unit in the tiers that must not be there (missing, protected or grouped object)"),
    "guarantee_index": Kind(ERROR, True, "an object's P:guaranteed entry differs from its guaranteed_until"),
    "retention_deadline": Kind(ERROR, True,
                               "a P:deadline:retention entry differs from its group's retained_until record"),
}


def compare_unit(audit: Any, shard: int, unit: bytes, st: list, due: bool, now: int,
                 action: Action | None) -> list[Finding]:
    """Compare a unit's index entries with what the evictability rule says they should be.
    `st` is mc_unit_state's reply ({why, expected, actual, deadline indexes, ...}): the rule
    itself lives in Lua only. `due` is mc_fsck_sweep_due's answer, read in the same snapshot:
    a deadline sweep is due to re-derive the unit (a guarantee or a soft pin ran out, a
    retention ended), so its tier and deadline entries may lag behind the rule until it runs,
    and that is not drift."""
    why, exp_flat, act_flat, dl = st[:4]
    expected = {exp_flat[i]: exp_flat[i + 1] for i in range(0, len(exp_flat), 2)}
    actual = {act_flat[i]: int(act_flat[i + 1]) for i in range(0, len(act_flat), 2)}  # ZSCORE replies: never None
    deadlines = set(dl)
    u, why = _d(unit), _d(why) or "evictable"
    exp_t = {i: v for i, v in expected.items() if i not in deadlines}
    act_t = {i: v for i, v in actual.items() if i not in deadlines}
    def show(d: dict) -> str:
        return ", ".join(f"{_d(i)}@{v}" for i, v in sorted(d.items())) or "absent"
    if not expected and actual:
        return [audit.finding("stray_unit", shard, u, f"absent ({why})", show(actual), action)]
    out = []
    if exp_t and not act_t:
        if not due:
            out.append(audit.finding("unit_missing", shard, u, show(exp_t), "in no tier", action))
    elif len(act_t) > 1:
        out.append(audit.finding("unit_in_both_tiers", shard, u, show(exp_t), show(act_t), action))
    elif set(act_t) != set(exp_t):
        if not due:
            out.append(audit.finding("unit_wrong_tier", shard, u, show(exp_t), show(act_t), action))
    else:
        for i, v in exp_t.items():
            if v != b"" and _score(v) != act_t[i]:
                out.append(audit.finding("unit_score", shard, u, f"score {_d(v)}", f"score {act_t[i]}", action))
    for i in sorted(deadlines):
        want, have = expected.get(i), actual.get(i)
        if i == K["deadline_retention"].encode():  # a record's deadline: any drift is drift
            if _int(want) != have:
                out.append(audit.finding("retention_deadline", shard, u,
                                        f"{_d(i)} entry {_d(want) if want else 'none'}",
                                        "none" if have is None else have, action))
            continue
        if want is not None and (have is None or _score(want) != have) and not due:
            out.append(audit.finding("soft_deadline", shard, u, f"{_d(i)} entry {_d(want)}",
                                    "none" if have is None else have, action))
        elif want is None and have is not None and have > now:
            out.append(audit.finding("stray_deadline", shard, u, f"no {_d(i)} entry ({why})", have, action))
    return out

SWEEP_DUE_UNITS = 1024  # units per mc_fsck_sweep_due call (its cap)


def sweep_due_calls(pipe: Any, P: bytes, units: list[bytes]) -> int:
    """Queue mc_fsck_sweep_due for `units` on `pipe`; returns the number of calls queued."""
    parts = [units[i:i + SWEEP_DUE_UNITS] for i in range(0, len(units), SWEEP_DUE_UNITS)]
    for part in parts:
        pipe.execute_command("FCALL_RO", "mc_fsck_sweep_due", 1, P, *part)
    return len(parts)


def snapshot(audit: Any, shard: int, fill: Callable[[Any], None]) -> list:
    """One MULTI on `shard` of the commands `fill` queues, with each error reply in its place;
    when the functions library is missing (FUNCTION FLUSH, a restart without persistence), it is
    loaded and the snapshot taken again, once."""
    for attempt in range(2):
        pipe = audit.t.pipeline(shard)
        fill(pipe)
        res = pipe.execute(raise_on_error=False)
        if attempt or not missing_functions(res):
            return res
        reload(audit.t.node(shard))
    raise AssertionError("unreachable")


def snapshot_objects(audit: Any, shard: int, ids: list[tuple[bytes, bytes]]) -> tuple[int, list]:
    """One MULTI: the clock, then per object its hash and its index entries (processing,
    unit state, guarantee), and whether a deadline sweep is due for its unit. Each object's
    snapshot is [hash, processing score, unit state, guarantee score, sweep due]."""
    k = audit.keys(shard)
    calls = 0

    def fill(pipe: Any) -> None:
        nonlocal calls
        pipe.hget(k.config, CLOCK_FIELD)
        pipe.time()
        for tenant, key in ids:
            oid = tenant + b":" + key
            unit = b"o:" + oid
            pipe.hgetall(k.object(tenant, key))
            pipe.zscore(k.processing, oid)
            pipe.execute_command("FCALL_RO", "mc_unit_state", 1, k.P, unit)
            pipe.zscore(k.guaranteed, oid)
        calls = sweep_due_calls(pipe, k.P, [b"o:" + tenant + b":" + key for tenant, key in ids])

    res = snapshot(audit, shard, fill)
    n = 2 + 4 * len(ids)
    for i, x in enumerate(res):
        if isinstance(x, Exception) and (i < 2 or i >= n or (i - 2) % 4 in (1, 3)):
            raise x  # only an object key of the wrong type is tolerated (reported as bad_object)
    now = audit.clock(res)
    due = [d == 1 for reply in res[n:n + calls] for d in reply]
    return now, [res[2 + 4 * i: 6 + 4 * i] + [due[i]] for i in range(len(ids))]

def check_object(audit: Any, shard: int, tenant: bytes, key: bytes, snap: list, now: int) -> list[Finding]:
    h, s_proc, st, s_guarantee, due = snap
    oid = tenant + b":" + key
    subject = _d(oid)
    if isinstance(h, Exception):
        return [audit.finding("bad_object", shard, subject, "a hash", f"{h}")]
    unit = b"o:" + oid
    place = Place(shard, tenant, key)
    out: list[Finding] = []
    if not h:
        if s_proc is not None:
            out.append(audit.finding("processing_stale", shard, subject, "no entry (object missing)",
                                    f"score {_score(s_proc)}", place))
        if s_guarantee is not None:
            out.append(audit.finding("guarantee_index", shard, subject, "no P:guaranteed entry (object missing)",
                                    f"score {_score(s_guarantee)}", place))
        return out + compare_unit(audit, shard, unit, st, due, now, place)
    status = stored_status(h)
    complete = status == COMPLETE
    bad = []
    size = _int(h.get(b"size"))
    if size is None or size <= 0:
        bad.append(f"size={_d(h.get(b'size'))}")
    if status not in (b"processing", b"complete"):
        bad.append(f"status={_d(status)}")
    started = _int(h.get(b"put_started"))  # only in a put in progress an earlier package wrote
    if b"put_started" in h and (started is None or complete):  # a complete object has none
        bad.append(f"put_started={_d(h.get(b'put_started'))}")
    if stored_replicas(h) is None:
        bad.append("replicas=" + ", ".join(f"{_d(f)}={_d(v)}" for f, v in h.items()
                                           if f == b"reps" or f.startswith(b"rep:")))
    if bad:
        out.append(audit.finding("bad_object", shard, subject, "well-formed fields", ", ".join(bad)))
    if not complete:
        if s_proc is None:
            out.append(audit.finding("processing_missing", shard, subject, "in P:processing" + (
                f", score {started}" if started is not None else ""), "absent", place))
        elif started is not None and _score(s_proc) != started:
            out.append(audit.finding("processing_score", shard, subject, f"score {started} (put_started)",
                                    f"score {_score(s_proc)}", place))
    elif s_proc is not None:
        out.append(audit.finding("processing_stale", shard, subject, "no entry (object complete)",
                                f"score {_score(s_proc)}", place))
    want = _int(h.get(b"guaranteed_until")) if b"guaranteed_until" in h else None
    if (want is None) != (s_guarantee is None) or (want is not None and _score(s_guarantee) != want):
        out.append(audit.finding("guarantee_index", shard, subject,
                                "no entry" if want is None else f"score {want} (guaranteed_until)",
                                "absent" if s_guarantee is None else f"score {_score(s_guarantee)}", place))
    if not isinstance(st, Exception):
        if len(st) > 5 and st[5] == 1:  # the functions say so (mc_unit_state)
            out.append(audit.finding("read_mark_missing", shard, subject, "special=1", "absent", place))
        out += compare_unit(audit, shard, unit, st, due, now, place)
    return out


class Objects(Checker):
    name = "objects"
    kinds = KINDS
    actions = (Place, Unit, Sweep)

    def fingerprint(self, audit: Any, k: Any) -> tuple:
        return (audit.r.zcard(k.processing),)

    def begin(self, audit: Any, ps: _Pass) -> None:
        k = audit.keys(ps.shard)
        ps.sweep_owed = audit.r.exists(k.sweep_pending) > 0  # a worker will drop dead replicas
        # local disk segments: client -> mount id (a disk replica "<mount> <location>" is live on a match)
        ps.disk_mounts = {c: int(score) for c, score in audit.zall(k.disks).items()}

    def see_object(self, audit: Any, ps: _Pass, obj: ObjectRead) -> None:
        shard, tenant, key, h = ps.shard, obj.tenant, obj.key, obj.h
        ps.exact += check_object(audit, shard, tenant, key, obj.snap, obj.now)
        if isinstance(h, Exception):
            return
        size = _int(h.get(b"size")) or 0
        guaranteed = b"guaranteed_until" in h
        segs = ps.segs
        n_reps = live = 0
        for r in stored_replicas(h) or []:
            n_reps += 1
            seg = r.segment
            if seg in ps.bad_segments:
                live += 1  # on a segment whose record is malformed: not judged (bad_segment)
            elif seg in segs and segs[seg].mount == r.mount:
                live += 1
                ps.extents[seg].append((r.offset, size, ("rep", tenant, key, seg)))
                if guaranteed:
                    ps.guaranteed[(seg, tenant)] += size
                    ps.guaranteed[(b"", tenant)] += size
        for f, v in h.items():  # a live disk replica keeps the object readable
            if f.startswith(b"disk:") and ps.disk_mounts.get(f[5:]) == _int(v.split(b" ", 1)[0]):
                live += 1
                ps.disk_bytes[f[5:]] += size
        if live == 0 and not ps.sweep_owed:
            ps.aggregate.append(audit.finding(
                "no_live_replica", shard, _d(tenant + b":" + key), "at least one replica on a mounted segment",
                f"{n_reps} replica(s), none live", Sweep(shard, tenant, key),
                note="run the unmount sweep (mc_sweep_replicas)"))

    def end(self, audit: Any, ps: _Pass) -> None:
        # tiers, deadline index, processing index: what no scanned object accounts for
        k = audit.keys(ps.shard)
        for index in k.unit_indexes + (k.deadline_retention,):
            ps.units |= set(audit.zall(index))
        ps.processing = set(audit.zall(k.processing))

    def confirm(self, audit: Any, shard: int, ps: _Pass) -> list[Finding]:
        """Units and processing entries no scanned object accounts for: re-read, then judged."""
        findings: list[Finding] = []
        recheck: set[tuple[bytes, bytes]] = set()
        for unit in sorted(ps.units):
            m = _UNIT_RE.match(unit)
            if not m:
                findings.append(audit.finding("stray_unit", shard, _d(unit), "absent (not a unit)", "present",
                                              Unit(shard, unit)))
            elif m.group(1) == b"o" and m.group(2) + b":" + m.group(3) not in ps.ids:
                recheck.add((m.group(2), m.group(3)))
        for oid in sorted(ps.processing - ps.ids):
            m = _ID_RE.match(oid)
            if not m:
                findings.append(audit.finding("processing_stale", shard, _d(oid), "no entry (not an object id)",
                                              "present", None))
            else:
                recheck.add((m.group(1), m.group(2)))
        todo = sorted(recheck)
        for i in range(0, len(todo), audit.batch):
            part = todo[i:i + audit.batch]
            now, snaps = snapshot_objects(audit, shard, part)
            for (tenant, key), snap in zip(part, snaps):
                findings += check_object(audit, shard, tenant, key, snap, now)
        return findings
