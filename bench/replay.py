"""Trace replay: a Mooncake-format trace run through a real store under an eviction policy, with
in-process reference caches of the same capacity. `mooncake-redis replay` (cli/replay.py) and
`bench capacity` (bench/capacity.py) drive it; docs/replay.md describes the method and figures.

The trace is Mooncake's JSONL format: one request a line with `timestamp` (ms from the trace's
start), `hash_ids` (the request's chain of prefix blocks: block i's parent is block i-1),
`input_length` (prompt tokens; when absent, blocks x block tokens) and `output_length`
(generated tokens: the `retained` policy's expected duration). Each request, as an
inference engine would issue it:

  1. look up all its blocks in order (the policy's read: batch_exist_key for plain leases); the
     hits are the leading run of blocks found (a prefix match: a block past the first miss is of
     no use). A read leases what it finds;
  2. write the blocks the lookup did not find, batch_put_start + batch_put_end (a block found
     past the first miss is not written again: its put would be refused, and the read's lease
     has already refreshed it).

The store's clock is frozen and moved to each request's timestamp (never slept); the client pings
once a second of trace time, as a live client does. With a worker, Worker.run_once runs after
every request (the background loop: eviction from the high watermark down to the target).

Evictions are found by comparing the store's object count after each request with the blocks the
replay has stored (a shadow kept in the order they were last read or written, oldest first); the
missing ones are found with EXISTS on their object keys from the oldest on (read-only). An
eviction is orphan-making when, after the request that evicted it, a block that extends it (a
child in some request's chain) is still stored (the reference caches count the same way).
"""
from __future__ import annotations

import collections
import heapq
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, TextIO

from mooncake_redis import ErrorCode, Master, MasterConfig
from mooncake_redis.master import client_from_url
from mooncake_redis.worker import Worker

from .common import delete_namespace, url_or_private_valkey

# the repository's ../shared/traces (a source checkout only; otherwise a trace must be named)
DEFAULT_TRACE = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "conversation_trace.jsonl"
BLOCK_TOKENS = 512
BLOCK_BYTES = 64 * 1024
CAPACITY_BLOCKS = 5859     # 3,000,000 tokens of 512-token blocks
NAMESPACE = "mcreplay"
CLIENT = "replay"
SEGMENT = "replay-seg"
TENANT = "default"
T0 = 1_700_000_000_000     # store clock at the trace's timestamp 0
PING_EVERY_MS = 1000       # trace time between the client's pings (client_ttl is 10 s)


# ---- the trace -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Request:
    timestamp: int                  # ms from the trace's start
    blocks: tuple[int, ...]
    input_length: int | None = None  # prompt tokens, when the trace gives them
    output_length: int | None = None  # generated tokens, when the trace gives them

    def tokens(self, block_tokens: int) -> int:
        return self.input_length if self.input_length is not None else len(self.blocks) * block_tokens

    def tokens_saved(self, hits: int, block_tokens: int) -> int:
        """Prefill tokens a prefix match of `hits` blocks saves (the last block may be partial)."""
        return min(hits * block_tokens, self.tokens(block_tokens))


def load_trace(path: str | os.PathLike, limit: int | None = None) -> list[Request]:
    """The first `limit` requests (all when None) of a Mooncake-format JSONL trace. Raises
    ValueError naming the line of a malformed one; timestamps must not go back."""
    out: list[Request] = []
    last = 0
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if limit is not None and len(out) >= limit:
                break
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                ts, ids = row["timestamp"], row["hash_ids"]
                length, output = row.get("input_length"), row.get("output_length")
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                raise ValueError(f"{path}:{lineno}: not a trace request ({exc})") from None
            if isinstance(ts, bool) or not isinstance(ts, int) or ts < last:
                raise ValueError(f"{path}:{lineno}: timestamp must be an integer >= the one before, not {ts!r}")
            if not isinstance(ids, list) or not all(isinstance(b, int) and not isinstance(b, bool) for b in ids):
                raise ValueError(f"{path}:{lineno}: hash_ids must be a list of integers")
            for name, value in (("input_length", length), ("output_length", output)):
                if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                    raise ValueError(f"{path}:{lineno}: {name} must be a non-negative integer")
            last = ts
            out.append(Request(ts, tuple(ids), length, output))
    if not out:
        raise ValueError(f"{path}: no requests")
    return out


def leading_run(found: Iterable[bool]) -> int:
    """Blocks of the prefix match: how many lead the request before the first miss."""
    n = 0
    for hit in found:
        if not hit:
            break
        n += 1
    return n


class Chains:
    """The trace's prefix tree: the blocks that extend each block (its children)."""

    def __init__(self, requests: Iterable[Request]):
        self.children: dict[int, set[int]] = collections.defaultdict(set)
        self.parents: dict[int, set[int]] = collections.defaultdict(set)
        for req in requests:
            for parent, child in zip(req.blocks, req.blocks[1:]):
                if parent != child:
                    self.children[parent].add(child)
                    self.parents[child].add(parent)

    def has_stored_child(self, block: int, stored: Callable[[int], bool]) -> bool:
        return any(stored(c) for c in self.children.get(block, ()))


# ---- figures -------------------------------------------------------------------------------

@dataclass
class Stats:
    """What one replay (store or reference cache) did. Rates are fractions in [0, 1]."""
    requests: int = 0
    blocks: int = 0
    hits: int = 0
    tokens: int = 0
    tokens_saved: int = 0
    requests_hit: int = 0            # requests with at least one block hit
    evictions: int = 0
    orphan_evictions: int = 0        # evicted while a block that extends it stayed stored
    written: int = 0
    puts_refused: dict[str, int] = field(default_factory=dict)  # ErrorCode name -> puts refused
    guaranteed_peak_bytes: int = 0
    seconds: float = 0.0
    objects_left: int = 0
    used_ratio: float = 0.0
    worker_evicted: int = 0          # objects the worker evicted (the rest: evict-on-put)

    def record(self, req: Request, hits: int, block_tokens: int) -> None:
        self.requests += 1
        self.blocks += len(req.blocks)
        self.hits += hits
        self.tokens += req.tokens(block_tokens)
        self.tokens_saved += req.tokens_saved(hits, block_tokens)
        self.requests_hit += hits > 0

    def count_evictions(self, evicted: list[int], chains: "Chains", stored: Callable[[int], bool]) -> None:
        """The blocks one request evicted; `stored` tells what is stored after the request."""
        self.evictions += len(evicted)
        self.orphan_evictions += sum(chains.has_stored_child(b, stored) for b in evicted)

    def refuse(self, code: ErrorCode) -> None:
        self.puts_refused[code.name] = self.puts_refused.get(code.name, 0) + 1

    @property
    def block_hit_rate(self) -> float:
        return self.hits / self.blocks if self.blocks else 0.0

    @property
    def token_hit_rate(self) -> float:
        return self.tokens_saved / self.tokens if self.tokens else 0.0

    @property
    def request_hit_rate(self) -> float:
        return self.requests_hit / self.requests if self.requests else 0.0

    def figures(self, store: bool = True) -> dict[str, Any]:
        """The JSON object of docs/replay.md (reference caches leave out the store's fields)."""
        out: dict[str, Any] = {
            "block_hit_rate": self.block_hit_rate, "token_hit_rate": self.token_hit_rate,
            "request_hit_rate": self.request_hit_rate, "hits": self.hits, "blocks": self.blocks,
            "tokens_saved": self.tokens_saved, "tokens": self.tokens, "evictions": self.evictions,
            "orphan_evictions": self.orphan_evictions}
        if store:
            out.update({
                "puts_refused": dict(sorted(self.puts_refused.items())), "written": self.written,
                "guaranteed_peak_bytes": self.guaranteed_peak_bytes,
                "requests_per_s": self.requests / self.seconds if self.seconds else None,
                "seconds": self.seconds, "objects_left": self.objects_left, "used_ratio": self.used_ratio,
                "worker_evicted": self.worker_evicted})
        return out


# ---- reference caches (plain Python) -----------------------------------------------------

def ideal_lru(requests: list[Request], capacity: int, block_tokens: int = BLOCK_TOKENS,
              chains: Chains | None = None) -> Stats:
    """An ideal LRU cache of `capacity` blocks with the store's lookup rule: every block of a
    request ends most recent (the hit run as read, the rest as written or, when found past the
    first miss, refreshed as a read's lease refreshes it); the least recent goes when full."""
    chains = chains or Chains(requests)
    cache: collections.OrderedDict[int, None] = collections.OrderedDict()
    st = Stats()
    for req in requests:
        st.record(req, leading_run(b in cache for b in req.blocks), block_tokens)
        evicted = []
        for b in req.blocks:
            if b in cache:
                cache.move_to_end(b)
            else:
                cache[b] = None
                st.written += 1
                if len(cache) > capacity:
                    evicted.append(cache.popitem(last=False)[0])
        st.count_evictions(evicted, chains, cache.__contains__)
    st.objects_left = len(cache)
    return st


def ideal_radix(requests: list[Request], capacity: int, block_tokens: int = BLOCK_TOKENS,
                chains: Chains | None = None) -> Stats:
    """An ideal leaf-first radix cache: as ideal_lru, but only a block none of whose children is
    stored may go (the least recent such leaf), and a block whose parent is not stored is not
    inserted, so a stored block's whole prefix stays stored."""
    chains = chains or Chains(requests)
    touched: dict[int, int] = {}          # stored block -> its last touch (a sequence number)
    stored_children: dict[int, int] = collections.defaultdict(int)
    leaves: list[tuple[int, int]] = []   # heap of (touch, block); stale entries skipped
    seq = 0
    st = Stats()

    def evict_one() -> int:
        while leaves:
            touch, b = heapq.heappop(leaves)
            if touched.get(b) == touch and stored_children[b] == 0:
                del touched[b]
                for p in chains.parents.get(b, ()):
                    if p in touched:
                        stored_children[p] -= 1
                        if stored_children[p] == 0:
                            heapq.heappush(leaves, (touched[p], p))
                return b
        raise AssertionError("a full radix cache always has a leaf")

    for req in requests:
        st.record(req, leading_run(b in touched for b in req.blocks), block_tokens)
        evicted = []
        for j, b in enumerate(req.blocks):
            if j and req.blocks[j - 1] not in touched:
                break  # its parent went (the chain is longer than the cache): a tree cannot hold it
            seq += 1
            if b not in touched:
                st.written += 1
                for p in chains.parents.get(b, ()):
                    if p in touched:
                        stored_children[p] += 1
            touched[b] = seq
            if stored_children[b] == 0:
                heapq.heappush(leaves, (seq, b))
            if len(touched) > capacity:
                evicted.append(evict_one())
        st.count_evictions(evicted, chains, touched.__contains__)
    st.objects_left = len(touched)
    return st


IDEALS: dict[str, Callable[..., Stats]] = {"lru": ideal_lru, "radix": ideal_radix}


# ---- progress ------------------------------------------------------------------------------

class Progress:
    """Progress on stderr once a run has taken a second: a line rewritten twice a second on a
    terminal (requests done, rate, ETA), else a plain line every 10 s."""

    def __init__(self, label: str, total: int, stream: TextIO | None):
        self.label, self.total, self.stream = label, total, stream
        self.tty = stream is not None and stream.isatty()
        self.t0 = self.shown = time.monotonic()
        self.printed = False

    def line(self, done: int, now: float) -> str:
        rate = done / (now - self.t0) if now > self.t0 else 0.0
        eta = f", ETA {(self.total - done) / rate:.0f} s" if rate > 0 and done < self.total else ""
        return f"  {self.label}: {done:,}/{self.total:,} requests ({100 * done / self.total:.0f}%), {rate:,.0f}/s{eta}"

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if self.stream is None or now - self.t0 < 1.0 or now - self.shown < (0.5 if self.tty else 10.0):
            return
        self.shown, self.printed = now, True
        text = self.line(done, now)
        self.stream.write(f"\r{text}\x1b[K" if self.tty else text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.printed and self.tty and self.stream is not None:
            self.stream.write(f"\r{self.line(self.total, time.monotonic())}\x1b[K\n")
            self.stream.flush()


# ---- the store replay ------------------------------------------------------------------------

class StoreReplay:
    """One policy's replay on a fresh store: namespace NAMESPACE on the server at `url`, emptied
    before and after; one segment of capacity x block bytes."""

    def __init__(self, url: str, policy, capacity_blocks: int, block_bytes: int = BLOCK_BYTES,
                 block_tokens: int = BLOCK_TOKENS, shards: int = 1, worker: bool = True):
        self.url, self.policy = url, policy
        self.capacity_blocks, self.block_bytes, self.block_tokens = capacity_blocks, block_bytes, block_tokens
        self.shards, self.with_worker = shards, worker
        self.stored: collections.OrderedDict[bytes, int] = collections.OrderedDict()  # key -> block, oldest first
        self.stored_blocks: set[int] = set()
        self.stats = Stats()

    def run(self, requests: list[Request], chains: Chains,
            progress: Callable[[int], None] = lambda done: None) -> Stats:
        config = MasterConfig(namespace=NAMESPACE, shards=self.shards, **self.policy.master_config())
        client = client_from_url(self.url)
        try:
            delete_namespace(client, NAMESPACE)  # an interrupted earlier run's keys
        finally:
            client.close()
        m = Master.connect(self.url, config)
        try:
            self._replay(m, requests, chains, progress)
        finally:
            try:
                delete_namespace(m.redis, NAMESPACE)
            finally:
                m.close()
        return self.stats

    def _replay(self, m: Master, requests: list[Request], chains: Chains, progress) -> None:
        st, policy = self.stats, self.policy
        clock = T0 + requests[0].timestamp
        m.freeze_clock(clock)
        m.mount_segment(SEGMENT, self.capacity_blocks * self.block_bytes, CLIENT)
        worker = Worker(m) if self.with_worker else None
        pinged = clock
        t0 = time.perf_counter()
        for i, req in enumerate(requests):
            now = T0 + req.timestamp
            if now != clock:
                m.freeze_clock(now)
                clock = now
            if now - pinged >= PING_EVERY_MS:
                m.ping(CLIENT)
                pinged = now
            keys = [policy.key(b) for b in req.blocks]
            found = policy.lookup(m, req, keys, now)
            hits = leading_run(found)
            st.record(req, hits, self.block_tokens)
            for key, hit in zip(keys, found):
                if hit and key in self.stored:
                    self.stored.move_to_end(key)
            missing = [j for j, hit in enumerate(found) if not hit]
            # stored as far as the shadow knows, yet not found: dropped since (a member of a
            # group being evicted reads as absent until its put finishes its eviction)
            dropped = [self._forget(keys[j]) for j in missing if keys[j] in self.stored]
            for indexes, rconfig in policy.put_batches(m, req, missing, now):
                self._put(m, [keys[j] for j in indexes], [req.blocks[j] for j in indexes], rconfig,
                          policy.parents(req, indexes))
            if worker is not None:
                st.worker_evicted += worker.run_once().evicted_objects
            usage = m.usage()
            st.guaranteed_peak_bytes = max(st.guaranteed_peak_bytes, usage.guaranteed_bytes)
            self._find_evictions(m, usage.objects, chains, dropped)
            progress(i + 1)
        st.seconds = time.perf_counter() - t0
        u = m.usage()
        st.objects_left, st.used_ratio = u.objects, u.used_bytes / max(u.capacity_bytes, 1)

    def _put(self, m: Master, keys: list[bytes], blocks: list[int], config, parents=None) -> None:
        st = self.stats
        started = m.batch_put_start(CLIENT, keys, [self.block_bytes] * len(keys), config, TENANT, parents)
        ok = []
        for key, block, got in zip(keys, blocks, started):
            if isinstance(got, ErrorCode):
                st.refuse(got)
            else:
                ok.append((key, block))
        for (key, block), code in zip(ok, m.batch_put_end(CLIENT, [k for k, _ in ok], TENANT)):
            if code != ErrorCode.OK:
                st.refuse(code)
            else:
                st.written += 1
                self.stored[key] = block
                self.stored.move_to_end(key)
                self.stored_blocks.add(block)

    def _forget(self, key: bytes) -> int:
        block = self.stored.pop(key)
        self.stored_blocks.discard(block)
        return block

    def _find_evictions(self, m: Master, objects: int, chains: Chains, dropped: list[int]) -> None:
        """Drop from the shadow the blocks the store (holding `objects`) no longer holds; count
        them, with the `dropped` ones the request's lookup found gone, and the orphan-making ones."""
        missing = len(self.stored) - objects
        gone: list[bytes] = []
        keys = iter(self.stored)  # not changed until the scan ends
        chunk = max(2 * missing, 64)
        while missing > 0 and len(gone) < missing:
            batch = [k for _, k in zip(range(chunk), keys)]
            if not batch:
                break
            pipe = m.redis.pipeline(transaction=False)
            for k in batch:
                pipe.exists(m.transport.keys[m.transport.shard_of(k)].object(TENANT, k))
            gone += [k for k, there in zip(batch, pipe.execute()) if not there]
        evicted = dropped + [self._forget(k) for k in gone]
        self.stats.count_evictions(evicted, chains, self.stored_blocks.__contains__)


def replay_store(url: str, requests: list[Request], policy, capacity_blocks: int,
                 block_bytes: int = BLOCK_BYTES, block_tokens: int = BLOCK_TOKENS, shards: int = 1,
                 worker: bool = True, chains: Chains | None = None,
                 progress: Callable[[int], None] = lambda done: None) -> Stats:
    """Replay the requests through a fresh store on the server at `url` under `policy`."""
    run = StoreReplay(url, policy, capacity_blocks, block_bytes, block_tokens, shards, worker)
    return run.run(requests, chains or Chains(requests), progress)


# ---- a whole replay: every capacity, every policy, beside the reference caches ----------------

def trace_summary(path: str | os.PathLike, requests: list[Request], block_tokens: int) -> dict[str, Any]:
    blocks = sum(len(q.blocks) for q in requests)
    distinct = len({b for q in requests for b in q.blocks})
    return {"trace": str(path), "requests": len(requests), "blocks": blocks, "distinct_blocks": distinct,
            "tokens": sum(q.tokens(block_tokens) for q in requests),
            "trace_seconds": (requests[-1].timestamp - requests[0].timestamp) / 1000}


def server_version(url: str) -> str:
    if url.startswith("memory://"):
        return "fakeredis (memory://, in-process)"
    client = client_from_url(url)
    try:
        info = client.info("server")
    finally:
        client.close()
    if "valkey_version" in info:
        return f"valkey-server {info['valkey_version']}"
    return f"redis-server {info.get('redis_version', '?')}"


def run(trace: str | os.PathLike, requests: list[Request], capacities: list[int], policies: list[str],
        url: str | None = None, block_bytes: int = BLOCK_BYTES, block_tokens: int = BLOCK_TOKENS,
        shards: int = 1, worker: bool = True, check: bool = False,
        knobs: dict[str, dict[str, int]] | None = None, progress: TextIO | None = sys.stderr) -> dict[str, Any]:
    """Replay `requests` at every capacity (blocks) under every policy (names of
    replay_policies.POLICIES), each on a fresh store, beside the reference caches. Without `url`
    the stores live on a private Valkey (no AOF) in a temporary directory, removed at the end.
    With `check`, each policy that has a model (replay_model.MODELS) is also run through it, and
    the run's "check" says how far the store and the model are apart.
    Returns the JSON object of docs/replay.md."""
    from .replay_model import MODEL_SHARDS, MODELS
    from .replay_policies import make_policy

    knobs = knobs or {}
    made = {name: make_policy(name, knobs) for name in policies}  # bad names and knobs fail first
    chains = Chains(requests)
    out = trace_summary(trace, requests, block_tokens)
    out.update({"block_tokens": block_tokens, "block_bytes": block_bytes, "shards": shards, "worker": worker,
                "policy_settings": {name: {"summary": p.summary, "knobs": p.knobs()} for name, p in made.items()}})
    infinite = ideal_lru(requests, max(out["distinct_blocks"], 1), block_tokens, chains)
    out["infinite_cache"] = infinite.figures(store=False)
    with url_or_private_valkey(url) as (url, server):
        out["server"] = server_version(url) + (" (private, no AOF)" if server else "")
        out["runs"] = []
        for capacity in capacities:
            entry: dict[str, Any] = {"capacity_blocks": capacity, "policies": {}, "ideal": {}}
            for name, ideal in IDEALS.items():
                entry["ideal"][name] = ideal(requests, capacity, block_tokens, chains).figures(store=False)
            for name in policies:
                bar = Progress(f"{name} @ {capacity:,} blocks", len(requests), progress)
                try:
                    policy = make_policy(name, knobs)
                    st = replay_store(url, requests, policy, capacity, block_bytes, block_tokens, shards,
                                      worker, chains, bar)
                finally:
                    bar.close()
                entry["policies"][name] = st.figures() | policy.figures()
                if check and name in MODELS and shards in MODEL_SHARDS.get(name, (shards,)):
                    model = MODELS[name](requests, capacity, block_bytes, block_tokens, shards, worker, chains,
                                         MasterConfig(shards=shards, **policy.master_config()))
                    entry.setdefault("check", {})[name] = check_figures(st, model)
            out["runs"].append(entry)
    if len(out["runs"]) == 1:
        out.update(out["runs"][0])
    return out


CHECK_TOLERANCE = 0.002  # the largest block hit rate difference between store and model that --check accepts


def check_figures(store: Stats, model: Stats) -> dict[str, Any]:
    diff = store.block_hit_rate - model.block_hit_rate
    return {"model": model.figures(store=False) | {"puts_refused": dict(sorted(model.puts_refused.items()))},
            "block_hit_rate_difference": diff, "agrees": abs(diff) <= CHECK_TOLERANCE}
