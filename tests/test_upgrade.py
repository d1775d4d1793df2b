"""A store of layout 1 (schema 1: one rep:<segment> field per replica) is readable by this
package's functions as it is, and Master.connect rewrites its objects to this package's layout;
a store of schema 2 gets its read marks."""
from __future__ import annotations

import pytest

from helpers import T0, all_shard_keys, make_master, mount, put, replicas_in
from mooncake_redis import Master, MasterConfig, ReplicateConfig
from mooncake_redis.fsck import fsck
from mooncake_redis.library import SCHEMA_FIELD, SCHEMA_VERSION


def to_layout_1(m: Master, keys: list[str]) -> None:
    """Rewrite objects as a schema 1 store held them, and mark the store schema 1."""
    for k in keys:
        okey = next(p.object("default", k) for p in all_shard_keys(m) if m.redis.exists(p.object("default", k)))
        h = m.redis.hgetall(okey)
        m.redis.hdel(okey, "reps")
        for seg, (off, mount_id) in replicas_in(h).items():
            m.redis.hset(okey, f"rep:{seg}", f"{off} {mount_id}")
    for p in all_shard_keys(m):
        m.redis.hset(p.config, SCHEMA_FIELD, 1)


@pytest.mark.parametrize("server", ["valkey", "redis7"])
def test_layout_1_objects_are_read_then_upgraded_by_connect(request, server):
    srv = request.getfixturevalue(server)
    m = make_master("valkey", srv, shards=4)
    m.freeze_clock(T0)
    mount(m, "seg-a", 1 << 20)
    mount(m, "seg-b", 1 << 20, client="client-2")
    keys = [f"k{i}" for i in range(40)]
    for k in keys:
        put(m, k, 100)
    m.put_start("w", "pair", 100, ReplicateConfig(replica_num=2))
    m.put_end("w", "pair")
    before = {k: m.get_replica_list(k).replicas for k in keys + ["pair"]}
    to_layout_1(m, keys + ["pair"])
    # readable as they are, through the general path (and the replies are the same)
    assert {k: m.get_replica_list(k).replicas for k in keys + ["pair"]} == before
    assert m.batch_exist_key(keys) == [True] * len(keys)
    again = Master.connect(srv.url, MasterConfig(shards=4))
    try:
        for p in all_shard_keys(again):
            assert int(again.redis.hget(p.config, SCHEMA_FIELD)) == SCHEMA_VERSION
            for okey in again.redis.scan_iter(match=p.object("default", "") + b"*"):
                fields = again.redis.hkeys(okey)
                assert b"reps" in fields and not any(f.startswith(b"rep:") for f in fields), okey
        assert {k: again.get_replica_list(k).replicas for k in keys + ["pair"]} == before
        assert len(replicas_in(again.describe("pair").fields)) == 2
        assert fsck(again).ok
    finally:
        again.close()
        m.close()


def test_schema_2_objects_get_their_read_mark_and_read_right(valkey):
    m = make_master("valkey", valkey, shards=1)
    m.freeze_clock(T0)
    try:
        mount(m, "seg", 1 << 20)
        m.put_start("w", "pinned", 100, ReplicateConfig(with_hard_pin=True))
        m.put_end("w", "pinned")
        put(m, "plain", 100)
        okey = all_shard_keys(m)[0].object("default", "pinned")
        assert m.redis.hget(okey, "special") == b"1"
        m.redis.hdel(okey, "special")  # as a schema 2 store wrote it
        for p in all_shard_keys(m):
            m.redis.hset(p.config, SCHEMA_FIELD, 2)
        again = Master.connect(valkey.url, MasterConfig(shards=1))
        try:
            assert again.redis.hget(okey, "special") == b"1"
            assert not again.redis.hexists(all_shard_keys(m)[0].object("default", "plain"), "special")
            assert fsck(again).ok
        finally:
            again.close()
    finally:
        m.close()


@pytest.mark.parametrize("server", ["valkey", "redis7"])
def test_schema_3_complete_objects_lose_their_status_and_puts_in_progress_keep_it(request, server):
    srv = request.getfixturevalue(server)
    m = make_master("valkey", srv, shards=1)
    m.freeze_clock(T0)
    try:
        mount(m, "seg", 1 << 20)
        put(m, "done", 100)
        m.put_start("w", "writing", 100, ReplicateConfig())
        p = all_shard_keys(m)[0]
        done_key, writing_key = p.object("default", "done"), p.object("default", "writing")
        assert not m.redis.hexists(done_key, "status")
        m.redis.hset(done_key, "status", "complete")  # as a schema 3 store wrote it
        m.redis.hset(p.config, SCHEMA_FIELD, 3)
        before = m.get_replica_list("done").replicas
        assert m.get_replica_list("done").replicas == before  # readable as it is
        again = Master.connect(srv.url, MasterConfig(shards=1))
        try:
            assert not again.redis.hexists(done_key, "status")
            assert again.redis.hget(writing_key, "status") == b"processing"
            assert again.get_replica_list("done").replicas == before
            assert again.exist_key("done") and not again.exist_key("writing")
            assert fsck(again).ok
        finally:
            again.close()
    finally:
        m.close()
