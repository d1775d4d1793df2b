"""The gateway's state in the store (lua/ops/gateway.lua through GatewayStore), on every
backend with 1 and 4 shards, the store clock frozen: segment facts by UUID, the transfer
engine's metadata with Mooncake's duplicate rule, clients without a segment, the reaping of
segments whose client expired (with their metadata), and the gateways' heartbeats."""
from __future__ import annotations

import pytest

from mooncake_redis import ErrorCode
from mooncake_redis.gateway.store import GatewayStore, SegmentFacts
from mooncake_redis.worker import Worker

from helpers import raises_code, watched_silence

SEG_UUID = "0f2fcc18-0000-4000-8000-000000000001"
CLIENT = "5a6b7c8d-0000-4000-8000-00000000000c"


def facts(name: str = "127.0.0.1:12888", uuid: str = SEG_UUID, base: int = 1 << 40, size: int = 1 << 20):
    return SegmentFacts(name, uuid, CLIENT, name, "tcp", base, size)


def mounted(master, store: GatewayStore, f: SegmentFacts) -> SegmentFacts:
    master.mount_segment(f.name, f.size, f.client, base=f.base)
    store.record_segment(f)
    return f


def test_a_recorded_segment_is_found_by_uuid_and_forgotten(master):
    store = GatewayStore(master)
    f = mounted(master, store, facts())
    assert store.segment_name(SEG_UUID) == f.name
    assert store.segment_facts(f.name) == f
    assert f.holds(f.base, f.size) and not f.holds(f.base + 1, f.size) and not f.holds(f.base - 1, 1)
    # a new uuid for the same name replaces the old one
    store.record_segment(facts(uuid="0f2fcc18-0000-4000-8000-000000000002"))
    assert store.segment_name(SEG_UUID) is None
    assert store.forget_segment(f.name) is True
    assert store.forget_segment(f.name) is False
    assert store.segment_facts(f.name) is None


def test_metadata_follows_mooncakes_rules(master):
    store = GatewayStore(master)
    rpc, ram = b"mooncake/rpc_meta/127.0.0.1:12888", b"mooncake/ram/127.0.0.1:12888"
    assert store.metadata_get(rpc) is None
    assert store.metadata_put(rpc, b'{"rpc_port":1}') == "updated"
    assert store.metadata_put(rpc, b'{"rpc_port":1}') == "unchanged"
    assert store.metadata_put(rpc, b'{"rpc_port":2}') == "duplicate"  # another engine on the same address
    assert store.metadata_get(rpc) == b'{"rpc_port":1}'
    assert store.metadata_put(ram, b"[]") == "updated"
    assert store.metadata_put(ram, b"[1]") == "updated"  # any other key is overwritten
    assert store.metadata_delete(rpc) is True and store.metadata_delete(rpc) is False
    assert store.metadata_get(ram) == b"[1]"
    with raises_code(ErrorCode.INVALID_PARAMS):
        store.metadata_put(b"k" * 1025, b"v")
    with raises_code(ErrorCode.INVALID_PARAMS):
        store.metadata_put(b"big", b"v" * (1048576 + 1))


def test_a_client_without_a_segment_is_known_until_it_expires(master):
    store = GatewayStore(master)
    assert master.ping(CLIENT) == "NEED_REMOUNT"
    store.register_client(CLIENT)
    assert master.ping(CLIENT) == "OK"  # on every shard
    watched_silence(master, 2 * master.config.client_ttl)
    assert master.ping(CLIENT) == "NEED_REMOUNT"


def test_the_worker_reaps_segments_of_expired_clients_with_their_metadata(master):
    store = GatewayStore(master)
    gone = mounted(master, store, facts())
    kept = mounted(master, store, facts("127.0.0.1:13000", "0f2fcc18-0000-4000-8000-000000000003"))
    for f in (gone, kept):
        for kind in ("ram", "rpc_meta"):
            store.metadata_put(f"mooncake/{kind}/{f.name}".encode(), b"{}")
    store.metadata_put(b"mooncake/other", b"{}")
    # the owner of `gone` stops pinging; `kept` is mounted by another live client
    master.unmount_segment(kept.name, kept.client)
    master.mount_segment(kept.name, kept.size, "other-client", base=kept.base)
    watched_silence(master, 2 * master.config.client_ttl, ping=("other-client",))
    assert master.segments() and [s["name"] for s in master.segments()] == [kept.name]
    assert store.reap() == 1
    assert store.segment_facts(gone.name) is None and store.segment_name(gone.uuid) is None
    assert store.metadata_get(f"mooncake/ram/{gone.name}".encode()) is None
    assert store.metadata_get(f"mooncake/rpc_meta/{gone.name}".encode()) is None
    assert store.metadata_get(f"mooncake/ram/{kept.name}".encode()) == b"{}"
    assert store.metadata_get(b"mooncake/other") == b"{}"
    assert store.segment_facts(kept.name) is not None
    assert store.reap() == 0


def test_a_worker_pass_reaps(master):
    store = GatewayStore(master)
    f = mounted(master, store, facts())
    store.metadata_put(f"mooncake/ram/{f.name}".encode(), b"{}")
    master.unmount_segment(f.name, f.client)  # a crash between the unmount and its forget
    Worker(master).run_once()
    assert store.segment_facts(f.name) is None
    assert store.metadata_get(f"mooncake/ram/{f.name}".encode()) is None


def test_gateways_are_listed_while_their_heartbeat_holds(master):
    store = GatewayStore(master)
    store.heartbeat("gw-a", "127.0.0.1:50051", "http://127.0.0.1:8080/metadata", 5000)
    store.heartbeat("gw-b", "127.0.0.1:50052", "", 1000)
    assert sorted(g["id"] for g in store.gateways()) == ["gw-a", "gw-b"]
    master.advance_clock(2000)
    assert [g["id"] for g in store.gateways()] == ["gw-a"]
    store.heartbeat("gw-a", "127.0.0.1:50051", "http://127.0.0.1:8080/metadata", 5000)  # drops gw-b's record
    assert master.transport.run([("EXISTS", master.transport.keys[0].gateway("gw-b"))])[0] == 0
    store.heartbeat("gw-a", "127.0.0.1:50051", "", 0)  # leaves
    assert store.gateways() == []


@pytest.mark.parametrize("fn, argv", [
    ("mc_gw_segment_record", [1, "uuid", "u"]),
    ("mc_gw_segment_forget", [1, "name", ""]),
    ("mc_gw_reap", ["0"]),
    ("mc_gw_metadata_delete", [0]),
    ("mc_gw_register_client", [1, "client_id", "x" * 257]),
    ("mc_gw_heartbeat", [4, "id", "g", "rpc", "r", "metadata", "", "ttl_ms", "-1"]),
])
def test_bad_arguments_are_refused(master, fn, argv):
    with raises_code(ErrorCode.INVALID_PARAMS):
        master.transport.call(fn, 0, *argv)
