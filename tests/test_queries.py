"""Store-wide queries: the read counters behind CalcCacheStats, the segment list and one
segment's usage (Mooncake's GetAllSegments / QuerySegments)."""
from __future__ import annotations

import pytest
from helpers import OWNER, WRITER, mount, put, raises_code, shard_keys

from mooncake_redis import ErrorCode, ReplicateConfig
from mooncake_redis.fsck import fsck
from mooncake_redis.gateway.store import GatewayStore
from mooncake_redis.queries import CacheStats


def test_a_fresh_store_counts_nothing(master):
    stats = master.cache_stats()
    assert stats == CacheStats(reads=0, hits=0, cached_objects=0)
    assert stats.mooncake() == {0: 0.0, 2: 0.0, 4: 0.0, 6: 0.0, 7: 0.0}


def test_cached_objects_are_the_complete_ones_and_reads_come_from_the_gateways(master):
    mount(master, "seg", 1 << 16)
    for key in ("a", "b", "c"):
        put(master, key, 100)
    master.put_start(WRITER, "busy", 100)  # in progress: not cached
    master.get_replica_list("a")  # a read through the Python API is not counted
    assert master.cache_stats() == CacheStats(reads=0, hits=0, cached_objects=3)
    store = GatewayStore(master)
    store.heartbeat("gw-1", "127.0.0.1:1", "", 15_000, reads=4, read_hits=3)
    store.heartbeat("gw-2", "127.0.0.1:2", "", 15_000, reads=1)
    store.heartbeat("gw-1", "127.0.0.1:1", "", 0)  # leaving keeps what it counted
    stats = master.cache_stats()
    assert stats == CacheStats(reads=5, hits=3, cached_objects=3)
    assert stats.mooncake() == {0: 3.0, 2: 3.0, 4: 1.0, 6: 1.0, 7: 0.6}
    master.remove("b", force=True)
    assert master.cache_stats().cached_objects == 2
    assert fsck(master).ok


@pytest.mark.parametrize("reads, hits", [(-1, 0), (1, 2), (0, -1), (2**53, 0)])
def test_a_heartbeat_with_bad_counts_is_refused_and_counts_nothing(master, reads, hits):
    with raises_code(ErrorCode.INVALID_PARAMS):
        GatewayStore(master).heartbeat("gw", "127.0.0.1:1", "", 15_000, reads=reads, read_hits=hits)
    for argv in ([f"{reads}", f"{hits}"], ["1.5", "0"], ["x", "0"]):  # the function checks as well
        with raises_code(ErrorCode.INVALID_PARAMS):
            master.transport.call("mc_gw_heartbeat", 0, 6, "id", "gw", "rpc", "r", "metadata", "", "ttl_ms",
                                  "1000", "reads", argv[0], "read_hits", argv[1])
    assert master.cache_stats().reads == 0
    assert master.redis.exists(shard_keys(master, 0).gateway("gw")) == 0


def test_a_malformed_counter_reads_as_0_and_fsck_reports_it(master):
    GatewayStore(master).heartbeat("gw", "127.0.0.1:1", "", 15_000, reads=2, read_hits=1)
    master.redis.hset(shard_keys(master, 0).P, "gw_reads", "many")
    assert master.cache_stats() == CacheStats(reads=0, hits=1, cached_objects=0)
    assert [f.subject for f in fsck(master).findings if f.kind == "bad_figure"] == ["P.gw_reads"]


def test_segment_names_and_usage(master):
    size = mount(master, "seg-b", 1 << 12)
    mount(master, "seg-a", 1 << 12)
    put(master, "k", 100, config=ReplicateConfig(preferred_segments=("seg-b",)))
    assert master.segment_names() == ["seg-a", "seg-b"]
    assert master.segment_usage("seg-b") == (100, size)
    assert master.segment_usage("seg-a") == (0, size)
    assert master.segment_usage("nope") is None
    master.unmount_segment("seg-b", OWNER)
    assert master.segment_names() == ["seg-a"]
    assert master.segment_usage("seg-b") is None


@pytest.mark.parametrize("bad", ["", "x" * 1025])
def test_segment_usage_refuses_a_bad_name(master, bad):
    with raises_code(ErrorCode.INVALID_PARAMS):
        master.segment_usage(bad)
