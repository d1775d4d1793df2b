"""The gateway's placement: MountSegment records a segment's host (the client's host_id, else
its transfer endpoint's host) and PutStart maps ReplicateConfig.prefer_alloc_in_same_node and
host_id to put_start's host and prefer_same_host, on every backend."""
from __future__ import annotations

import uuid

from helpers import shard_keys
from mooncake_redis.gateway import schema
from mooncake_redis.gateway.handlers import Handlers

NODE_A, NODE_B = (0x11, 0x1), (0x22, 0x2)


def mount(h: Handlers, client, endpoint: bytes, size: int, host_id: bytes = b"") -> None:
    seg = schema.Segment((uuid.uuid4().int >> 64, 9), endpoint, 1 << 32, size, endpoint, b"tcp", host_id)
    assert h.call("MountSegment", (seg, client)) is None


def placed(h: Handlers, client, key: bytes, config) -> str:
    reply = h.call("PutStart", (client, key, 100, config, b"default"))
    assert isinstance(reply, list), reply
    return reply[0].descriptor_variant[1].buffer_descriptor.transport_endpoint_.decode()


def test_prefer_alloc_in_same_node_places_on_the_writers_node(master):
    h = Handlers(master)
    mount(h, NODE_A, b"10.0.0.1:12001", 1 << 20)
    mount(h, NODE_B, b"10.0.0.2:12002", 8 << 20)  # more free: the normal placement's choice
    k = shard_keys(master, 0)
    assert master.redis.smembers(k.host_segments("10.0.0.1")) == {b"10.0.0.1:12001"}
    local = schema.ReplicateConfig(prefer_alloc_in_same_node=True)
    assert placed(h, NODE_A, b"plain", schema.ReplicateConfig()) == "10.0.0.2:12002"
    assert placed(h, NODE_A, b"local", local) == "10.0.0.1:12001"  # the node of the client's segments
    assert placed(h, NODE_B, b"by-id", local._replace(host_id=b"10.0.0.1")) == "10.0.0.1:12001"
    assert placed(h, (0x33, 0x3), b"unknown", local) == "10.0.0.2:12002"  # no segment: normal placement
    assert placed(Handlers(master), NODE_A, b"other-gateway", local) == "10.0.0.1:12001"  # read from the store


def test_a_segments_host_id_names_its_node(master):
    h = Handlers(master)
    mount(h, NODE_A, b"10.0.0.1:12001", 1 << 20, host_id=b"rack1-node7")
    assert master.redis.smembers(shard_keys(master, 0).host_segments("rack1-node7")) == {b"10.0.0.1:12001"}
