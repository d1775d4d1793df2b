"""GracefulUnmountSegment, QuerySegmentStatus(ById) and the Upsert RPCs through the gateway: raw
coro_rpc frames against a gateway on a real Valkey, and Mooncake's master for its error answers
(Mooncake's own client drives both in tests/test_gateway_client.py)."""
from __future__ import annotations

import uuid

import pytest
from test_gateway_wire import Conn

from mooncake_redis import Master, MasterConfig
from mooncake_redis.gateway import schema
from mooncake_redis.gateway.codec import Err
from mooncake_redis.gateway.server import GatewayThread, Listeners
from mooncake_redis.server import free_port
from mooncake_redis.worker import Worker

OWNER, OTHER = (0x11, 0x22), (0x33, 0x44)
CONFIG = schema.ReplicateConfig()
OK, GRACEFUL = schema.SegmentStatus.OK, schema.SegmentStatus.GRACEFULLY_UNMOUNTING
E = schema.ErrorCode


@pytest.fixture(params=[1, 4], ids=["shards1", "shards4"])
def served(valkey, request):
    master = Master.connect(valkey.url, MasterConfig(namespace=f"gu{uuid.uuid4().hex[:8]}", shards=request.param))
    master.freeze_clock(10**12)
    thread = GatewayThread(master, Listeners("127.0.0.1", free_port(), free_port()))
    thread.start()
    yield master, thread.gateway
    thread.stop()
    master.close()


def mount(c: Conn, client, name: bytes, size: int = 4 << 20):
    seg_id = (uuid.uuid4().int >> 64, 9)
    assert c.call("MountSegment", schema.Segment(seg_id, name, 1 << 32, size, name, b"tcp", b""), client)[0] is None
    return seg_id


def put(c: Conn, key: bytes, segment: bytes) -> object:
    got = c.call("PutStart", OWNER, key, 4096, CONFIG._replace(preferred_segment=segment), b"default")[0]
    if not isinstance(got, Err):
        assert c.call("PutEnd", OWNER, schema.ObjectMeta(key), schema.ReplicaType.ALL, b"default")[0] is None
    return got


def test_a_gracefully_unmounted_segment_serves_its_objects_then_goes(served):
    master, gateway = served
    c = Conn(gateway.rpc_address)
    old, new = mount(c, OWNER, b"old"), mount(c, OWNER, b"new")
    assert not isinstance(put(c, b"k", b"old"), Err)
    assert c.call("QuerySegmentStatusById", old)[0] == OK
    assert c.call("GracefulUnmountSegment", old, OWNER, 30_000)[0] is None
    assert c.call("GracefulUnmountSegment", old, OWNER, 30_000)[0] is None  # again: OK, as Mooncake's
    assert c.call("QuerySegmentStatusById", old)[0] == GRACEFUL
    assert c.call("QuerySegmentStatus", b"old")[0] == GRACEFUL
    (d,) = c.call("GetReplicaList", b"k", b"default")[0].replicas  # still readable
    assert d.descriptor_variant[1].buffer_descriptor.transport_endpoint_ == b"old"
    (d,) = put(c, b"k2", b"old")  # asked for the draining one: placed elsewhere
    assert d.descriptor_variant[1].buffer_descriptor.transport_endpoint_ == b"new"
    Worker(master).run_once()
    assert c.call("QuerySegmentStatusById", old)[0] == GRACEFUL  # k holds bytes, the grace period runs
    master.advance_clock(30_000)
    assert Worker(master).run_once().segments_drained == 1
    assert c.call("QuerySegmentStatusById", old)[0] == Err(int(E.SEGMENT_NOT_FOUND))
    assert c.call("QuerySegmentStatusById", new)[0] == OK
    assert c.call("GetReplicaList", b"k", b"default")[0] == Err(int(E.OBJECT_NOT_FOUND))


def test_refusals_have_mooncakes_numbers(served):
    _, gateway = served
    c = Conn(gateway.rpc_address)
    seg = mount(c, OWNER, b"seg")
    assert c.call("GracefulUnmountSegment", seg, OTHER, 1000)[0] == Err(int(E.INVALID_PARAMS))  # not its segment
    assert c.call("GracefulUnmountSegment", (7, 7), OWNER, 1000)[0] == Err(int(E.INVALID_PARAMS))  # not one of its
    assert c.call("GracefulUnmountSegment", (7, 7), OTHER, 1000)[0] == Err(int(E.SEGMENT_NOT_FOUND))  # no segment
    assert c.call("QuerySegmentStatusById", (7, 7))[0] == Err(int(E.SEGMENT_NOT_FOUND))
    assert c.call("QuerySegmentStatus", b"nope")[0] == Err(int(E.SEGMENT_NOT_FOUND))
    assert c.call("QuerySegmentStatusById", seg)[0] == OK
    assert c.call("GracefulUnmountSegment", seg, OWNER, 2**64 - 1)[0] is None  # "forever": 10^15 ms


@pytest.mark.slow
def test_the_same_refusals_as_mooncake_master(mooncake_master, served):
    _, gateway = served
    for c in (Conn(mooncake_master.address), Conn(gateway.rpc_address)):
        assert c.call("GracefulUnmountSegment", (7, 7), OTHER, 1000)[0] == Err(int(E.SEGMENT_NOT_FOUND))
        assert c.call("QuerySegmentStatusById", (7, 7))[0] == Err(int(E.SEGMENT_NOT_FOUND))


def test_a_second_segment_under_a_taken_name_is_kept_apart(served):
    """Mooncake names a client's segments by its host: a second one (another UUID) is mounted as
    "<name>#<uuid>", served with its own endpoint, unmounted by its UUID, remounted idempotently."""
    master, gateway = served
    c = Conn(gateway.rpc_address)
    first = mount(c, OWNER, b"host:1")
    second_id = (uuid.uuid4().int >> 64, 5)
    second = schema.Segment(second_id, b"host:1", 1 << 40, 4 << 20, b"host:1", b"tcp", b"")
    assert c.call("MountSegment", second, OWNER)[0] is None
    assert c.call("ReMountSegment", [second], OWNER)[0] is None  # the same segment again: the same name
    names = sorted(s["name"] for s in master.segments())
    assert names[0] == "host:1" and names[1].startswith("host:1#") and len(names) == 2
    assert c.call("GracefulUnmountSegment", second_id, OWNER, 0)[0] is None
    assert c.call("QuerySegmentStatusById", first)[0] == OK
    assert c.call("QuerySegmentStatusById", second_id)[0] == GRACEFUL
    Worker(master).run_once()
    assert [s["name"] for s in master.segments()] == ["host:1"]
    assert c.call("UnmountSegment", first, OWNER)[0] is None


def test_upserts_on_the_wire(served):
    """UpsertStart in place answers the same descriptors; another size new ones; the Batch forms
    (BatchUpsertEnd and BatchUpsertRevoke carry no ReplicaType) end and revoke them."""
    master, gateway = served
    c = Conn(gateway.rpc_address)
    mount(c, OWNER, b"seg")
    (first,) = put(c, b"k", b"seg")
    master.advance_clock(60_000)  # past the put's lease
    (again,) = c.call("UpsertStart", OWNER, b"k", 4096, CONFIG, b"default")[0]
    assert again.descriptor_variant == first.descriptor_variant and again.status == schema.ReplicaStatus.PROCESSING
    assert c.call("GetReplicaList", b"k", b"default")[0] == Err(int(E.REPLICA_IS_NOT_READY))
    assert c.call("UpsertEnd", OWNER, schema.ObjectMeta(b"k"), schema.ReplicaType.ALL, b"default")[0] is None
    replies, _ = c.call("BatchUpsertStart", OWNER, [b"k", b"new"], [8192, 10], CONFIG, b"default")
    assert [r[0].descriptor_variant[1].buffer_descriptor.size_ for r in replies] == [8192, 10]
    assert c.call("BatchUpsertEnd", OWNER, [schema.ObjectMeta(b"k")], b"default")[0] == [None]
    assert c.call("BatchUpsertRevoke", OWNER, [b"new", b"missing"], b"default")[0] == [
        None, Err(int(E.OBJECT_NOT_FOUND))]
    assert c.call("UpsertRevoke", OWNER, b"k", schema.ReplicaType.ALL, b"default")[0] == Err(int(E.INVALID_WRITE))
    assert master.describe("k").size == 8192 and not master.exist_key("new")
