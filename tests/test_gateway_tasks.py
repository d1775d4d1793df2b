"""The task RPCs through the gateway (raw coro_rpc frames on a real Valkey): CreateCopyTask and
CreateMoveTask queue a task for the source segment's owner, FetchTasks hands it out with the
payload Mooncake's client parses, CopyStart/MoveStart hand out addresses inside the target
segments, End makes the replicas, MarkTaskToComplete and QueryTask report it."""
from __future__ import annotations

import json
import uuid

import pytest
from test_gateway_wire import Conn

from mooncake_redis import Master, MasterConfig
from mooncake_redis.gateway import schema
from mooncake_redis.gateway.codec import Err
from mooncake_redis.gateway.server import GatewayThread, Listeners
from mooncake_redis.server import free_port

A, B = (0x11, 0x22), (0x33, 0x44)
CONFIG = schema.ReplicateConfig()
E, T = schema.ErrorCode, schema.TaskStatus
SIZE = 4 << 20
BASES = {b"seg-a": 1 << 32, b"seg-b": 2 << 32, b"seg-c": 3 << 32}


@pytest.fixture(params=[1, 4], ids=["shards1", "shards4"])
def conn(valkey, request):
    master = Master.connect(valkey.url, MasterConfig(namespace=f"gt{uuid.uuid4().hex[:8]}", shards=request.param))
    master.freeze_clock(10**12)
    thread = GatewayThread(master, Listeners("127.0.0.1", free_port(), free_port()))
    thread.start()
    c = Conn(thread.gateway.rpc_address)
    for name, owner in ((b"seg-a", A), (b"seg-b", B), (b"seg-c", B)):
        seg = schema.Segment((uuid.uuid4().int >> 64, 9), name, BASES[name], SIZE, name, b"tcp", b"")
        assert c.call("MountSegment", seg, owner)[0] is None
    got = c.call("PutStart", A, b"k", 4096, CONFIG._replace(preferred_segment=b"seg-a"), b"default")[0]
    assert not isinstance(got, Err)
    assert c.call("PutEnd", A, schema.ObjectMeta(b"k"), schema.ReplicaType.ALL, b"default")[0] is None
    yield c
    thread.stop()
    master.close()


def endpoints(c: Conn) -> list[bytes]:
    reps = c.call("GetReplicaList", b"k", b"default")[0].replicas
    return sorted(d.descriptor_variant[1].buffer_descriptor.transport_endpoint_ for d in reps)


def inside(d, name: bytes) -> bool:
    buf = d.descriptor_variant[1].buffer_descriptor
    return buf.transport_endpoint_ == name and BASES[name] <= buf.buffer_address_ < BASES[name] + SIZE


def test_a_copy_task_end_to_end(conn):
    c = conn
    task = c.call("CreateCopyTask", b"k", b"default", [b"seg-b", b"seg-c"])[0]
    assert c.call("QueryTask", task)[0].status == T.PENDING
    assert c.call("FetchTasks", B, 16)[0] == []  # B owns no replica of k
    (assignment,) = c.call("FetchTasks", A, 16)[0]
    assert assignment.id == task and assignment.type == schema.TaskType.REPLICA_COPY
    body = json.loads(assignment.payload)
    assert (body["key"], body["source"], body["targets"], body["tenant_id"]) == \
        ("k", "seg-a", ["seg-b", "seg-c"], "default")
    started = c.call("CopyStart", A, b"k", b"default", b"seg-a", [b"seg-b", b"seg-c"])[0]
    assert inside(started.source, b"seg-a")
    assert sorted(d.descriptor_variant[1].buffer_descriptor.transport_endpoint_ for d in started.targets) == \
        [b"seg-b", b"seg-c"]
    assert all(inside(d, d.descriptor_variant[1].buffer_descriptor.transport_endpoint_) for d in started.targets)
    assert endpoints(c) == [b"seg-a"]  # invisible until CopyEnd
    assert c.call("CopyEnd", A, b"k", b"default")[0] is None
    assert endpoints(c) == [b"seg-a", b"seg-b", b"seg-c"]
    req = schema.TaskCompleteRequest(task, T.SUCCESS, b"Task completed successfully")
    assert c.call("MarkTaskToComplete", B, req)[0] == Err(int(E.ILLEGAL_CLIENT))
    assert c.call("MarkTaskToComplete", A, req)[0] is None
    info = c.call("QueryTask", task)[0]
    assert (info.status, info.assigned_client, info.message) == (T.SUCCESS, A, b"Task completed successfully")


def test_a_move_task_end_to_end(conn):
    c = conn
    task = c.call("CreateMoveTask", b"k", b"default", b"seg-a", b"seg-b")[0]
    (assignment,) = c.call("FetchTasks", A, 16)[0]
    assert json.loads(assignment.payload)["target"] == "seg-b"
    started = c.call("MoveStart", A, b"k", b"default", b"seg-a", b"seg-b")[0]
    assert inside(started.source, b"seg-a") and inside(started.target, b"seg-b")
    assert c.call("MoveEnd", A, b"k", b"default")[0] is None
    assert endpoints(c) == [b"seg-b"]
    assert c.call("MarkTaskToComplete", A, schema.TaskCompleteRequest(task, T.SUCCESS, b""))[0] is None


def test_refusals_have_mooncakes_numbers(conn):
    c = conn
    assert c.call("CreateCopyTask", b"nope", b"default", [b"seg-b"])[0] == Err(int(E.OBJECT_NOT_FOUND))
    assert c.call("CreateCopyTask", b"k", b"default", [b"seg-x"])[0] == Err(int(E.INVALID_PARAMS))
    assert c.call("CreateMoveTask", b"k", b"default", b"seg-a", b"seg-a")[0] == Err(int(E.INVALID_PARAMS))
    assert c.call("QueryTask", (1, 2))[0] == Err(int(E.TASK_NOT_FOUND))
    assert c.call("CopyEnd", A, b"k", b"default")[0] == Err(int(E.OBJECT_NO_REPLICATION_TASK))
    assert c.call("CopyStart", A, b"k", b"default", b"seg-b", [b"seg-c"])[0] == Err(int(E.REPLICA_NOT_FOUND))
    assert not isinstance(c.call("CopyStart", A, b"k", b"default", b"seg-a", [b"seg-b"])[0], Err)
    assert c.call("MoveStart", A, b"k", b"default", b"seg-a", b"seg-c")[0] == \
        Err(int(E.OBJECT_HAS_REPLICATION_TASK))
    assert c.call("MoveEnd", A, b"k", b"default")[0] == Err(int(E.INVALID_PARAMS))  # a copy is in flight
    assert c.call("CopyRevoke", B, b"k", b"default")[0] == Err(int(E.ILLEGAL_CLIENT))
    assert c.call("CopyRevoke", A, b"k", b"default")[0] is None
    assert endpoints(c) == [b"seg-a"]
    bad = schema.TaskCompleteRequest((1, 2), T.PROCESSING, b"")
    assert c.call("MarkTaskToComplete", A, bad)[0] == Err(int(E.INVALID_PARAMS))
