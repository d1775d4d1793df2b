"""Hardening: nothing lost after an outage, no partial write on any error path, numbers only in
canonical form, every function behind one entry check, repairs that cannot corrupt, and calls
that bound their own work whatever a caller sends. Raw FCALL where the wire is at fault."""
from __future__ import annotations

import pytest
import redis

from helpers import (OWNER, replicas_in, T0, WATERMARKS, WRITER, all_shard_keys, code_of, keys_on_shard, mount, put, raises_code, shard_keys,
                     shard_of_key, slice_of, store_snapshot, watched_silence)
from mooncake_redis import ErrorCode, Master, MasterConfig, ReplicateConfig
from mooncake_redis.fsck import fsck
from mooncake_redis.library import library_source
from mooncake_redis.server import EmbeddedValkey
from mooncake_redis.worker import Worker


MAX_KEYS_PER_CALL = 512  # lua/lib/20_object.lua: the bound of every keyed call
ENGINE = "engine"  # the client that mounts a segment and writes into it


def fcall(m: Master, fn: str, shard: int, *args):
    return m.redis.execute_command("FCALL", fn, 1, shard_keys(m, shard).P, *args)


def error_of(m: Master, *args) -> str:
    with pytest.raises(redis.ResponseError) as info:
        m.redis.execute_command("FCALL", *args)
    return str(info.value)


def assert_unchanged(m: Master, before: dict) -> None:
    assert store_snapshot(m) == before


# ---- 1. an outage longer than client_ttl loses nothing ---------------------------------------

def _engine_store(m: Master, n: int = 6) -> list[str]:
    m.mount_segment("seg", (1 << 16) * m.shards, ENGINE)
    keys = [f"k{i}" for i in range(n)]
    for k in keys:
        put(m, k, 100, client=ENGINE)
    return keys


def test_outage_longer_than_client_ttl_loses_nothing(new_master):
    m = new_master(client_ttl=3_000)
    ttl = m.config.client_ttl
    keys = _engine_store(m)
    worker = Worker(m)
    assert worker.run_once().clients_expired == 0
    # the store (or every worker) is down for 3 x client_ttl: no ping lands, no pass runs
    m.advance_clock(3 * ttl)
    for _ in range(3):
        assert worker.run_once().clients_expired == 0
    # the engine resumes pinging within client_ttl of the restart
    m.advance_clock(ttl - 1)
    assert m.ping(ENGINE) == "OK"
    for _ in range(3):
        done = worker.run_once()
        assert (done.clients_expired, done.segments_unmounted) == (0, 0)
        m.advance_clock(ttl // 2)
        m.ping(ENGINE)
    assert all(m.exist_key(k) for k in keys)
    assert m.usage().objects == len(keys)


def test_silence_after_an_outage_still_expires_the_client(new_master):
    m = new_master(client_ttl=3_000)
    _engine_store(m)
    worker = Worker(m)
    worker.run_once()
    m.advance_clock(10 * m.config.client_ttl)  # outage
    watched_silence(m, m.config.client_ttl)     # exactly client_ttl of watched silence: alive
    assert worker.run_once().clients_expired == 0
    m.advance_clock(1)
    assert worker.run_once().clients_expired == m.shards
    assert m.ping(ENGINE) == "NEED_REMOUNT" and m.usage().objects == 0


def test_a_gap_between_worker_passes_restarts_the_watch(new_master):
    m = new_master(client_ttl=4_000)
    _engine_store(m)
    worker = Worker(m)
    worker.run_once()
    m.advance_clock(m.config.client_ttl // 2)
    worker.run_once()
    m.advance_clock(m.config.client_ttl // 2 + 1)  # a gap just over client_ttl / 2
    assert worker.run_once().clients_expired == 0   # silence of client_ttl + 1, but not all watched
    assert m.usage().objects == 6


def test_valkey_restart_with_aof_after_a_long_outage_loses_nothing(tmp_path):
    server = EmbeddedValkey(data_dir=str(tmp_path), appendonly=True,
                            extra_args=("--appendfsync", "always")).start()
    try:
        m = Master.connect(server.url, MasterConfig(shards=2, client_ttl=3_000))
        m.freeze_clock(T0)
        keys = _engine_store(m)
        Worker(m).run_once()
        m.close()
        server.stop()
        server.start()  # same port, same data directory: the store comes back from the AOF
        m = Master.connect(server.url)
        m.advance_clock(3 * m.config.client_ttl)  # the time the store was down
        worker = Worker(m)
        for _ in range(3):
            assert worker.run_once().clients_expired == 0
            m.advance_clock(m.config.client_ttl // 2)
            assert m.ping(ENGINE) == "OK"
        assert all(m.exist_key(k) for k in keys)
        assert fsck(m).ok
        m.close()
    finally:
        server.stop()


# ---- 3. no partial write on an error path ------------------------------------------------

def test_free_with_a_damaged_neighbour_frees_once(master):
    m = master
    mount(m, "seg", 4096)
    a, b = keys_on_shard(m, 0, 2)
    p = shard_keys(m, 0)
    put(m, a, 1024)
    put(m, b, 1024)
    base, _ = slice_of(m, 4096 * m.shards, 0)
    m.remove(a)  # free: [base, base+1024) and [base+2048, ...)
    m.redis.zrem(p.free("seg")[1], str(base))  # damage: the neighbour lost its length
    m.remove(b, force=True)  # frees next to the damaged extent: must not fail half way
    assert int(m.redis.hget(p.P, "used_bytes")) == 0
    assert int(m.redis.hget(p.segment("seg"), "used")) == 0
    report = fsck(m, repair=True)
    assert report.findings and not report.unrepaired, report
    assert fsck(m).ok
    put(m, a, 4096)  # the whole slice is one free extent again


def test_double_free_is_refused_without_a_write(master):
    m = master
    mount(m, "seg", 4096)
    (a,) = keys_on_shard(m, 0, 1)
    p = shard_keys(m, 0)
    put(m, a, 1024)
    off = replicas_in(m.redis.hgetall(p.object("default", a)))["seg"][0]
    # damage: the object's extent is also on the free lists
    m.redis.zadd(p.free("seg")[0], {str(off): off})
    m.redis.zadd(p.free("seg")[1], {str(off): 1024})
    used = int(m.redis.hget(p.P, "used_bytes"))
    m.remove(a, force=True)
    assert int(m.redis.hget(p.P, "used_bytes")) == used  # not subtracted for bytes it did not free
    assert m.redis.zscore(p.free("seg")[1], str(off)) == 1024


def test_refused_mounts_write_nothing(master):
    m = master
    m.mount_segment("seg", 4096 * m.shards, OWNER)
    before = store_snapshot(m)
    with raises_code(ErrorCode.SEGMENT_ALREADY_EXISTS):
        m.mount_segment("seg", 4096 * m.shards, "someone-else")
    assert_unchanged(m, before)  # the other client was not recorded
    big = 2**52
    mount_args = lambda name: (4, "name", name, "client_id", OWNER, "base", 0, "size", big)  # noqa: E731
    assert fcall(m, "mc_mount_segment", 0, *mount_args("huge-1")) == 0
    before = store_snapshot(m)
    msg = error_of(m, "mc_mount_segment", 1, shard_keys(m, 0).P, *mount_args("huge-2"))
    assert msg.startswith("INVALID_PARAMS -600") and "2^53" in msg
    assert_unchanged(m, before)


# ---- 4. numbers in canonical form only; no "-0" on the wire -------------------------------

@pytest.mark.parametrize("value", ["-0", "00", "01", "+1", "1.0", "1e3", " 1", "-1"])
def test_non_canonical_numbers_are_refused(master, value):
    m = master
    mount(m, "seg", 4096)
    before = store_snapshot(m)
    p = shard_keys(m, 0).P
    msg = error_of(m, "mc_mount_segment", 1, p, 4, "name", "raw", "client_id", OWNER, "base", value, "size", 100)
    assert msg.startswith("INVALID_PARAMS -600"), msg
    head = [1, "client_id", WRITER, 2, "key", "size"]
    (key,) = keys_on_shard(m, 0, 1)
    assert fcall(m, "mc_put_start", 0, *head, key, value) == [int(ErrorCode.INVALID_PARAMS)]
    assert error_of(m, "mc_put_start", 1, p, 2, "client_id", WRITER, "replica_num", value, 2, "key", "size",
                    key, 1).startswith("INVALID_PARAMS -600")
    assert error_of(m, "mc_evict", 1, p, value).startswith("INVALID_PARAMS -600")
    assert_unchanged(m, before)


def test_unmount_of_an_empty_segment_works_everywhere(master):
    """On Redis 7 an unmount with 0 used bytes sent HINCRBY -0, which it refuses."""
    m = master
    m.mount_segment("empty", 4096 * m.shards, OWNER)
    m.mount_segment("full", 4096 * m.shards, OWNER)
    put(m, "x", 100, config=ReplicateConfig(preferred_segments=("full",)))
    m.unmount_segment("empty", OWNER)
    assert [s["name"] for s in m.segments()] == ["full"]
    assert m.usage().capacity_bytes == 4096 * m.shards
    m.unmount_segment("full", OWNER)
    assert m.usage().capacity_bytes == 0 and m.usage().used_bytes == 0
    assert fsck(m).ok


# ---- 5. one entry check; repairs that cannot corrupt ---------------------------------------

FUNCTIONS = ["mc_mount_segment", "mc_unmount_segment", "mc_sweep_replicas", "mc_ping", "mc_put_start",
             "mc_put_end", "mc_put_revoke", "mc_get_replica_list", "mc_exist_key", "mc_remove", "mc_task_ref",
             "mc_evict", "mc_describe", "mc_now", "mc_unit_state", "mc_discard_puts", "mc_expire_clients", "mc_sweep_done",
             "mc_claim", "mc_release_claim", "mc_fsck_counters", "mc_fsck_segment_used",
             "mc_fsck_forget_segment", "mc_fsck_place", "mc_fsck_unit", "mc_fsck_group",
             "mc_fsck_rebuild_free", "mc_expire_guaranteed", "mc_fsck_guaranteed", "mc_guarantee_cached"]
FUNCTIONS += ["mc_retain_groups", "mc_describe_group", "mc_retention_usage", "mc_retention_members", "mc_fsck_retention",
              "mc_fsck_retention_counts"]
FUNCTIONS += ["mc_radix_register", "mc_radix_nodes", "mc_radix_describe", "mc_radix_outbox", "mc_radix_apply",
              "mc_radix_ack", "mc_radix_probe", "mc_radix_reconcile", "mc_radix_stats"]
FUNCTIONS += ["mc_mount_local_disk", "mc_unmount_local_disk", "mc_report_ssd_capacity", "mc_offload_heartbeat",
              "mc_offload_done", "mc_offload_sweep", "mc_fsck_offload_task", "mc_fsck_offload_inflight"]
FUNCTIONS += ["mc_disk_removal_heartbeat", "mc_disk_removal_ack", "mc_disk_referenced", "mc_fsck_disk_used"]
FUNCTIONS += ["mc_gw_segment_record", "mc_gw_segment_forget", "mc_gw_reap", "mc_gw_metadata_put",
              "mc_gw_metadata_delete", "mc_gw_register_client", "mc_gw_heartbeat"]
FUNCTIONS += ["mc_fsck_gateway", "mc_fsck_sweep_due", "mc_fsck_figures", "mc_upgrade_objects",
              "mc_fsck_indexed"]
FUNCTIONS += ["mc_graceful_unmount_segment", "mc_finish_drain", "mc_upsert_start", "mc_fsck_host_index"]
FUNCTIONS += ["mc_replica_start", "mc_replica_end", "mc_replica_revoke"]
FUNCTIONS += ["mc_task_create", "mc_task_fetch", "mc_task_complete", "mc_task_query"]
FUNCTIONS += ["mc_fsck_held_due"]


def test_every_function_is_listed_here():
    source, _ = library_source()
    registered = {f for f in FUNCTIONS if f"'{f}'" in source}
    import re
    assert set(re.findall(r"register\('(mc_[a-z_]+)'", source)) == set(FUNCTIONS) == registered


def test_every_function_refuses_a_shard_key_that_is_not_one(master):
    m = master
    mount(m, "seg", 4096)
    before = store_snapshot(m)
    ns = m.ns
    bad_keys = [[], ["x"], [f"{ns}:{{{ns}:{m.shards}}}"], [f"{ns}:{{{ns}:00}}"], [f"{ns}:{{other:0}}"],
                ["other:{other:0}"], [shard_keys(m, 0).P, shard_keys(m, 0).P]]
    args = ["w", "1", "k", "1", "1", "1", "1", "1"]
    for fn in FUNCTIONS:
        for keys in bad_keys:
            msg = error_of(m, fn, len(keys), *keys, *args)
            uninitialised = keys in (["other:{other:0}"], [f"{ns}:{{{ns}:{m.shards}}}"])
            want = "INTERNAL_ERROR -1 store not initialised" if uninitialised else "INVALID_PARAMS -600"
            assert msg.startswith(want), (fn, keys, msg)
    assert_unchanged(m, before)
    assert not list(m.redis.scan_iter(match="other*")) and not m.redis.exists("x")


PUT_ARGS = [1, "client_id", WRITER, 2, "key", "size", "k", 1]
CONFIG_READERS = {"client_ttl": ("mc_expire_clients", [16]), "default_kv_lease_ttl": ("mc_get_replica_list", [0, 1, "key", "k"]),
                  "eviction_ratio": ("mc_evict", [16]), "shards": ("mc_ping", [1, "client_id", "c"]), "evict_on_put": ("mc_put_start", PUT_ARGS),
                  "put_start_discard_timeout": ("mc_discard_puts", [16])}


@pytest.mark.parametrize("field,value", [("client_ttl", "nan"), ("client_ttl", "1.5"), ("client_ttl", "inf"),
                                         ("default_kv_lease_ttl", "-1"), ("eviction_ratio", "2"),
                                         ("shards", "0"), ("evict_on_put", "7"), ("put_start_discard_timeout", "")])
def test_a_bad_stored_configuration_stops_the_functions_that_read_it(master, field, value):
    m = master
    mount(m, "seg", 4096)
    fn, args = CONFIG_READERS[field]
    m.redis.execute_command("FCALL", fn, 1, shard_keys(m, 0).P, *args)  # a good config, parsed and memoised
    for p in all_shard_keys(m):
        m.redis.hset(p.config, field, value)
    before = store_snapshot(m)
    msg = error_of(m, fn, 1, shard_keys(m, 0).P, *args)
    assert msg.startswith("INTERNAL_ERROR -1 bad configuration") and field in msg, (fn, msg)
    assert_unchanged(m, before)


def test_a_changed_configuration_applies_to_the_next_call(master):
    m = master
    mount(m, "seg", 4096)
    put(m, "k", 10)
    p = shard_keys(m, m.transport.shard_of(b"k"))
    m.advance_clock(m.config.default_kv_lease_ttl)  # the put's lease ran out
    assert m.get_replica_list("k").lease_ttl_ms == m.config.default_kv_lease_ttl
    m.redis.hset(p.config, "default_kv_lease_ttl", 777)
    m.advance_clock(m.config.default_kv_lease_ttl)
    assert m.get_replica_list("k").lease_ttl_ms == 777


def test_put_start_reparses_its_options_when_the_configuration_changes(master):
    """put_start keeps its parsed options for a head and a configuration: the same head under
    another configuration is checked against the new one."""
    m = master
    mount(m, "seg", 1 << 16)
    p = shard_keys(m, 0)
    a, b, c = keys_on_shard(m, 0, 3)
    head = [2, "client_id", WRITER, "guaranteed_ttl_ms", 5000, 2, "key", "size"]
    assert isinstance(fcall(m, "mc_put_start", 0, *head, a, 10)[0], list)
    m.redis.hset(p.config, "max_guaranteed_ttl", 4999)
    assert error_of(m, "mc_put_start", 1, p.P, *head, b, 10).startswith("INVALID_PARAMS -600 guaranteed_ttl_ms")
    m.redis.hset(p.config, "max_guaranteed_ttl", 5000)
    assert isinstance(fcall(m, "mc_put_start", 0, *head, c, 10)[0], list)


def test_a_memoised_call_head_serves_only_the_same_head(master):
    """Calls repeat a head (options and field names) with other rows, and its parse is
    memoised: a head that differs in any argument, or is spelled another way, is parsed anew."""
    m = master
    mount(m, "seg", 1 << 16)
    p = shard_keys(m, 0).P
    a, b, c = keys_on_shard(m, 0, 3)
    head = [1, "client_id", WRITER, 2, "key", "size"]
    assert isinstance(fcall(m, "mc_put_start", 0, *head, a, 10)[0], list)
    assert [isinstance(r, list) for r in fcall(m, "mc_put_start", 0, *head, b, 10, c, 10)] == [True, True]
    before = store_snapshot(m)
    for bad in (["01", "client_id", WRITER, 2, "key", "size"], [1, "client_id", WRITER, "02", "key", "size"],
                [1, "client_id", WRITER, 2, "key", "sizes"], [1, "client_ID", WRITER, 2, "key", "size"],
                [1, "client_id", WRITER, 1, "key"], [1, "client_id", WRITER, 2, "key", "key"]):
        assert error_of(m, "mc_put_start", 1, p, *bad, "x", 10).startswith("INVALID_PARAMS -600"), bad
    assert error_of(m, "mc_put_start", 1, p, *head, "x").startswith("INVALID_PARAMS -600 each row must have 2")
    for tenant in ("default", "a b", "default"):  # a bad tenant between two good calls
        args = [1, "tenant", tenant, 1, "key", a]
        if tenant == "default":
            assert fcall(m, "mc_exist_key", 0, *args) == [0]  # a is still being written
        else:
            assert error_of(m, "mc_exist_key", 1, p, *args).startswith("INVALID_PARAMS -600 tenant_id")
    assert_unchanged(m, before)


def test_counter_repairs_cannot_go_negative_or_past_the_segment(master):
    m = master
    mount(m, "seg", 4096)
    put(m, keys_on_shard(m, 0, 1)[0], 100)
    before = store_snapshot(m)
    p = shard_keys(m, 0)
    used = int(m.redis.hget(p.P, "used_bytes"))
    assert error_of(m, "mc_fsck_counters", 1, p.P, "objects", 0, 0, "used_bytes", used, -used - 1).startswith(
        "INVALID_PARAMS -600")
    seg_used = int(m.redis.hget(p.segment("seg"), "used"))
    assert error_of(m, "mc_fsck_segment_used", 1, p.P, "seg", seg_used, -seg_used - 1).startswith("INVALID_PARAMS")
    assert error_of(m, "mc_fsck_segment_used", 1, p.P, "seg", seg_used, 4096).startswith("INVALID_PARAMS")
    assert_unchanged(m, before)


def _rebuild_args(m: Master, shard: int, seg: str, alloc: list) -> list:
    p = shard_keys(m, shard)
    row = m.redis.hgetall(p.segment(seg))
    base, size = int(row[b"base"]), int(row[b"size"])
    by_off = m.redis.zrange(p.free(seg)[0], 0, -1, withscores=True)
    seen = []
    for member, score in by_off:
        seen += [member, int(score), int(m.redis.zscore(p.free(seg)[1], member))]
    flat = [x for a in alloc for x in a]
    return [seg, row[b"mount"], base, base + size, len(by_off), *seen, len(alloc), *flat, 0]


def test_a_rebuild_given_a_wrong_allocation_list_frees_no_live_bytes(master):
    m = master
    mount(m, "seg", 8192)
    keys = keys_on_shard(m, 0, 3)
    for k in keys:
        put(m, k, 1024)
    before = store_snapshot(m)
    # claim nothing is allocated: the call may only keep bytes that are free now
    assert fcall(m, "mc_fsck_rebuild_free", 0, *_rebuild_args(m, 0, "seg", []))[0] == 1
    assert store_snapshot(m) == before
    # claim an allocation that no record backs: refused, nothing written
    p = shard_keys(m, 0)
    base = int(m.redis.hget(p.segment("seg"), "base"))
    msg = error_of(m, "mc_fsck_rebuild_free", 1, p.P, *_rebuild_args(m, 0, "seg", [(base + 5000, 10, "r", "default:nope")]))
    assert msg.startswith("INVALID_PARAMS -600"), msg
    assert_unchanged(m, before)
    more = keys_on_shard(m, 0, 5)[3:]
    for k in more:
        put(m, k, 1024)
    assert fsck(m).ok  # no overlap: the earlier objects' bytes never became allocatable


# ---- 6. every call bounds its own work ----------------------------------------------------

def test_oversized_calls_are_refused_before_any_work(master):
    m = master
    mount(m, "seg", 4096)
    before = store_snapshot(m)
    p = shard_keys(m, 0).P
    many = [f"k{i}" for i in range(MAX_KEYS_PER_CALL + 1)]  # one key over the bound
    for fn, head in (("mc_get_replica_list", [0, 1, "key"]), ("mc_exist_key", [0, 1, "key"]),
                     ("mc_remove", [0, 1, "key"]), ("mc_put_end", [1, "client_id", WRITER, 1, "key"]),
                     ("mc_task_ref", [1, "delta", 1, 1, "key"]), ("mc_sweep_replicas", [0, 1, "key"])):
        msg = error_of(m, fn, 1, p, *head, *many)
        assert msg.startswith(f"INVALID_PARAMS -600 at most {MAX_KEYS_PER_CALL} keys"), (fn, msg)
    pairs = [x for i in range(129) for x in (f"k{i}", 1)]
    msg = error_of(m, "mc_put_start", 1, p, 1, "client_id", WRITER, 2, "key", "size", *pairs)
    assert "at most 128 keys" in msg
    prefs = [f"s{i}" for i in range(65)]
    prefs = [x for s in prefs for x in ("preferred", s)]
    assert error_of(m, "mc_put_start", 1, p, 66, "client_id", WRITER, *prefs, 2, "key", "size",
                    "k", 1).startswith("INVALID_PARAMS -600 at most 64 preferred")
    assert_unchanged(m, before)


def test_a_large_group_is_evicted_over_several_steps(new_master):
    m = new_master(evict_on_put=False, **WATERMARKS)
    slice_ = 64 * 1024
    m.mount_segment("seg", slice_ * m.shards, OWNER)
    group = "{big}g"
    shard = shard_of_key(m, group)
    members = [f"{{big}}m{i}" for i in range(40)]
    cfg = ReplicateConfig(group_id=group)
    assert all(isinstance(r, list) for r in m.batch_put_start(WRITER, members, [1024] * 40, cfg))
    assert all(c == ErrorCode.OK for c in m.batch_put_end(WRITER, members))
    others = [k for k in keys_on_shard(m, shard, 40, stem="o") if not k.startswith("{")]
    m.advance_clock(1)
    for k in others[:20]:  # the group is the least recently leased unit: it goes first
        put(m, k, 1024)
    step = m.evict_step(shard, 16)
    assert (step.state, step.objects) == ("more", 16)
    left = [k for k in members if code_of(m.describe, k) == ErrorCode.OK]
    assert len(left) == 24
    # a group being evicted is gone for callers
    assert code_of(m.get_replica_list, left[0]) == ErrorCode.OBJECT_NOT_FOUND
    assert not m.exist_key(left[0])
    assert code_of(m.add_task_ref, left[0]) == ErrorCode.OBJECT_NOT_FOUND
    assert m.batch_put_start(WRITER, ["{big}new"], [1024], cfg) == [ErrorCode.NO_AVAILABLE_HANDLE]
    assert fsck(m).ok  # mid-drain is a consistent state
    # writing a left-over member's key again finishes that member's eviction first
    assert isinstance(m.put_start(WRITER, left[0], 1024), list)
    m.put_revoke(WRITER, left[0])
    steps = 1
    while step.state == "more":
        step = m.evict_step(shard, 16)
        steps += 1
        assert step.objects <= 16
    assert steps >= 3 and not any(code_of(m.describe, k) == ErrorCode.OK for k in members)
    put(m, "{big}new", 1024, config=cfg)  # the group id is free again
    assert fsck(m).ok


# ---- retries -----------------------------------------------------------------------------

def test_put_start_retried_by_its_writer_answers_the_same_replicas(master):
    m = master
    mount(m, "seg-a", 1 << 16)
    mount(m, "seg-b", 1 << 16, base=1 << 40)
    first = m.put_start(WRITER, "k", 100, ReplicateConfig(replica_num=2))
    used = m.usage().used_bytes
    again = m.put_start(WRITER, "k", 100, ReplicateConfig(replica_num=2))
    assert sorted((r.segment, r.offset) for r in again) == sorted((r.segment, r.offset) for r in first)
    assert m.usage().used_bytes == used
    with raises_code(ErrorCode.OBJECT_ALREADY_EXISTS):
        m.put_start("someone-else", "k", 100)
    with raises_code(ErrorCode.OBJECT_ALREADY_EXISTS):
        m.put_start(WRITER, "k", 101)
    m.put_end(WRITER, "k")
    with raises_code(ErrorCode.OBJECT_ALREADY_EXISTS):
        m.put_start(WRITER, "k", 100)


# ---- abandoned puts of an expired writer free their bytes at once ----------------------------

def test_abandoned_put_of_an_expired_writer_frees_at_once(new_master):
    m = new_master(client_ttl=2_000, put_start_discard_timeout=5_000)
    m.mount_segment("seg", (1 << 16) * m.shards, OWNER)
    m.mount_segment("w-seg", 4096 * m.shards, "w-dead")    # both writers are clients of the store
    m.mount_segment("a-seg", 4096 * m.shards, "w-alive")
    m.put_start("w-dead", "from-dead", 1000, ReplicateConfig(preferred_segments=("seg",)))
    m.put_start("w-alive", "from-alive", 1000, ReplicateConfig(preferred_segments=("seg",)))
    watched_silence(m, m.config.put_start_discard_timeout + 1, ping=(OWNER, "w-alive"))
    assert m.ping("w-dead") == "NEED_REMOUNT"  # expired on the way
    assert Worker(m).run_once().discarded_puts == 2
    # the expired writer's bytes are free now; the live writer's stay held (it may still write)
    assert m.usage().used_bytes == 1000
    assert fsck(m).ok


def test_a_worker_taking_over_from_a_dead_one_keeps_the_watch(new_master):
    """A dead worker's shards are taken over once its claim runs out; that gap must not restart
    the watch of client silence, or dead clients would never expire while workers crash."""
    m = new_master()
    ttl = m.config.client_ttl
    _engine_store(m)
    dead = Worker(m, worker_id="dead")
    dead.run_once()                      # claims every shard, then dies without releasing them
    m.advance_clock(dead.claim_ttl_ms + 1)
    alive = Worker(m, worker_id="alive")
    assert alive.run_once().shards_claimed == m.shards
    m.advance_clock(ttl // 2 - dead.claim_ttl_ms - 1)
    assert alive.run_once().clients_expired == 0
    m.advance_clock(ttl // 2)  # the engine is silent for exactly client_ttl
    assert alive.run_once().clients_expired == 0
    m.advance_clock(1)
    assert alive.run_once().clients_expired == m.shards
