"""The host index (lua/ops/segments.lua): a segment slice mounted with a host (P:seg:<segment>.host)
is a member of P:hsegs:<host>, the set put_start's prefer_same_host tries first. Per shard:

- a slice mounted with a host and missing from its host's set (host_index_missing: puts from that
  host would not find it);
- a member of some P:hsegs:<host> whose slice is not mounted, or mounted with another host
  (host_index_stale, a warning: put_start skips members that are not mounted, but the entry
  counts against the host's 64 segments).

Both repairs are mc_fsck_host_index, which makes the membership agree with the slice as it is
inside the call."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .base import ERROR, WARNING, Action, Checker, Finding, Kind, _d, _Pass


@dataclass(frozen=True)
class Reindex(Action):
    name: bytes
    host: bytes
    order = 0

    def apply(self, audit: Any) -> tuple[bool, str]:
        audit.fcall("mc_fsck_host_index", self.shard, self.name, self.host)
        return True, ""


KINDS: dict[str, Kind] = {
    "host_index_missing": Kind(ERROR, True, "a segment slice mounted with a host missing from P:hsegs:<host>: puts "
                                            "preferring that host do not find it"),
    "host_index_stale": Kind(WARNING, True, "a P:hsegs:<host> member whose slice is not mounted with that host (puts "
                                            "skip it; it counts against the host's 64 segments)"),
}


def host_findings(audit: Any, shard: int) -> list[Finding]:
    k = audit.keys(shard)
    pipe = audit.t.pipeline(shard)
    pipe.zrange(k.segments, 0, -1)
    names = pipe.execute()[0]
    pipe = audit.t.pipeline(shard)
    for n in names:
        pipe.hget(k.segment(n), "host")
    host_of = {n: h for n, h in zip(names, pipe.execute()) if h is not None}
    prefix = k.host_segments(b"")
    hkeys = sorted(audit.scan(shard, prefix + b"*"))
    pipe = audit.t.pipeline(shard)
    for key in hkeys:
        pipe.smembers(key)
    listed = {key[len(prefix):]: set(members) for key, members in zip(hkeys, pipe.execute())}
    stale = [(host, n) for host, members in listed.items() for n in sorted(members) if host_of.get(n) != host]
    pipe = audit.t.pipeline(shard)  # a member of no P:segs entry: is its slice mounted (P:segs drift)?
    for _, n in stale:
        pipe.hget(k.segment(n), "host")
    out: list[Finding] = []
    for (host, n), now in zip(stale, pipe.execute() if stale else []):
        if now != host:
            out.append(audit.finding("host_index_stale", shard, f"P:hsegs:{_d(host)} member {_d(n)}",
                                     f"not a member (slice host {_d(now) if now is not None else 'none'})",
                                     "a member", Reindex(shard, n, host)))
    for n, host in sorted(host_of.items()):
        if n not in listed.get(host, set()):
            out.append(audit.finding("host_index_missing", shard, f"segment {_d(n)}", f"in P:hsegs:{_d(host)}",
                                     "absent", Reindex(shard, n, host)))
    return out


class Hosts(Checker):
    name = "hosts"
    kinds = KINDS
    actions = (Reindex,)

    def shard(self, audit: Any, shard: int, ps: _Pass) -> list[Finding]:
        return host_findings(audit, shard)
