"""The gateway's queries on the wire (raw coro_rpc frames and HTTP, a real Valkey):
CalcCacheStats, BatchQueryIp, GetStorageConfig/GetFsdir, and Mooncake's admin segment queries
/get_all_segments and /query_segment. The 0.3.13.post1 Python client exposes none of them; the
answers Mooncake's own master gives are compared where it registers the RPC (tests marked
slow, skipped without the wheel)."""
from __future__ import annotations

import uuid

import pytest
from test_gateway_wire import Conn, http_call

from mooncake_redis import Master, MasterConfig
from mooncake_redis.gateway import schema
from mooncake_redis.gateway.codec import Err
from mooncake_redis.gateway.handlers import uuid_text
from mooncake_redis.gateway.server import GatewayThread, Listeners
from mooncake_redis.gateway.store import host_without_port
from mooncake_redis.server import free_port

CLIENT = (0xABC, 0xDEF)


@pytest.fixture
def served(valkey):
    master = Master.connect(valkey.url, MasterConfig(namespace=f"gq{uuid.uuid4().hex[:8]}", shards=4))
    thread = GatewayThread(master, Listeners("127.0.0.1", free_port(), free_port()))
    thread.start()
    yield master, thread.gateway
    thread.stop()
    master.close()


def mount(c: Conn, client, name: bytes, endpoint: bytes, size: int = 1 << 20):
    seg_id = (uuid.uuid4().int >> 64, 7)
    assert c.call("MountSegment", schema.Segment(seg_id, name, 1 << 30, size, endpoint, b"tcp", b""), client)[0] is None
    return seg_id


def test_calc_cache_stats_answers_the_gateways_counts_with_each_heartbeat(served):
    master, gateway = served
    c = Conn(gateway.rpc_address)
    assert c.call("CalcCacheStats")[0] == {0: 0.0, 2: 0.0, 4: 0.0, 6: 0.0, 7: 0.0}
    mount(c, CLIENT, b"seg", b"seg")
    config = schema.ReplicateConfig()
    for key in (b"a", b"b"):
        assert not isinstance(c.call("PutStart", CLIENT, key, 100, config, b"default")[0], Err)
        assert c.call("PutEnd", CLIENT, schema.ObjectMeta(key), schema.ReplicaType.ALL, b"default")[0] is None
    assert not isinstance(c.call("GetReplicaList", b"a", b"default")[0], Err)
    got, _ = c.call("BatchGetReplicaList", [b"a", b"b", b"missing"], b"default")
    assert [isinstance(g, Err) for g in got] == [False, False, True]
    c.call("ExistKey", b"a", b"default")  # not a read (as Mooncake's ExistKey)
    assert c.call("CalcCacheStats")[0][0] == 0.0  # counted in the gateway until its heartbeat
    gateway._heartbeat()
    stats, _ = c.call("CalcCacheStats")
    assert stats == {0: 3.0, 2: 2.0, 4: 1.5, 6: 1.5, 7: 0.75}
    assert stats == master.cache_stats().mooncake()
    gateway._heartbeat()  # nothing new: nothing added
    assert master.cache_stats().reads == 4


def test_batch_query_ip_lists_the_hosts_of_each_clients_segments(served):
    master, gateway = served
    c = Conn(gateway.rpc_address)
    two, bare, unknown = (1, 2), (3, 4), (5, 6)
    mount(c, two, b"seg-a", b"10.0.0.1:12888")
    mount(c, two, b"seg-b", b"10.0.0.1:12999")
    mount(c, two, b"seg-c", b"[fe80::1]:7000")
    master.mount_segment("py-seg", 1 << 20, uuid_text(bare))  # mounted without a gateway: no endpoint
    hosts, _ = c.call("BatchQueryIp", [two, bare, unknown])
    assert set(hosts) == {two, bare}  # a client with no segment is left out, as Mooncake's
    assert sorted(hosts[two]) == [b"10.0.0.1", b"fe80::1"] and hosts[bare] == []
    assert c.call("BatchQueryIp", [])[0] == {}
    c.call("UnmountSegment", mount(c, unknown, b"seg-d", b"h:1"), unknown)
    assert c.call("BatchQueryIp", [unknown])[0] == {}


def test_batch_query_ip_refuses_a_batch_too_large(served):
    _, gateway = served
    c = Conn(gateway.rpc_address)
    assert c.call("BatchQueryIp", [(i, i) for i in range(4097)])[0] == Err(int(schema.ErrorCode.INVALID_PARAMS))


@pytest.mark.parametrize("endpoint, host", [("10.0.0.1:80", "10.0.0.1"), ("[::1]:80", "::1"), ("name", "name"),
                                            ("a:b:c", "a:b"), ("[::1]", "::1")])
def test_hosts_drop_the_port_as_mooncake_does(endpoint, host):
    assert host_without_port(endpoint) == host


def test_storage_config_says_there_is_no_storage_directory(served):
    _, gateway = served
    c = Conn(gateway.rpc_address)
    assert c.call("GetStorageConfig")[0] == schema.GetStorageConfigResponse(b"", True, 0)
    assert c.call("GetFsdir")[0] == b""


def test_admin_segment_queries_answer_in_mooncakes_format(served):
    master, gateway = served
    c = Conn(gateway.rpc_address)
    assert http_call(gateway, "GET", "/get_all_segments") == (200, b"")
    mount(c, CLIENT, b"seg-b", b"seg-b", size=1 << 20)
    mount(c, CLIENT, b"seg-a", b"seg-a", size=1 << 20)
    assert http_call(gateway, "GET", "/get_all_segments") == (200, b"seg-a\nseg-b\n")
    config = schema.ReplicateConfig(preferred_segment=b"seg-b")
    assert not isinstance(c.call("PutStart", CLIENT, b"k", 4096, config, b"default")[0], Err)
    assert http_call(gateway, "GET", "/query_segment?segment=seg-b") == (
        200, f"seg-b\nUsed(bytes): 4096\nCapacity(bytes) : {1 << 20}\n".encode())
    assert http_call(gateway, "GET", "/query_segment?segment=nope") == (500, b"Failed to query segment")
    assert http_call(gateway, "GET", "/query_segment") == (500, b"Failed to query segment")
    assert http_call(gateway, "POST", "/get_all_segments")[0] == 405


# ---- against Mooncake's own master ----------------------------------------------------------

@pytest.mark.slow
def test_the_same_answers_as_mooncake_master_where_it_serves_them(mooncake_master, served):
    _, gateway = served
    theirs, ours = Conn(mooncake_master.address), Conn(gateway.rpc_address)
    for name, args in [("BatchQueryIp", ([(1, 2)],)), ("GetStorageConfig", ()), ("GetFsdir", ())]:
        assert ours.call(name, *args)[0] == theirs.call(name, *args)[0], name
    theirs.send("CalcCacheStats")  # Mooncake's master does not register it (its client calls it)
    assert theirs.reply()[0] == 11  # coro_rpc's function_not_registered
    assert isinstance(ours.call("CalcCacheStats")[0], dict)




def test_get_replica_list_by_regex_answers_the_readable_matching_keys(served):
    master, gateway = served
    c = Conn(gateway.rpc_address)
    mount(c, CLIENT, b"seg", b"10.0.0.1:15000")
    config = schema.ReplicateConfig()
    for key in (b"page-1", b"page-2", b"other"):
        assert not isinstance(c.call("PutStart", CLIENT, key, 100, config, b"default")[0], Err)
        assert c.call("PutEnd", CLIENT, schema.ObjectMeta(key), schema.ReplicaType.ALL, b"default")[0] is None
    assert not isinstance(c.call("PutStart", CLIENT, b"page-3", 100, config, b"default")[0], Err)  # in progress
    got, _ = c.call("GetReplicaListByRegex", b"^page-", b"default")
    assert sorted(got) == [b"page-1", b"page-2"]
    for replicas in got.values():
        (rep,) = replicas
        buffer = rep.descriptor_variant[1].buffer_descriptor
        assert buffer.transport_endpoint_ == b"10.0.0.1:15000" and buffer.size_ == 100
    assert c.call("GetReplicaListByRegex", b"^nothing", b"default")[0] == {}
    bad, _ = c.call("GetReplicaListByRegex", b"(", b"default")
    assert isinstance(bad, Err) and bad.code == -600  # a bad regex: INVALID_PARAMS
    assert sorted(master.keys_matching("^page-")) == [b"page-1", b"page-2", b"page-3"]
