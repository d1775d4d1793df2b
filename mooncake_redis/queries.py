"""Store-wide queries that Mooncake's master answers from its own memory: cache statistics
(CalcCacheStats) and the clients' segments. Each reads the shards in one pipelined round trip
of O(1) commands per shard (or per segment), with no function call: nothing here writes."""
from __future__ import annotations

from dataclasses import dataclass

from .api import ApiBase
from .checks import _check_name
from .figures import Figures, note

GATEWAY_FIELDS = ("gw_reads", "gw_read_hits")  # of shard 0's hash P, added by the gateways' heartbeats


def _rate(part: int, whole: int) -> float:
    """Mooncake's rounding of its ratios: two decimals, 0 when there is no denominator."""
    return round(part / whole, 2) if whole > 0 else 0.0


@dataclass(frozen=True)
class CacheStats:
    """What Mooncake's CalcCacheStats reports, from this store.

    reads: GetReplicaList keys the gateways served (each one, found or not); hits: those they
    answered with a replica (Mooncake clients read memory replicas only); cached_objects:
    complete objects now (puts in progress are not counted). reads and hits are cumulative
    counters kept in the store (across restarts; a gateway adds its own with each heartbeat,
    every 5 s); reads through the Python API are not counted."""
    reads: int
    hits: int
    cached_objects: int

    def mooncake(self) -> dict[int, float]:
        """As Mooncake's CalcCacheStats dict (CacheHitStat number -> value): MEMORY_HITS 0,
        MEMORY_TOTAL 2, MEMORY_HIT_RATE 4 (hits per cached object, as Mooncake's: it may pass
        1), OVERALL_HIT_RATE 6 (the same: no disk hits here), VALID_GET_RATE 7. SSD_HITS 1,
        SSD_TOTAL 3 and SSD_HIT_RATE 5 are left out: a Mooncake client never reads this store's
        disk replicas, and the store does not count the objects that have one."""
        per_object = _rate(self.hits, self.cached_objects)
        return {0: float(self.hits), 2: float(self.cached_objects), 4: per_object, 6: per_object,
                7: _rate(self.hits, self.reads)}


class QueriesApi(ApiBase):
    def cache_stats(self) -> CacheStats:
        """The gateways' read counters and the number of complete objects (a malformed counter
        reads as 0, with a logged warning, as in usage())."""
        t = self.transport
        cmds: list[tuple] = [("HMGET", t.keys[0].P, *GATEWAY_FIELDS)]
        cmds += [cmd for k in t.keys for cmd in (("HGET", k.P, "objects"), ("ZCARD", k.processing))]
        rows = t.run(cmds)
        f = Figures("P.")
        reads, hits = (f.get(name, raw) for name, raw in zip(GATEWAY_FIELDS, rows[0]))
        note(self.malformed_seen, 0, [f"P.{name}" for name in GATEWAY_FIELDS], f.malformed)
        cached = 0
        for shard in range(len(t.keys)):
            g = Figures("P.")
            objects = g.get("objects", rows[1 + 2 * shard])
            note(self.malformed_seen, shard, ["P.objects"], g.malformed)
            cached += max(0, objects - rows[2 + 2 * shard])
        return CacheStats(reads, hits, cached)

    def segment_names(self) -> list[str]:
        """The names of the mounted segments, sorted (shard 0 holds a slice of every one)."""
        names = self.transport.run([("ZRANGE", self.transport.keys[0].segments, 0, -1)])[0]
        return sorted(n.decode(errors="surrogateescape") for n in names)

    def segment_usage(self, name: str) -> tuple[int, int] | None:
        """(used bytes, size) of a mounted segment summed over its slices, or None when it is not
        mounted (Mooncake's QuerySegments)."""
        _check_name(name, "segment name", 1024)
        rows = self.transport.run([("HMGET", k.segment(name), "used", "size") for k in self.transport.keys])
        if all(row[1] is None for row in rows):
            return None
        used = size = 0
        for shard, (raw_used, raw_size) in enumerate(rows):
            f = Figures(f"P:seg:{name}.")
            used, size = used + f.get("used", raw_used), size + f.get("size", raw_size)
            note(self.malformed_seen, shard, [f"P:seg:{name}.used", f"P:seg:{name}.size"], f.malformed)
        return used, size
