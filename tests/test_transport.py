"""The shard transport (mooncake_redis.transport.Shards): the one caller that Master, Worker, fsck
and the CLI share."""
from __future__ import annotations

import math

import pytest

from helpers import mount, put, raises_code
from mooncake_redis import ErrorCode, MasterError, wire
from mooncake_redis.keys import ShardKeys, shard_of
from mooncake_redis.transport import Shards


def recording(m) -> tuple[Shards, list]:
    """A transport over `m`'s store that records every run() it makes."""
    t = Shards(m.redis, m.ns, m.shards)
    sent: list = []

    def run(commands, raise_on_error=True):
        sent.append(list(commands))
        return Shards.run(t, commands, raise_on_error)

    t.run = run
    return t, sent


def test_master_worker_and_fsck_share_one_transport(master):
    from mooncake_redis.fsck import _Audit
    from mooncake_redis.worker import Worker

    t = master.transport
    assert (t.redis, t.namespace, t.count) == (master.redis, master.ns, master.shards)
    assert [k.P for k in t.keys] == [ShardKeys(master.ns, i).P for i in range(master.shards)]
    assert Worker(master).transport is t and _Audit(master, 1, 0, None).t is t


def test_batch_groups_by_shard_chunks_and_keeps_input_order(master):
    m = master
    mount(m, "seg", 1 << 16)
    keys = [f"k{i}".encode() for i in range(30)]
    stored = set(keys[::3])
    for key in stored:
        put(m, key, 10)
    t, sent = recording(m)
    head = wire.head(wire.KEY, tenant="default")
    replies = t.batch("mc_exist_key", head, [(k,) for k in keys], keys, chunk=4)
    assert replies == [1 if k in stored else 0 for k in keys]
    assert len(sent) == 1  # one pipeline
    per_shard = {s: sum(1 for k in keys if shard_of(k, m.shards) == s) for s in range(m.shards)}
    assert len(sent[0]) == sum(math.ceil(n / 4) for n in per_shard.values())
    for command in sent[0]:
        assert command[:2] == ("FCALL", "mc_exist_key") and list(command[4:4 + len(head)]) == head
        shard = next(i for i, k in enumerate(t.keys) if k.P == command[3])
        rows = command[4 + len(head):]
        assert 1 <= len(rows) <= 4 and all(shard_of(k, m.shards) == shard for k in rows)


def test_the_default_tenant_is_left_out_and_means_the_same(master):
    m = master
    mount(m, "seg", 1 << 16)
    put(m, b"k", 10)
    assert wire.options(tenant="default", client_id="c") == [1, "client_id", "c"]
    assert wire.options(tenant="t1") == [1, "tenant", "t1"]
    t, _ = recording(m)
    P = t.keys[shard_of(b"k", m.shards)].P
    for head in ([0, 1, "key"], [1, "tenant", "default", 1, "key"]):
        assert m.redis.fcall("mc_exist_key", 1, P, *head, "k") == [1]
    assert m.redis.fcall("mc_exist_key", 1, P, 1, "tenant", "t1", 1, "key", "k") == [0]


def test_call_each_and_command_address_one_shard(master):
    t, sent = recording(master)
    assert t.command("mc_now", 0) == ("FCALL", "mc_now", 1, t.keys[0].P)
    nobody = wire.options(client_id="nobody")
    assert t.call("mc_ping", t.count - 1, *nobody) == 0
    assert t.each("mc_ping", *nobody) == [0] * t.count
    assert [c[3] for c in sent[-1]] == [k.P for k in t.keys]


def test_errors_are_master_errors(master):
    t = master.transport
    with raises_code(ErrorCode.INVALID_PARAMS):
        t.call("mc_evict", 0, "-0")
    replies = t.each("mc_evict", "-0", raise_on_error=False)
    assert all(isinstance(r, MasterError) and r.code == ErrorCode.INVALID_PARAMS for r in replies)


def test_scan_objects_yields_tenants_and_skips_stray_keys(master):
    m = master
    mount(m, "seg", 1 << 16)
    keys = [f"obj{i}" for i in range(12)]
    for key in keys:
        put(m, key, 10)
        put(m, key, 10, tenant_id="t2")
    k0 = m.transport.keys[0]
    m.redis.hset(k0.prefix("object") + b"bad tenant:x", "size", 1)  # not an object of any tenant
    found: dict[str, set] = {}
    for shard in range(m.shards):
        for tenant, batch in m.transport.scan_objects(shard):
            assert all(shard_of(k, m.shards) == shard for k in batch)
            found.setdefault(tenant, set()).update(batch)
    assert found == {"default": {k.encode() for k in keys}, "t2": {k.encode() for k in keys}}
    only_t2 = {(tenant, k) for s in range(m.shards) for tenant, b in m.transport.scan_objects(s, "t2") for k in b}
    assert only_t2 == {("t2", k.encode()) for k in keys}


@pytest.mark.parametrize("transaction", [True, False])
def test_pipeline_of_a_shard(master, transaction):
    t = master.transport
    pipe = t.pipeline(0, transaction)
    pipe.hget(t.keys[0].config, "shards")
    assert pipe.execute() == [str(master.shards).encode()]


def test_a_url_redis_py_would_fail_on_later_is_refused_up_front():
    from mooncake_redis.transport import check_url, client_from_url

    for url in ("redis://h/0?foo=1", "unix:///tmp/x.sock?foo=1", "http://h/0", "redis://h/0?socket_timeout=x"):
        with raises_code(ErrorCode.INVALID_PARAMS):
            check_url(url)
        with raises_code(ErrorCode.INVALID_PARAMS):
            client_from_url(url)
    for url in ("redis://h/0", "rediss://:pw@h:1/2?ssl_cert_reqs=none", "unix:///tmp/x.sock?db=1",
                "redis+cluster://h:1,h:2", "memory://x"):
        check_url(url)  # well-formed: nothing is opened
