"""The audit: passes over each shard that drive the checkers' hooks (retried while the shard
moves), the confirming second pass before aggregate repairs, and the repairs in their order."""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import redis

from ..errors import MasterError
from ..keys import ShardKeys
from ..transport import Shards
from .allocator import Rebuild
from .base import (
    SCAN_COUNT,
    Action,
    Checker,
    Finding,
    FsckReport,
    Kind,
    ObjectRead,
    _Pass,
)
from .checkers import CHECKERS, KINDS
from .objects import snapshot_objects


class _Audit:
    def __init__(self, master: Any, batch: int, retries: int, progress: Callable[[int], None] | None,
                 checkers: Sequence[Checker] = CHECKERS):
        self.t: Shards = master.transport
        self.master = master
        self.r: redis.Redis = self.t.redis  # plain reads; pipelines and SCANs go through self.t
        self.batch = batch
        self.retries = retries
        self.progress = progress
        self.checkers = tuple(checkers)
        self.kinds: dict[str, Kind] = KINDS
        self.report = FsckReport(shards=master.shards)
        self.checked = 0          # objects read so far (progress), across passes
        self.rebuild_plans: dict[tuple[int, bytes], tuple] = {}
        self.radix_shards: dict[int, bool] = {}  # radix_present, per shard

    # ---- helpers -----------------------------------------------------------------------
    def keys(self, shard: int) -> ShardKeys:
        return self.t.keys[shard]

    def radix_present(self, shard: int) -> bool:
        """Is there a radix index to audit on this shard? (Its SCANs are skipped otherwise.) With
        the index off, a SCAN that stops at the first node record tells (once a shard)."""
        if shard not in self.radix_shards:
            k = self.keys(shard)
            self.radix_shards[shard] = bool(
                self.master.config.enable_radix_tree or self.r.exists(k.radix_outbox)
                or next(self.scan(shard, k.prefix("radix_node") + b"*"), None) is not None)
        return self.radix_shards[shard]

    def finding(self, kind: str, shard: int, subject: str, expected: Any, found: Any,
                action: Action | None = None, note: str = "") -> Finding:
        severity, repairable, _ = self.kinds[kind]
        return Finding(kind, shard, subject, str(expected), str(found), severity,
                       repairable and action is not None, False, note, action if repairable else None)

    def scan(self, shard: int, match: bytes) -> Iterator[bytes]:
        seen: set[bytes] = set()
        for keys in self.t.scan(shard, match, SCAN_COUNT):
            for k in keys:
                if k not in seen:
                    seen.add(k)
                    yield k

    def zall(self, key: bytes) -> dict[bytes, float]:
        return {m: s for m, s in self.r.zscan_iter(key, count=SCAN_COUNT)}

    @staticmethod
    def clock(pipe_results: list) -> int:
        frozen, (sec, usec) = pipe_results[0], pipe_results[1]
        return int(frozen) if frozen is not None else int(sec) * 1000 + int(usec) // 1000

    def fingerprint(self, k: ShardKeys) -> dict[str, tuple]:
        """What each checker says must hold still during a pass (counters, mount sequence, index
        sizes, the disks...): compared before and after it."""
        return {c.name: c.fingerprint(self, k) for c in self.checkers}

    def fcall(self, fn: str, shard: int, *args: Any) -> Any:
        return self.t.call(fn, shard, *args)  # reloads the library if it is gone

    def unverify(self, shard: int, why: str) -> None:
        old = self.report.unverified.get(shard)
        self.report.unverified[shard] = f"{old}; {why}" if old else why

    # ---- one pass over a shard ---------------------------------------------------------
    def one_pass(self, shard: int) -> _Pass:
        k = self.keys(shard)
        ps = _Pass(shard=shard)
        fp0 = self.fingerprint(k)
        for c in self.checkers:
            c.begin(self, ps)
        # objects, in atomic batches
        prefix = k.prefix("object")
        chunk: list[tuple[bytes, bytes]] = []

        def flush() -> None:
            if not chunk:
                return
            now, snaps = snapshot_objects(self, shard, chunk)
            for (tenant, key), snap in zip(chunk, snaps):
                h = snap[0]
                if not isinstance(h, Exception):
                    if not h:
                        continue  # deleted since the SCAN returned it
                    ps.objects += 1
                    ps.ids.add(tenant + b":" + key)
                obj = ObjectRead(tenant, key, h, snap, now)
                for c in self.checkers:
                    c.see_object(self, ps, obj)
            self.checked += sum(1 for s in snaps if s[0] and not isinstance(s[0], Exception))
            chunk.clear()
            if self.progress:
                self.progress(self.checked)

        for okey in self.scan(shard, prefix + b"*"):
            tenant, _, key = okey[len(prefix):].partition(b":")
            chunk.append((tenant, key))
            if len(chunk) >= self.batch:
                flush()
        flush()
        for c in self.checkers:
            c.end(self, ps)
        fp1 = self.fingerprint(k)
        ps.fingerprint = fp1
        for c in self.checkers:
            c.settle(self, ps, fp1[c.name])
        ps.stable = fp0 == fp1 and not ps.moved
        return ps

    # ---- the whole audit ---------------------------------------------------------------
    def still_pass(self, shard: int) -> _Pass:
        """A pass over the shard, retried while the shard moved under it."""
        for _ in range(self.retries + 1):
            ps = self.one_pass(shard)
            if ps.stable:
                break
        return ps

    @staticmethod
    def confirm(first: _Pass, second: _Pass) -> None:
        """Keep the aggregate findings of `second` that `first` saw identically. A repair action
        runs only if every finding it would fix was seen by both passes: a write and its undo
        during one pass (invisible to the fingerprint) does not repeat the same way in the next."""
        def key(f: Finding) -> tuple:
            return (f.kind, f.subject, f.expected, f.found)
        seen = {key(f) for f in first.aggregate}
        keep = [f for f in second.aggregate if key(f) in seen]
        unconfirmed = {f.action for f in second.aggregate if key(f) not in seen and f.action is not None}
        for f in keep:
            if f.action in unconfirmed:
                f.refuse("not repaired: a related finding was not confirmed by a second pass; rerun fsck")
        second.aggregate = keep
        dropped = {a.segment for a in unconfirmed if isinstance(a, Rebuild)}
        second.rebuild = {seg: plan for seg, plan in second.rebuild.items() if seg not in dropped}

    def run_shard(self, shard: int, repair: bool) -> None:
        ps = self.still_pass(shard)
        if repair and ps.stable and ps.aggregate:
            # repairs of aggregates act on what two still passes agree on
            second = self.still_pass(shard)
            if second.stable:
                self.confirm(ps, second)
                ps = second
            else:
                for f in ps.aggregate:
                    if f.action is not None:
                        f.refuse("not repaired: no still second pass to confirm it; rerun fsck")
        self.report.objects_checked += ps.objects
        findings = list(ps.exact)
        for c in self.checkers:
            findings += c.shard(self, shard, ps)
        for c in self.checkers:
            findings += c.confirm(self, shard, ps)
        if ps.stable:
            findings += ps.aggregate
            self.rebuild_plans.update({(shard, seg): plan for seg, plan in ps.rebuild.items()})
        else:
            self.unverify(shard, f"the shard was written during each of {self.retries + 1} pass(es): counters, "
                                 "segment bytes and free lists not checked (rerun on a quieter store)")
        self.report.findings += findings

    def run(self, repair: bool) -> FsckReport:
        for shard in range(self.t.count):
            self.run_shard(shard, repair)
        if repair:
            self.repair()
        return self.report

    # ---- repairs -----------------------------------------------------------------------
    def repair(self) -> None:
        """Every action once (findings fixed by one repair share it), lowest order first, then by
        shard (see each action's `order`: e.g. segment used bytes before free lists, since a
        rebuild reclaims leaked bytes only when its allocations add up to the used bytes)."""
        by_action: dict[Action, list[Finding]] = defaultdict(list)
        for f in self.report.findings:
            if f.repairable and f.action is not None:
                by_action[f.action].append(f)
        for action in sorted(by_action, key=lambda a: (a.order, a.shard)):
            try:
                ok, note = action.apply(self)
            except MasterError as exc:
                ok, note = False, f"repair failed: {exc}"
            for f in by_action[action]:
                f.repaired = ok
                if note:
                    f.note = "; ".join(x for x in (f.note, note) if x)
                if ok:
                    self.report.repaired.append(f)
