"""A plain-Python model of the store under the replay's `lru` policy, written from the store's
documented rules (docs/keys.md, eviction units; docs/protocol.md, mc_evict; lua/ops/put_start.lua,
lua/ops/evict.lua), not from its
code paths: `mooncake-redis replay --check` runs it beside the store and reports how far the
two are apart.

What it models, per shard (a block's shard is keys.shard_of of its key; a shard allocates from
its slice of the one segment, keys.segment_slice, so it holds slice // block bytes blocks):
- a read (exist_key) of a stored block leases it until at least now + default_kv_lease_ttl:
  a lease short of that is renewed to it rounded up to a multiple of kv_lease_slack, a longer
  one is left as it is;
- a write fills a free slot; with none, evict-on-put evicts the eviction candidate with the
  lowest score (its lease deadline; a block written and never read scores its write time), ties
  by unit name `o:<tenant>:<key>` in byte order, only if that score is <= now (unleased); with no
  candidate the put is refused (NO_AVAILABLE_HANDLE) and the shard remembers a failed put;
- the blocks of the batch being written are not candidates until their put ends (score = now);
- Worker.run_once after a request: on a shard whose used bytes exceed the high watermark (or
  that had a failed put), evict candidates, lowest first, until used bytes <= floor(capacity x
  (high watermark - eviction ratio)) or no candidate is left.
"""
from __future__ import annotations

import heapq
import math

from mooncake_redis import ErrorCode, MasterConfig
from mooncake_redis.keys import segment_slice, shard_of

from .replay import BLOCK_BYTES, BLOCK_TOKENS, T0, TENANT, Chains, Request, Stats, leading_run
from .replay_policies import Lru, Radix


class ShardModel:
    def __init__(self, slots: int, capacity_bytes: int, block_bytes: int, config: MasterConfig):
        self.slots, self.capacity_bytes, self.block_bytes = slots, capacity_bytes, block_bytes
        self.config = config
        self.score: dict[int, int] = {}     # stored block -> its eviction score
        self.heap: list[tuple[int, bytes, int]] = []  # (score, unit name, block); stale entries skipped
        self.put_failed = False

    def unit(self, block: int) -> bytes:
        return f"o:{TENANT}:".encode() + Lru().key(block)

    def set_score(self, block: int, score: int) -> None:
        self.score[block] = score
        heapq.heappush(self.heap, (score, self.unit(block), block))

    def lease(self, block: int, now: int) -> None:
        """A read at `now` (extend_lease): a lease short of now + ttl is renewed to that, rounded
        up to a multiple of the slack."""
        until, slack = now + self.config.default_kv_lease_ttl, self.config.kv_lease_slack
        if until > self.score[block]:
            self.set_score(block, -(-until // slack) * slack if slack else until)

    def pop_candidate(self, now: int) -> int | None:
        """Evict the lowest-scored unleased block; None when there is none. (Blocks of the batch
        being written have no score yet: they are no candidates.)"""
        while self.heap:
            score, _, block = self.heap[0]
            if self.score.get(block) != score:
                heapq.heappop(self.heap)
                continue
            if score > now:
                return None
            heapq.heappop(self.heap)
            del self.score[block]
            return block
        return None

    def used_bytes(self) -> int:
        return len(self.score) * self.block_bytes


def model_lru(requests: list[Request], capacity_blocks: int, block_bytes: int = BLOCK_BYTES,
              block_tokens: int = BLOCK_TOKENS, shards: int = 1, worker: bool = True,
              chains: Chains | None = None, config: MasterConfig | None = None) -> Stats:
    """The model's figures for the replay of `requests` under `lru` (see the module doc)."""
    chains = chains or Chains(requests)
    config = config or MasterConfig(shards=shards)
    size = capacity_blocks * block_bytes
    models = []
    for s in range(shards):
        _, slice_bytes = segment_slice(0, size, s, shards)
        models.append(ShardModel(slice_bytes // block_bytes, slice_bytes, block_bytes, config))
    policy = Lru()
    shard_cache: dict[int, ShardModel] = {}

    def shard(block: int) -> ShardModel:
        m = shard_cache.get(block)
        if m is None:
            m = shard_cache[block] = models[shard_of(policy.key(block), shards)]
        return m

    st = Stats()
    stored: set[int] = set()
    for req in requests:
        now = T0 + req.timestamp
        found = [b in stored for b in req.blocks]
        for b, hit in zip(req.blocks, found):
            if hit:
                shard(b).lease(b, now)
        st.record(req, leading_run(found), block_tokens)
        evicted: list[int] = []
        writing = [b for b, hit in zip(req.blocks, found) if not hit]
        done: list[int] = []
        for b in writing:
            m = shard(b)
            if len(m.score) + sum(1 for d in done if shard(d) is m) >= m.slots:
                victim = m.pop_candidate(now) if config.evict_on_put else None
                if victim is None:
                    st.refuse(ErrorCode.NO_AVAILABLE_HANDLE)
                    m.put_failed = True
                    continue
                stored.discard(victim)
                evicted.append(victim)
            done.append(b)
        for b in done:
            shard(b).set_score(b, now)
            stored.add(b)
            st.written += 1
        if worker:
            for m in models:
                if m.used_bytes() <= m.capacity_bytes * config.eviction_high_watermark_ratio and not m.put_failed:
                    continue
                target = math.floor(m.capacity_bytes * (config.eviction_high_watermark_ratio - config.eviction_ratio))
                first = True  # after a failed put, at least one goes even at the target
                while m.used_bytes() > target or (first and m.put_failed):
                    first = False
                    victim = m.pop_candidate(now)
                    if victim is None:
                        break
                    stored.discard(victim)
                    evicted.append(victim)
                    st.worker_evicted += 1
                m.put_failed = False
        st.count_evictions(evicted, chains, stored.__contains__)
    st.objects_left = len(stored)
    st.used_ratio = len(stored) * block_bytes / size if size else 0.0
    return st


class RadixShardModel(ShardModel):
    """A shard under the radix policy (docs/radix.md): a block's node is a unit
    r:<tenant>:<hash>; a block is a candidate only while no stored block names it as its parent
    (children counted per parent whether the parent is stored or not: a parent not stored is a
    shell), and when its last child goes it is a candidate at once (one shard: the cascade
    happens in the same step)."""

    def __init__(self, *args, kids: dict[int, int]):
        super().__init__(*args)
        self.kids = kids  # block -> stored children (all shards share one table)

    def unit(self, block: int) -> bytes:
        return f"r:{TENANT}:".encode() + Radix.prefix_hash(block).encode()

    def pop_candidate(self, now: int) -> int | None:
        while self.heap:
            score, _, block = self.heap[0]
            if self.score.get(block) != score or self.kids.get(block, 0) > 0:
                heapq.heappop(self.heap)  # stale, or protected by a child (pushed again when freed)
                continue
            if score > now:
                return None
            heapq.heappop(self.heap)
            del self.score[block]
            return block
        return None


def model_radix(requests: list[Request], capacity_blocks: int, block_bytes: int = BLOCK_BYTES,
                block_tokens: int = BLOCK_TOKENS, shards: int = 1, worker: bool = True,
                chains: Chains | None = None, config: MasterConfig | None = None) -> Stats:
    """The model's figures for the replay under `radix`: as model_lru, with leaf-first candidates
    (RadixShardModel), a request's missing blocks written in one batch, each naming its own parent
    (batch_put_start's `parents`: every block is in progress, no candidate, until the batch's
    put_end; a put links its node before evict-on-put makes room), and a block's parent the block
    before it in the request (the first registration stays). One shard only: with several, the
    parent's shard learns of an evicted child through the outbox, which this model does not
    follow."""
    if shards != 1:
        raise ValueError("model_radix models one shard")
    chains = chains or Chains(requests)
    config = config or MasterConfig(shards=1)
    size = capacity_blocks * block_bytes
    kids: dict[int, int] = {}
    m = RadixShardModel(capacity_blocks, size, block_bytes, config, kids=kids)
    parent_of: dict[int, int | None] = {}  # block -> its registered parent (while its node exists)
    st = Stats()
    stored: set[int] = set()

    writing: list[int] = []  # the request's blocks put_started, in progress (no candidates) until the batch ends

    def drop(victim: int, evicted: list[int]) -> None:
        stored.discard(victim)
        evicted.append(victim)
        if kids.get(victim, 0) == 0:  # its node goes; its parent may become a leaf
            p = parent_of.pop(victim, None)
            if p is not None:
                kids[p] -= 1
                if kids[p] == 0:
                    del kids[p]
                    if p in m.score:
                        m.set_score(p, m.score[p])
                    elif p not in stored and p not in writing:
                        parent_of.pop(p, None)  # an empty shell goes too (its own parent keeps a phantom count)

    for req in requests:
        now = T0 + req.timestamp
        found = [b in stored for b in req.blocks]
        for b, hit in zip(req.blocks, found):
            if hit:
                m.lease(b, now)
        st.record(req, leading_run(found), block_tokens)
        evicted: list[int] = []
        writing.clear()
        for j, (b, hit) in enumerate(zip(req.blocks, found)):
            if hit:
                continue
            if b not in parent_of:  # registered (and linked) before evict-on-put makes room
                p = req.blocks[j - 1] if j else None
                parent_of[b] = p
                if p is not None:
                    kids[p] = kids.get(p, 0) + 1
            if len(m.score) + len(writing) >= m.slots:
                victim = m.pop_candidate(now) if config.evict_on_put else None
                if victim is None:
                    st.refuse(ErrorCode.NO_AVAILABLE_HANDLE)
                    m.put_failed = True
                    if kids.get(b, 0) == 0:  # the refused key's empty node goes again
                        evicted_none: list[int] = []
                        stored.add(b)
                        drop(b, evicted_none)
                    continue
                drop(victim, evicted)
            writing.append(b)
        for b in writing:  # the batch's put_ends: its blocks become candidates together
            m.set_score(b, now)
            stored.add(b)
            st.written += 1
        if worker and (m.used_bytes() > m.capacity_bytes * config.eviction_high_watermark_ratio or m.put_failed):
            target = math.floor(m.capacity_bytes * (config.eviction_high_watermark_ratio - config.eviction_ratio))
            first = True
            while m.used_bytes() > target or (first and m.put_failed):
                first = False
                victim = m.pop_candidate(now)
                if victim is None:
                    break
                drop(victim, evicted)
                st.worker_evicted += 1
            m.put_failed = False
        st.count_evictions(evicted, chains, stored.__contains__)
    st.objects_left = len(stored)
    st.used_ratio = len(stored) * block_bytes / size if size else 0.0
    return st


# policy name -> its model, called as model(requests, capacity_blocks, block_bytes, block_tokens,
# shards, worker, chains)
MODELS = {"lru": model_lru, "radix": model_radix}
MODEL_SHARDS = {"radix": (1,)}  # shard counts a model covers, when not every one
