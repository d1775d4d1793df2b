"""The key schema and shard routing: the one Python home of every Redis key name.

Every key of shard i starts with the shard key `<ns>:{<ns>:<i>}`; the braces make it a Redis
Cluster hash tag, so one shard's keys share a slot. The rest of a key is one of the suffixes in
`K`, which mirrors the `K` table of lua/lib/00_base.lua (tests/test_key_schema.py checks that
they agree); `ShardKeys` builds a shard's keys from it, so no other module spells a suffix.

An object's shard comes from its routing part: a `{tag}` inside the user key if present, else
its prefix hash (`prefix_of`: the first group of the store's radix_key_pattern, by default the
64 lowercase hex characters of a page hash, at the start or after a `<tag>_`, followed by `_` or
the end: profile "sglang" of KEY_PROFILES), else the whole key; shard =
first 8 bytes of blake3(routing part), big-endian, modulo the shard count. The same extraction
gives the radix node of a key and the prefix of expire_guaranteed, so all keys of a node live on
the node's shard.
"""
from __future__ import annotations

import re

from blake3 import blake3

# Key profiles (MasterConfig.key_profile): the radix_key_pattern of each engine's key format,
# recorded with its sources in docs/engines.md. The default, "sglang", takes the 64-hex page hash
# after an optional `<tag>_` (SGLang HiCache's `<tag>_<model>_<hash>_<rank>_k`, MLA's
# `<tag>_<model>_<hash>__k`, and untagged keys that start with the hash); "hash-first" is the
# former default (the blake3 rule of Mooncake's radix RFC: the hash at the key's start only).
HASH_FIRST_PATTERN = r"^([0-9a-f]{64})(?:_|$)"
KEY_PROFILES: dict[str, str] = {
    "sglang": r"^(?:.*?_)?([0-9a-f]{64})(?:_|$)",
    "hash-first": HASH_FIRST_PATTERN,
    "vllm": r"^.*@([0-9a-f]{32,128})$",
    "lmcache": r"^[^@]*@[0-9]+@[0-9]+@(-?[0-9a-f]{1,128})@",
}
CUSTOM_PROFILE = "custom"  # the key_profile of a pattern that is none of KEY_PROFILES'
DEFAULT_KEY_PROFILE = "sglang"
DEFAULT_KEY_PATTERN = KEY_PROFILES[DEFAULT_KEY_PROFILE]
# The rule of stores written before the pattern was configurable (their config hash has no
# radix_key_pattern field; Master keeps routing them by it).
LEGACY_KEY_PATTERN = r"^([0-9a-f]{32,128})(?:_|$)"
PREFIX_KEY_RE = re.compile(DEFAULT_KEY_PATTERN.encode())


def profile_of(pattern: str) -> str:
    """The key profile whose pattern `pattern` is, or CUSTOM_PROFILE."""
    return next((name for name, p in KEY_PROFILES.items() if p == pattern), CUSTOM_PROFILE)

# Fields of P:config that are not configuration: the store clock's test hook (absolute ms; absent
# in production) and the mount epoch (lua/lib/00_base.lua).
CLOCK_FIELD, MOUNT_EPOCH_FIELD = "clock", "mounts"
HELD_DUE_FIELD = "held_due"  # P:config: no P:held entry is due before it (lua/lib/10_alloc.lua)
# P:config: a field whose value is longer than hash-max-listpack-value (64 bytes unless an operator
# raised it) keeps the hash a hashtable. Every function call reads up to 20 of its fields, which a
# listpack finds by linear scans (an absent field, such as the clock in production, by a whole one):
# 3-7% of a call's server instructions (docs/bench.md).
HASHTABLE_FIELD = "keep_hashtable"
HASHTABLE_NOTE = ("this value is longer than hash-max-listpack-value so that this hash stays a hashtable: "
                  "every function call looks up fields of it, which a listpack finds by linear scans")

# Key suffixes after the shard key P, named as in Lua's K table (the key schema table of docs/keys.md).
K: dict[str, str] = {
    "config": ":config", "mount_seq": ":mount_seq",
    "segment": ":seg:", "segments": ":segs", "free": ":free:", "free_by_off": ":by_off", "free_by_size": ":by_size",
    "segments_draining": ":segs_draining",  # graceful unmounts: segment -> its deadline
    "host_segments": ":hsegs:",  # a host's segments (set), for put_start's prefer_same_host
    "repl_due": ":repl_due",  # replications in flight (lua/lib/47_replication.lua)
    "task": ":task:", "task_queue": ":taskq:", "tasks_due": ":tasks_due", "tasks_done": ":tasks_done",
    "held": ":held", "processing": ":processing", "clients": ":clients", "expired_clients": ":expired_clients",
    "object": ":obj:", "group": ":grp:", "group_members": ":grpm:", "aggregate": ":agg:",
    "tier_ordinary": ":evict:ordinary", "tier_soft": ":evict:soft", "draining": ":evict:draining",
    "deadline_soft_pin": ":deadline:soft_pin", "sweep_pending": ":sweep_pending", "worker": ":worker",
    "guaranteed": ":guaranteed", "guaranteed_tenants": ":gtenants", "guarantee_prefix": ":gpfx:",
    "metrics": ":metrics",  # Python only: the workers' counters (not master state)
    # the radix index (lua/lib/32_radix.lua)
    "radix_node": ":rnode:", "radix_keys": ":rkeys:", "radix_kids": ":rkids:",
    "radix_outbox": ":routbox",
    # group retention: its tiers, its deadline index, its per-tenant counts
    "tier_retained": ":evict:retained", "tier_soft_retained": ":evict:soft_retained",
    "deadline_retention": ":deadline:retention", "retained_tenants": ":retained_tenants",
    # SSD offload: local disk segments, per-client queues (and HIGH overflow), tasks in flight,
    # files to remove
    "disk": ":disk:", "disks": ":disks", "offload_queue": ":offq:", "offload_overflow": ":offover:",
    "offload_inflight": ":offload_inflight", "disk_removals": ":diskrm:",
    "offload_evict": ":offload_evict",  # objects eviction queued for offload (offload_on_evict)
    # the Mooncake wire gateway: segment facts, the transfer engine's metadata, the gateways serving
    "gw_segment": ":gwseg:", "gw_segment_ids": ":gwsegids", "gw_segments": ":gwsegs", "gw_metadata": ":gwmeta",
    "gateways": ":gateways", "gateway": ":gateway:",
    # KV events (mooncake_redis.events): the shard's stream
    "events": ":events",
}
PYTHON_ONLY = frozenset({"metrics"})  # the names of K that no function uses
# The eviction candidate tiers in eviction order (Lua's Units.TIERS): the name status and the
# metrics give each, and its key in K.
TIERS = (("ordinary", "tier_ordinary"), ("soft_pinned", "tier_soft"), ("retained", "tier_retained"),
         ("soft_pinned_retained", "tier_soft_retained"))

_KB = {name: suffix.encode() for name, suffix in K.items()}


def _b(part: str | bytes) -> bytes:
    return part.encode() if isinstance(part, str) else bytes(part)


class ShardKeys:
    """The keys of one shard, as bytes (object keys and segment names are arbitrary bytes).
    Fixed keys are attributes named as in `K`; keys with a variable part are methods."""

    def __init__(self, namespace: str, shard: int):
        self.namespace = namespace
        self.shard = shard
        self.P = P = shard_key(namespace, shard).encode()  # also the hash of the shard's counters
        self.config = P + _KB["config"]
        self.mount_seq = P + _KB["mount_seq"]
        self.segments = P + _KB["segments"]
        self.segments_draining = P + _KB["segments_draining"]
        self.held = P + _KB["held"]
        self.repl_due = P + _KB["repl_due"]
        self.tasks_due = P + _KB["tasks_due"]
        self.tasks_done = P + _KB["tasks_done"]
        self.processing = P + _KB["processing"]
        self.clients = P + _KB["clients"]
        self.expired_clients = P + _KB["expired_clients"]
        self.tier_ordinary = P + _KB["tier_ordinary"]
        self.tier_soft = P + _KB["tier_soft"]
        self.draining = P + _KB["draining"]
        self.deadline_soft_pin = P + _KB["deadline_soft_pin"]
        self.sweep_pending = P + _KB["sweep_pending"]
        self.worker = P + _KB["worker"]
        self.guaranteed = P + _KB["guaranteed"]
        self.guaranteed_tenants = P + _KB["guaranteed_tenants"]
        self.metrics = P + _KB["metrics"]
        # every index an eviction unit can sit in
        self.unit_indexes: tuple[bytes, ...] = (self.tier_ordinary, self.tier_soft, self.deadline_soft_pin,
                                                self.draining)
        # group retention: the fallback level's other tiers, the retention records' deadline index
        self.tier_retained = P + _KB["tier_retained"]
        self.tier_soft_retained = P + _KB["tier_soft_retained"]
        self.deadline_retention = P + _KB["deadline_retention"]
        self.retained_tenants = P + _KB["retained_tenants"]
        self.tiers = tuple(getattr(self, attr) for _, attr in TIERS)  # eviction candidates, in eviction order
        self.unit_indexes += (self.tier_retained, self.tier_soft_retained)
        # the radix index: the outbox of cross-shard steps
        self.radix_outbox = P + _KB["radix_outbox"]
        # SSD offload
        self.disks = P + _KB["disks"]
        self.offload_inflight = P + _KB["offload_inflight"]
        self.offload_evict = P + _KB["offload_evict"]
        # the Mooncake wire gateway (kept on shard 0)
        self.gw_segment_ids = P + _KB["gw_segment_ids"]
        self.gw_segments = P + _KB["gw_segments"]
        self.gw_metadata = P + _KB["gw_metadata"]
        self.gateways = P + _KB["gateways"]
        self.events = P + _KB["events"]  # the KV event stream (kv_events_maxlen > 0)

    def disk(self, client: str | bytes) -> bytes:
        """A client's local disk segment on this shard (hash)."""
        return self.P + _KB["disk"] + _b(client)

    def offload_queue(self, client: str | bytes) -> bytes:
        """A client's offload queue on this shard (zset)."""
        return self.P + _KB["offload_queue"] + _b(client)

    def offload_overflow(self, client: str | bytes) -> bytes:
        """A client's HIGH entries that found its queue full of HIGH entries (zset)."""
        return self.P + _KB["offload_overflow"] + _b(client)

    def disk_removals(self, client: str | bytes) -> bytes:
        """The files a client is to remove from its disk (zset, lua/lib/27_disk.lua)."""
        return self.P + _KB["disk_removals"] + _b(client)

    def gw_segment(self, name: str | bytes) -> bytes:
        """A segment's facts as a gateway recorded them (uuid, client, endpoint, ...; hash)."""
        return self.P + _KB["gw_segment"] + _b(name)

    def gateway(self, gateway_id: str | bytes) -> bytes:
        """A serving gateway's addresses (hash)."""
        return self.P + _KB["gateway"] + _b(gateway_id)

    def prefix(self, name: str) -> bytes:
        """P + the suffix `name` of K: the start of a family of keys, e.g. for a SCAN MATCH."""
        return self.P + _KB[name]

    def segment(self, name: str | bytes) -> bytes:
        return self.P + _KB["segment"] + _b(name)

    def host_segments(self, host: str | bytes) -> bytes:
        """The set of the segments mounted on this shard with that host (mount_segment's host)."""
        return self.P + _KB["host_segments"] + _b(host)

    def free(self, segment: str | bytes) -> tuple[bytes, bytes]:
        """The free lists of a segment's slice: (by_off, by_size)."""
        base = self.P + _KB["free"] + _b(segment)
        return base + _KB["free_by_off"], base + _KB["free_by_size"]

    def free_segment(self, key: bytes) -> bytes | None:
        """The segment whose free list `key` is (the inverse of free), or None."""
        prefix = self.P + _KB["free"]
        if key.startswith(prefix):
            for suffix in (_KB["free_by_off"], _KB["free_by_size"]):
                if key.endswith(suffix) and len(key) > len(prefix) + len(suffix):
                    return key[len(prefix):-len(suffix)]
        return None

    def task(self, task_id: str | bytes) -> bytes:
        return self.P + _KB["task"] + _b(task_id)

    def task_queue(self, client: str | bytes) -> bytes:
        return self.P + _KB["task_queue"] + _b(client)

    def object(self, tenant: str | bytes, key: str | bytes) -> bytes:
        return self.P + _KB["object"] + _b(tenant) + b":" + _b(key)

    def group(self, tenant: str | bytes, group: str | bytes) -> bytes:
        return self.P + _KB["group"] + _b(tenant) + b":" + _b(group)

    def group_members(self, tenant: str | bytes, group: str | bytes) -> bytes:
        return self.P + _KB["group_members"] + _b(tenant) + b":" + _b(group)

    def guarantee_prefix(self, tenant: str | bytes, prefix: str | bytes) -> bytes:
        """The set of a tenant's guaranteed keys under one prefix hash (expire_guaranteed)."""
        return self.P + _KB["guarantee_prefix"] + _b(tenant) + b":" + _b(prefix)

    def radix_node(self, tenant: str | bytes, node: str | bytes) -> bytes:
        """A radix node's record (parent, created, its unit's counters)."""
        return self.P + _KB["radix_node"] + _b(tenant) + b":" + _b(node)

    def radix_keys(self, tenant: str | bytes, node: str | bytes) -> bytes:
        return self.P + _KB["radix_keys"] + _b(tenant) + b":" + _b(node)

    def radix_kids(self, tenant: str | bytes, node: str | bytes) -> bytes:
        return self.P + _KB["radix_kids"] + _b(tenant) + b":" + _b(node)

    def aggregate(self, kind: str | bytes, unit: str | bytes) -> bytes:
        """A composite unit's per-member values, e.g. aggregate("soft_pin", b"g:<tenant>:<group>")."""
        return self.P + _KB["aggregate"] + _b(kind) + b":" + _b(unit)

    def __repr__(self) -> str:
        return f"ShardKeys({self.namespace!r}, {self.shard})"


def shard_key(namespace: str, shard: int) -> str:
    return f"{namespace}:{{{namespace}:{shard}}}"


def compile_key_pattern(pattern: str) -> re.Pattern:
    """A radix_key_pattern as the bytes regex prefix_of uses; ValueError unless it compiles and
    has exactly one group."""
    try:
        rx = re.compile(pattern.encode())
    except (re.error, AttributeError, UnicodeEncodeError) as exc:
        raise ValueError(f"bad regex: {exc}") from None
    if rx.groups != 1:
        raise ValueError("it must have exactly one group (the prefix hash)")
    return rx


def prefix_of(key: bytes, pattern: re.Pattern | None = None) -> bytes:
    """A key's prefix hash: the first group of `pattern` (default PREFIX_KEY_RE, the default
    radix_key_pattern) matched at the key's start, or the key itself when it does not match: the
    one extraction rule of routing, guarantees by prefix (expire_guaranteed) and the radix
    index."""
    m = (pattern or PREFIX_KEY_RE).match(key)
    return m.group(1) if m and m.group(1) else key


def routing_part(key: bytes, pattern: re.Pattern | None = None) -> bytes:
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            return key[start + 1:end]
    return prefix_of(key, pattern)


def shard_of(key: bytes, shards: int, pattern: re.Pattern | None = None) -> int:
    if shards == 1:
        return 0
    digest = blake3(routing_part(key, pattern)).digest(8)
    return int.from_bytes(digest, "big") % shards


def group_routing_part(group: bytes, pattern: re.Pattern | None = None) -> bytes:
    """A group id's routing part: a key's rule (a `{tag}`, else the pattern's prefix hash), and
    for an id of the form `<namespace>:<key>` that neither matches (SGLang's
    `sglang-hicache:<page key>`, untagged, or under a hash-first pattern) the prefix hash of
    `<key>`. So a group named after a page key shares that page's shard with its keys."""
    part = routing_part(group, pattern)
    if part == group:
        _, sep, rest = group.partition(b":")
        m = (pattern or PREFIX_KEY_RE).match(rest) if sep else None
        if m and m.group(1):
            return m.group(1)
    return part


def group_shard_of(group: bytes, shards: int, pattern: re.Pattern | None = None) -> int:
    """The shard of a group id (its record and its members): see group_routing_part."""
    if shards == 1:
        return 0
    return int.from_bytes(blake3(group_routing_part(group, pattern)).digest(8), "big") % shards


def node_shard(node: bytes, shards: int) -> int:
    """The shard of radix node `node` (a prefix hash): where its record and all its keys live.
    A hash routes as itself (no {tag}, no pattern applied)."""
    if shards == 1:
        return 0
    return int.from_bytes(blake3(node).digest(8), "big") % shards


def object_key(namespace: str, shard: int, tenant: str, key: bytes) -> bytes:
    return ShardKeys(namespace, shard).object(tenant, key)


def segment_slice(base: int, size: int, shard: int, shards: int) -> tuple[int, int]:
    """The part of a segment that shard `shard` allocates from: (slice base, slice size)."""
    lo = base + shard * size // shards
    hi = base + (shard + 1) * size // shards
    return lo, hi - lo
