"""Replay policies: how an engine reads and writes a request's blocks under one caching design.
A policy is a small class overriding the hooks it changes; bench/replay.py's StoreReplay calls
them for every request, on a fresh instance per run (a policy may keep online state, never
look ahead in the trace). POLICIES maps the names `mooncake-redis replay --policy` accepts;
names joined by "+" make a Combined policy."""
from __future__ import annotations

import collections
import dataclasses
import hashlib
from typing import Any

from mooncake_redis import ErrorCode, Master, ReplicateConfig

from .replay import TENANT, Request, leading_run

PutBatch = tuple[list[int], "ReplicateConfig | None"]  # indexes into the request's blocks, their config


class Policy:
    """Plain reads and writes: the base every policy starts from."""

    name = ""
    KNOBS: dict[str, int] = {}  # tunable settings and their defaults (--knob NAME.KNOB=VALUE)

    @property
    def summary(self) -> str:  # one line on what the policy does (a plain attribute in some)
        return ""

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

    def parents(self, req: Request, indexes: list[int]) -> list[str | None] | None:
        """Each written block's own parent hash (batch_put_start's `parents`), or None for none."""
        return None



class Lru(Policy):
    """Plain leases. Its knob lease_slack_ms is the store's kv_lease_slack (docs/configuration.md, "Reads
    that write nothing"): a read renews a lease only when it falls short of the TTL, to the TTL rounded up to a multiple
    of the slack."""

    name = "lru"
    KNOBS = {"lease_slack_ms": 0}

    def __init__(self, lease_slack_ms: int = 0):
        if lease_slack_ms < 0:
            raise ValueError("lru: lease_slack_ms >= 0")
        self.lease_slack_ms = lease_slack_ms

    @property
    def summary(self) -> str:
        return ("plain leases: a read leases a block for default_kv_lease_ttl; the least recently leased go first"
                + (f" (renewed to ttl + {self.lease_slack_ms:,} ms when short)" if self.lease_slack_ms else ""))

    def master_config(self) -> dict[str, Any]:
        return {"kv_lease_slack": self.lease_slack_ms} if self.lease_slack_ms else {}


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


class Retained(Policy):
    """Group retention: the blocks a request writes form a group (ReplicateConfig(group_id=...)),
    retained with retain_groups for the request's expected duration, extra_ms +
    ms_per_output_token x output_length (at least 1 ms), from its arrival. While retained, the
    group ranks after every ordinary candidate (allow_evict_retained_groups); afterwards it is an
    ordinary unit, evicted whole. A group lives on its id's shard and its members must route
    there, so with several shards a request has one group per shard its new blocks route to, each
    id carrying a `{tag}` of that shard."""

    name = "retained"
    KNOBS = {"ms_per_output_token": 30, "extra_ms": 0}

    def __init__(self, ms_per_output_token: int = 30, extra_ms: int = 0):
        if ms_per_output_token < 0 or extra_ms < 0:
            raise ValueError("retained: ms_per_output_token and extra_ms must be >= 0")
        self.ms_per_output_token, self.extra_ms = ms_per_output_token, extra_ms
        self.requests = 0
        self.tags: dict[int, str] = {}  # shard -> a routing tag that lands there
        self.retained = 0
        self.refused: dict[str, int] = {}

    @property
    def summary(self) -> str:
        return (f"a request's new blocks form a group retained for {self.extra_ms:,} ms + "
                f"{self.ms_per_output_token} ms per output token")

    def duration_ms(self, req: Request) -> int:
        return max(1, self.extra_ms + self.ms_per_output_token * (req.output_length or 0))

    def _tag(self, m: Master, shard: int) -> str:
        if not self.tags:
            i = 0
            while len(self.tags) < m.shards:
                self.tags.setdefault(m.transport.shard_of(f"s{i}".encode()), f"s{i}")
                i += 1
        return self.tags[shard]

    def put_batches(self, m: Master, req: Request, missing: list[int], now: int) -> list[PutBatch]:
        self.requests += 1
        if not missing:
            return []
        by_shard: dict[int, list[int]] = {}
        for j in missing:
            by_shard.setdefault(m.transport.shard_of(self.key(req.blocks[j])), []).append(j)
        groups = {s: (f"r{self.requests}" if m.shards == 1 else f"{{{self._tag(m, s)}}}r{self.requests}")
                  for s in by_shard}
        for result in m.retain_groups(list(groups.values()), self.duration_ms(req), TENANT):
            if isinstance(result, ErrorCode):
                self.refused[result.name] = self.refused.get(result.name, 0) + 1
            else:
                self.retained += 1
        return [(idx, ReplicateConfig(group_id=groups[s])) for s, idx in by_shard.items()]

    def figures(self) -> dict[str, Any]:
        return {"groups_retained": self.retained, "retentions_refused": dict(sorted(self.refused.items()))}


class Combined(Policy):
    """Several policies at once, e.g. `guaranteed+retained`: the reads of the one part that
    changes them (at most one may), and each block written with every part's settings merged
    (the fields a part sets away from ReplicateConfig's defaults; a later part wins a field two
    set). Each part makes its own calls (retain_groups) and keeps its own counts."""

    def __init__(self, parts: list[Policy]):
        readers = [p for p in parts if type(p).lookup is not Policy.lookup]
        if len(parts) < 2 or len(readers) > 1 or len({type(p) for p in parts}) < len(parts):
            raise ValueError("a combination joins two or more different policies, at most one of which "
                             "changes reads")
        self.parts, self.reader = parts, (readers or parts)[0]
        self.name = "+".join(p.name for p in parts)

    @property
    def summary(self) -> str:
        return "; ".join(f"{p.name}: {p.summary}" for p in self.parts)

    def knobs(self) -> dict[str, int]:
        return {f"{p.name}.{k}": v for p in self.parts for k, v in p.knobs().items()}

    def master_config(self) -> dict[str, Any]:
        return {k: v for p in self.parts for k, v in p.master_config().items()}

    def lookup(self, m: Master, req: Request, keys: list[bytes], now: int) -> list[bool]:
        return self.reader.lookup(m, req, keys, now)

    def put_batches(self, m: Master, req: Request, missing: list[int], now: int) -> list[PutBatch]:
        settings: dict[int, dict[str, Any]] = {j: {} for j in missing}
        for part in self.parts:
            for indexes, config in part.put_batches(m, req, missing, now):
                for j in indexes:
                    settings[j].update(_set_fields(config))
        batches: dict[tuple, list[int]] = {}
        for j in missing:
            batches.setdefault(tuple(sorted(settings[j].items())), []).append(j)
        return [(idx, ReplicateConfig(**dict(fields)) if fields else None) for fields, idx in batches.items()]

    def parents(self, req: Request, indexes: list[int]) -> list[str | None] | None:
        for p in self.parts:
            own = p.parents(req, indexes)
            if own is not None:
                return own
        return None

    def figures(self) -> dict[str, Any]:
        return {k: v for p in self.parts for k, v in p.figures().items()}


_DEFAULTS = ReplicateConfig()


def _set_fields(config: ReplicateConfig | None) -> dict[str, Any]:
    if config is None:
        return {}
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
            if getattr(config, f.name) != getattr(_DEFAULTS, f.name)}


class Radix(Policy):
    """The radix index (MasterConfig.enable_radix_tree): a block's key is its 64-hex prefix hash
    + "_0", and each write names the block before it in the request as its parent
    (batch_put_start's `parents`: a request's blocks in one batch), so the store evicts leaves first and never a block
    another stored block extends. Its reference is the ideal radix cache."""

    name = "radix"
    summary = "radix index on: parent = the previous block of the request; leaves are evicted first"

    def master_config(self) -> dict[str, Any]:
        return {"enable_radix_tree": True}

    @staticmethod
    def prefix_hash(block: int) -> str:
        return hashlib.blake2b(b"%d" % block, digest_size=32).hexdigest()

    def key(self, block: int) -> bytes:
        return self.prefix_hash(block).encode() + b"_0"

    def parents(self, req: Request, indexes: list[int]) -> list[str | None] | None:
        # one batch for the request: each block names its own parent (the first has none)
        return [self.prefix_hash(req.blocks[j - 1]) if j else None for j in indexes]


POLICIES: dict[str, type[Policy]] = {p.name: p for p in (Lru, Guaranteed, Retained, Radix)}


def knobs_of(name: str) -> dict[str, int]:
    """The tunable knobs of a policy and their defaults."""
    return dict(POLICIES[name].KNOBS)


def make_policy(name: str, knobs: dict[str, dict[str, int]] | None = None) -> Policy:
    """A fresh policy: one of POLICIES, or several joined by "+" (Combined). `knobs` maps policy
    names to their knobs (defaults for those not given)."""
    if "+" in name:
        return Combined([make_policy(part, knobs) for part in name.split("+")])
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICIES)}, or several joined by +)") from None
    mine = (knobs or {}).get(name, {})
    unknown = set(mine) - set(cls.KNOBS)
    if unknown:
        raise ValueError(f"policy {name!r} has no knob {', '.join(sorted(unknown))} "
                         f"(knobs: {', '.join(cls.KNOBS) or 'none'})")
    return cls(**mine)
