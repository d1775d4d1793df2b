"""Graceful unmounts (lua/ops/segments.lua): a draining slice has P:seg:<segment>.draining_until
(its deadline, ms) and P:segs_draining lists it with that deadline, which is how the worker finds
it (SegmentsApi.finish_drains). Per shard:

- a draining slice missing from P:segs_draining, or listed with another deadline (drain_unlisted:
  the worker would never finish it, or at the wrong time);
- a P:segs_draining entry whose slice is not draining (drain_stale, a warning: unmounted, or
  mounted again; the worker's next finish_drains drops the entry anyway);
- a draining_until that is not an integer (drain_bad_deadline: the worker ends that drain at once).

Both repairs are mc_finish_drain 'relist', which makes the entry agree with the slice as it is
inside the call."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..figures import parse
from .base import ERROR, WARNING, Action, Checker, Finding, Kind, _d, _malformed, _Pass, _score


@dataclass(frozen=True)
class Relist(Action):
    name: bytes
    order = 0

    def apply(self, audit: Any) -> tuple[bool, str]:
        audit.fcall("mc_finish_drain", self.shard, 2, "name", self.name, "op", "relist")
        return True, ""


KINDS: dict[str, Kind] = {
    "drain_unlisted": Kind(ERROR, True, "a draining segment slice (draining_until) missing from P:segs_draining or "
                                        "listed with another deadline: the worker would not finish it in time"),
    "drain_stale": Kind(WARNING, True, "a P:segs_draining entry whose segment slice is not draining (the worker's "
                                       "next finish_drains drops it)"),
    "drain_bad_deadline": Kind(ERROR, False, "a P:seg:<segment>.draining_until that is not an integer (the worker "
                                             "ends that drain at once)"),
}


def drain_findings(audit: Any, shard: int) -> list[Finding]:
    k = audit.keys(shard)
    pipe = audit.t.pipeline(shard)
    pipe.zrange(k.segments_draining, 0, -1, withscores=True)
    pipe.zrange(k.segments, 0, -1)
    listed_raw, names = pipe.execute()
    listed = dict(listed_raw)
    wanted = sorted(set(names) | set(listed))
    pipe = audit.t.pipeline(shard)
    for n in wanted:
        pipe.hget(k.segment(n), "draining_until")
    deadlines = dict(zip(wanted, pipe.execute()))
    out: list[Finding] = []
    for name in wanted:
        raw, subject = deadlines[name], f"segment {_d(name)}"
        if raw is None:
            if name in listed:
                out.append(audit.finding("drain_stale", shard, subject, "not in P:segs_draining (not draining)",
                                         f"P:segs_draining score {_score(listed[name])}", Relist(shard, name)))
            continue
        due = parse(raw)
        if due is None:
            out.append(audit.finding("drain_bad_deadline", shard, f"P:seg:{_d(name)}.draining_until", "an integer",
                                     _malformed(raw)))
        elif listed.get(name) != due:
            found = "absent" if name not in listed else f"P:segs_draining score {_score(listed[name])}"
            out.append(audit.finding("drain_unlisted", shard, subject, f"P:segs_draining score {due}", found,
                                     Relist(shard, name)))
    return out


class Drains(Checker):
    name = "drains"
    kinds = KINDS
    actions = (Relist,)

    def shard(self, audit: Any, shard: int, ps: _Pass) -> list[Finding]:
        return drain_findings(audit, shard)
