"""Replay policies: how an engine reads and writes a request's blocks under one caching design.
A policy is a small class overriding the hooks it changes; bench/replay.py's StoreReplay calls
them for every request, on a fresh instance per run (a policy may keep online state, never
look ahead in the trace). POLICIES maps the names `mooncake-redis replay --policy` accepts."""
from __future__ import annotations

import collections
from typing import Any

from mooncake_redis import Master, ReplicateConfig

from .replay import TENANT, Request, leading_run

PutBatch = tuple[list[int], "ReplicateConfig | None"]  # indexes into the request's blocks, their config


class Policy:
    """Plain reads and writes: the base every policy starts from."""

    name = ""
    summary = ""
    KNOBS: dict[str, int] = {}  # tunable settings and their defaults (--knob NAME.KNOB=VALUE)

    def knobs(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in self.KNOBS}

    def figures(self) -> dict[str, Any]:
        """The policy's own counts, added to its JSON object (e.g. hot blocks written)."""
        return {}

    def master_config(self) -> dict[str, Any]:
        """MasterConfig overrides of the policy's store."""
        return {}

    def key(self, block: int) -> bytes:
        """The store key of a trace block."""
        return b"blk-%d" % block

    def lookup(self, m: Master, req: Request, keys: list[bytes], now: int) -> list[bool]:
        """Which of the request's blocks the store holds, read in order (a read leases them)."""
        return m.batch_exist_key(keys, TENANT)

    def put_batches(self, m: Master, req: Request, missing: list[int], now: int) -> list[PutBatch]:
        """The missing blocks to write (indexes into req.blocks), as batches of one config each."""
        return [(missing, None)] if missing else []



class Lru(Policy):
    name = "lru"
    summary = "plain leases: a read leases a block for default_kv_lease_ttl; the least recently leased go first"


class Guaranteed(Policy):
    """Explicit caching driven by an online popularity rule (no look-ahead): a block that
    `requests` distinct requests have referenced (hit or missed) within the last `window_ms` of
    trace time, this one included, is hot. A hot block is written with a guarantee
    (ReplicateConfig(guaranteed_ttl_ms=ttl_ms), falling back to an ordinary write past the
    store's guaranteed-bytes limit), and a hot block the request hits is read with
    batch_get_replica_list(guaranteed_ttl_ms=ttl_ms), which renews an active guarantee (reads
    never create one). Until then it is plain lru."""

    name = "guaranteed"
    KNOBS = {"requests": 2, "window_ms": 600_000, "ttl_ms": 60_000}

    def __init__(self, requests: int = 2, window_ms: int = 600_000, ttl_ms: int = 60_000):
        if requests < 1 or window_ms < 0 or ttl_ms < 1:
            raise ValueError("guaranteed: requests >= 1, window_ms >= 0 and ttl_ms >= 1")
        self.requests, self.window_ms, self.ttl_ms = requests, window_ms, ttl_ms
        self.seen: dict[int, collections.deque[int]] = {}  # block -> times of the requests that referenced it
        self.hot: set[int] = set()  # the current request's hot blocks
        self.guarantees_asked = self.renewals_asked = 0

    @property
    def summary(self) -> str:
        return (f"a block referenced by {self.requests} requests within {self.window_ms:,} ms is hot: written "
                f"with a {self.ttl_ms:,} ms guarantee (fallback: ordinary), renewed by reads")

    def _note(self, req: Request, now: int) -> None:
        self.hot = set()
        for b in set(req.blocks):
            times = self.seen.setdefault(b, collections.deque())
            times.append(now)
            while times and times[0] < now - self.window_ms:
                times.popleft()
            if len(times) >= self.requests:
                self.hot.add(b)

    def lookup(self, m: Master, req: Request, keys: list[bytes], now: int) -> list[bool]:
        self._note(req, now)
        found = super().lookup(m, req, keys, now)
        hits = leading_run(found)
        renew = [k for k, b in zip(keys[:hits], req.blocks[:hits]) if b in self.hot]
        if renew:
            m.batch_get_replica_list(renew, TENANT, guaranteed_ttl_ms=self.ttl_ms)
            self.renewals_asked += len(renew)
        return found

    def put_batches(self, m: Master, req: Request, missing: list[int], now: int) -> list[PutBatch]:
        hot = [j for j in missing if req.blocks[j] in self.hot]
        cold = [j for j in missing if req.blocks[j] not in self.hot]
        config = ReplicateConfig(guaranteed_ttl_ms=self.ttl_ms, guarantee_fallback=True)
        self.guarantees_asked += len(hot)
        return [(idx, c) for idx, c in ((hot, config), (cold, None)) if idx]


    def figures(self) -> dict[str, Any]:
        return {"guaranteed_puts": self.guarantees_asked, "guarantee_renewals": self.renewals_asked}


POLICIES: dict[str, type[Policy]] = {p.name: p for p in (Lru, Guaranteed)}


def knobs_of(name: str) -> dict[str, int]:
    """The tunable knobs of a policy and their defaults."""
    return dict(POLICIES[name].KNOBS)


def make_policy(name: str, knobs: dict[str, int] | None = None) -> Policy:
    """A fresh policy with its knobs (defaults for those not given)."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICIES)})") from None
    unknown = set(knobs or {}) - set(cls.KNOBS)
    if unknown:
        raise ValueError(f"policy {name!r} has no knob {', '.join(sorted(unknown))} "
                         f"(knobs: {', '.join(cls.KNOBS) or 'none'})")
    return cls(**(knobs or {}))
