"""What every checker shares: severities, the kinds a checker declares, findings and the report,
the typed repair actions, the Checker hooks, and small parsers of stored values."""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

CRITICAL, ERROR, WARNING = "critical", "error", "warning"

SCAN_COUNT = 1000

_HELD_RE = re.compile(rb"^(\d+) (\d+) (\d+) (.*)$", re.S)
_UNIT_RE = re.compile(rb"^([ogr]):([A-Za-z0-9_.\-]{1,64}):(.+)$", re.S)
RADIX_MARK = b"\0r:"  # a radix node's keys are audited as the group RADIX_MARK + <hash> (lua/lib/20_object.lua)
_ID_RE = re.compile(rb"^([A-Za-z0-9_.\-]{1,64}):(.+)$", re.S)


class Kind(NamedTuple):
    """A kind of finding: how bad it is, whether fsck can repair it, what it means."""
    severity: str
    repairable: bool
    doc: str


def _d(b: Any) -> str:
    return b.decode("utf-8", "backslashreplace") if isinstance(b, (bytes, bytearray)) else str(b)


def _int(b: Any) -> int | None:
    if b is None:
        return None
    try:
        return int(b)
    except (TypeError, ValueError):
        try:
            f = float(b)
        except (TypeError, ValueError):
            return None
        return int(f) if f.is_integer() else None


def _score(s: float | None) -> int | None:
    return None if s is None else int(s)


def _malformed(raw: Any) -> str:
    """How a finding shows a figure stored malformed (mooncake_redis.figures)."""
    return f"malformed {_d(raw)!r}"


@dataclass(frozen=True)
class Action:
    """One repair: a small immutable record (findings fixed by the same repair share one).
    `order` ranks repairs (lower first, then by shard); `apply` runs it and answers
    (applied, note)."""
    shard: int
    order: ClassVar[int] = 0

    def apply(self, audit: Any) -> tuple[bool, str]:
        raise NotImplementedError


@dataclass(frozen=True)
class SetFigures(Action):
    """Replace figures stored malformed with the values the pass recomputed (mc_fsck_figures):
    (hash, field, value read, value) quadruples, compare-and-set on the malformed value read.
    hash: b"" (P), b"gtenants", b"seg:<segment>" or b"disk:<client>". First of all repairs: the
    compare-and-add repairs and the free-list rebuild need numbers."""
    quads: tuple
    order = 1

    def apply(self, audit: Any) -> tuple[bool, str]:
        replies = audit.fcall("mc_fsck_figures", self.shard, *(x for q in self.quads for x in q))
        if not all(r[0] for r in replies):
            return False, "not repaired: the figure was rewritten since fsck read it; rerun fsck"
        return True, ""


@dataclass
class Finding:
    kind: str
    shard: int
    subject: str
    expected: str
    found: str
    severity: str = ERROR
    repairable: bool = True
    repaired: bool = False
    note: str = ""
    action: Action | None = field(default=None, repr=False, compare=False)

    def __str__(self) -> str:
        state = "repaired" if self.repaired else ("" if self.repairable else "not auto-repairable")
        tail = "; ".join(x for x in (state, self.note) if x)
        return (f"[{self.severity}] {self.kind} shard {self.shard} {self.subject}: expected {self.expected}, "
                f"found {self.found}" + (f" ({tail})" if tail else ""))

    def refuse(self, why: str) -> None:
        """Keep the finding, drop its repair, say why."""
        self.action, self.repairable = None, False
        self.note = "; ".join(x for x in (self.note, why) if x)


@dataclass
class FsckReport:
    """findings: every drift found (repaired or not); repaired: the findings a repair fixed;
    unverified: shard -> why its aggregate checks did not run; ok: no findings and every shard
    verified."""
    findings: list[Finding] = field(default_factory=list)
    objects_checked: int = 0
    repaired: list[Finding] = field(default_factory=list)
    unverified: dict[int, str] = field(default_factory=dict)
    shards: int = 0

    @property
    def ok(self) -> bool:
        return not self.findings and not self.unverified

    @property
    def unrepaired(self) -> list[Finding]:
        return [f for f in self.findings if not f.repaired]

    def kinds(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for f in self.findings:
            out[f.kind] += 1
        return dict(out)

    def summary(self) -> str:
        lines = [f"fsck: {self.shards} shard(s), {self.objects_checked} objects checked, "
                 f"{len(self.findings)} finding(s), {len(self.repaired)} repaired"]
        lines += [f"  {f}" for f in self.findings]
        lines += [f"  shard {s} unverified: {why}" for s, why in sorted(self.unverified.items())]
        return "\n".join(lines)


@dataclass
class _Seg:
    name: bytes
    base: int
    size: int
    used: int
    mount: bytes
    guaranteed: dict = field(default_factory=dict)  # tenant -> its g:<tenant> field, as stored
    used_raw: bytes | None = None                   # `used` as stored when it is malformed (used reads 0)


@dataclass
class _Pass:
    """What one pass over a shard saw (filled by the checkers' pass hooks)."""
    shard: int = 0
    exact: list[Finding] = field(default_factory=list)        # from atomic snapshots
    aggregate: list[Finding] = field(default_factory=list)    # need a still shard
    overlaps: list[tuple[Finding, tuple, tuple]] = field(default_factory=list)
    objects: int = 0
    ids: set = field(default_factory=set)                      # tenant:key of every object read
    groups: dict = field(default_factory=lambda: defaultdict(set))  # (tenant, group) -> {key}
    units: set = field(default_factory=set)                    # every unit found in a tier/deadline
    processing: set = field(default_factory=set)
    rebuild: dict = field(default_factory=dict)                # seg -> (mount, windows)
    segs: dict = field(default_factory=dict)                   # name -> _Seg of every mounted segment
    segs_index: dict = field(default_factory=dict)             # P:segs as read
    free_before: dict = field(default_factory=dict)            # seg -> (by_off, by_size) before the scan
    extents: dict = field(default_factory=lambda: defaultdict(list))  # seg -> [(offset, size, owner)]
    used_total: int = 0                                        # recomputed used bytes of the mounted segments
    cap_total: int = 0                                         # their sizes
    sweep_owed: bool = False                                   # P:sweep_pending set: a worker drops dead replicas
    bad_segments: set = field(default_factory=set)             # segments whose record is malformed (bad_segment)
    disk_mounts: dict = field(default_factory=dict)            # client -> mount id of its local disk
    moved: bool = False                                        # a free list changed during the pass
    stable: bool = False
    fingerprint: dict = field(default_factory=dict)            # checker name -> what it read at the end
    guaranteed: dict = field(default_factory=lambda: defaultdict(int))      # (segment | b"", tenant) -> bytes
    guarantee_prefix: dict = field(default_factory=lambda: defaultdict(set))  # (tenant, prefix) -> {key}
    offload_tasks: set = field(default_factory=set)  # tenant:key of objects with an offload task in flight
    disk_bytes: dict = field(default_factory=lambda: defaultdict(int))  # client -> sizes of its live disk replicas
    offload_evict: set = field(default_factory=set)  # tenant:key of objects eviction queued for offload
    offload_evict_bytes: int = 0                     # their sizes
    indexed: dict = field(default_factory=lambda: defaultdict(dict))  # (tenant, group) -> {key: node} (ugroup)
    replications: dict = field(default_factory=dict)  # tenant:key -> hash of objects with a replication in flight


class ObjectRead(NamedTuple):
    """One object of a pass, from one atomic snapshot: h is its hash (or the error reading a
    key of another type), snap the snapshot (hash, processing score, unit state, guarantee score)."""
    tenant: bytes
    key: bytes
    h: Any
    snap: list
    now: int


class Checker:
    """One family of checks. A checker declares its `kinds` and `actions` (the repair records it
    emits, each with its order and its repair) and implements the hooks it needs; fsck calls
    them per shard in the order of `CHECKERS` (mooncake_redis/fsck/__init__.py):

    a pass (retried while the shard moves; aggregate findings need a still one):
      fingerprint(audit, k) -> tuple   what must not change during the pass (read before and after)
      begin(audit, ps)                 before the object scan
      see_object(audit, ps, obj)       each object read (ObjectRead)
      end(audit, ps)                   after the scan, before the closing fingerprint
      settle(audit, ps, fp)            after it: fp is this checker's closing fingerprint
    after the (still) pass:
      shard(audit, shard, ps) -> list  findings of their own snapshots
      confirm(audit, shard, ps) -> list  what the pass saw but could not account for, re-read
    """
    name: ClassVar[str] = ""
    kinds: ClassVar[dict[str, Kind]] = {}
    actions: ClassVar[tuple[type[Action], ...]] = ()

    def fingerprint(self, audit: Any, k: Any) -> tuple:
        return ()

    def begin(self, audit: Any, ps: _Pass) -> None:
        pass

    def see_object(self, audit: Any, ps: _Pass, obj: ObjectRead) -> None:
        pass

    def end(self, audit: Any, ps: _Pass) -> None:
        pass

    def settle(self, audit: Any, ps: _Pass, fp: tuple) -> None:
        pass

    def shard(self, audit: Any, shard: int, ps: _Pass) -> list[Finding]:
        return []

    def confirm(self, audit: Any, shard: int, ps: _Pass) -> list[Finding]:
        return []
