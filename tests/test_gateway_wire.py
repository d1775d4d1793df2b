"""The gateway on the wire, without Mooncake's client: raw coro_rpc frames and HTTP requests
against a gateway on a real Valkey. What it cannot serve is answered at once (UNSUPPORTED, or
coro_rpc's function_not_registered / invalid_rpc_arguments), a bad frame closes only its own
connection, fuzzed frames never stop it serving, and the metadata server keeps Mooncake's
answers and RFC 000's active invalidation."""
from __future__ import annotations

import http.client
import json
import socket
import struct
import uuid

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from mooncake_redis import Master, MasterConfig, ReplicateConfig
from mooncake_redis.gateway import frames, schema
from mooncake_redis.gateway.codec import Err, decode, encode
from mooncake_redis.gateway.server import GatewayThread, Listeners
from mooncake_redis.server import free_port

CLIENT = (0x1234, 0x5678)


@pytest.fixture(scope="module")
def served(valkey):
    master = Master.connect(valkey.url, MasterConfig(namespace=f"gw{uuid.uuid4().hex[:8]}"))
    thread = GatewayThread(master, Listeners("127.0.0.1", free_port(), free_port()))
    thread.start()
    yield master, thread.gateway
    thread.stop()
    master.close()


class Conn:
    def __init__(self, address: str):
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.seq = 0

    def send(self, name: str, *args, literal: bool = False) -> bytes:
        rpc = schema.RPCS[name]
        body = encode(rpc.request, args, literal=literal) if rpc.request is not None else b""
        self.sock.sendall(frames.request_frame(self.seq, rpc.id, body))
        self.seq += 1
        return body

    def reply(self) -> tuple[int, int, bytes]:
        head = self._exactly(frames.RSP_HEADER)
        magic, _, err, _, seq, length, _ = struct.unpack("<BBBBIII", head)
        assert magic == frames.MAGIC
        return err, seq, self._exactly(length)

    def call(self, name: str, *args, literal: bool = False):
        self.send(name, *args, literal=literal)
        err, _, body = self.reply()
        assert err == 0, body
        return decode(schema.RPCS[name].response, body)

    def _exactly(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("closed")
            out += chunk
        return out

    def closed(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except (ConnectionError, socket.timeout):
            return True


def test_service_ready_and_reply_literal_follow_the_request(served):
    _, gateway = served
    c = Conn(gateway.rpc_address)
    assert c.call("ServiceReady") == (schema.SERVICE_VERSION.encode(), False)
    value, literal = c.call("ExistKey", b"nope", b"default", literal=True)
    assert (value, literal) == (False, True)  # a Debug-build client gets the literal back
    assert c.call("ExistKey", b"nope", b"default") == (False, False)


def test_an_rpc_it_does_not_serve_is_answered_at_once(served):
    _, gateway = served
    c = Conn(gateway.rpc_address)
    assert "DynamicReplicaCopyEnd" in schema.RPCS
    value, _ = c.call("DynamicReplicaCopyEnd", (1, 2), b"k", b"default", (3, 4), 0)
    assert value == Err(schema.ErrorCode.UNSUPPORTED)
    c.sock.sendall(frames.request_frame(7, 0xDEADBEEF, b""))  # no such function id
    err, seq, _ = c.reply()
    assert (err, seq) == (frames.ERRC_FUNCTION_NOT_REGISTERED, 7)
    assert c.call("ServiceReady")[0] == b"2.0.0"  # the connection still serves


def test_an_undecodable_request_gets_invalid_arguments(served):
    _, gateway = served
    c = Conn(gateway.rpc_address)
    c.sock.sendall(frames.request_frame(3, schema.RPCS["ExistKey"].id, b"\x00\x01\x02"))
    err, seq, _ = c.reply()
    assert (err, seq) == (frames.ERRC_INVALID_RPC_ARGUMENTS, 3)
    assert c.call("ServiceReady")[0] == b"2.0.0"


@pytest.mark.parametrize("head", [
    struct.pack("<BBBBIIII", 22, 0, 0, 0, 0, 0, 0, 0),                 # wrong magic
    struct.pack("<BBBBIIII", 21, 1, 0, 0, 0, 0, 0, 0),                 # a newer protocol version
    struct.pack("<BBBBIIII", 21, 0, 0, 0, 0, 0, frames.MAX_BODY + 1, 0),  # oversized
])
def test_a_bad_header_closes_only_its_connection(served, head):
    _, gateway = served
    bad, good = Conn(gateway.rpc_address), Conn(gateway.rpc_address)
    bad.sock.sendall(head)
    assert bad.closed()
    assert good.call("ServiceReady")[0] == b"2.0.0"


def test_pipelined_requests_are_answered_in_request_order(served):
    """More requests than a connection keeps in flight (it stops reading, then reads on), of
    every kind (answered at once, by Redis round trips on the event loop, on the thread pool,
    refused), written at once: each reply comes, in request order, with its own answer."""
    from mooncake_redis.gateway.connection import MAX_IN_FLIGHT
    master, gateway = served
    master.mount_segment("pipe/seg0", 1 << 20, client_id="pipe-client", base=0x1000)
    master.put_start("pipe-client", b"pipe-present", 64)
    master.put_end("pipe-client", b"pipe-present")
    c = Conn(gateway.rpc_address)
    kinds = [("ExistKey", (b"pipe-present", b"default"), (True, False)),
             ("ExistKey", (b"pipe-absent", b"default"), (False, False)),
             ("ServiceReady", (), (schema.SERVICE_VERSION.encode(), False)),
             ("GetStorageConfig", (), None),
             ("DynamicReplicaCopyEnd", ((1, 2), b"k", b"default", (3, 4), 0),
              (Err(schema.ErrorCode.UNSUPPORTED), False))]
    n = 3 * MAX_IN_FLIGHT
    wanted = [kinds[i % len(kinds)] for i in range(n)]
    out = b"".join(frames.request_frame(i, schema.RPCS[name].id, encode(schema.RPCS[name].request, args)
                                        if schema.RPCS[name].request is not None else b"")
                   for i, (name, args, _) in enumerate(wanted))
    try:
        c.sock.sendall(out)
        for i, (name, _, answer) in enumerate(wanted):
            err, seq, body = c.reply()
            assert (err, seq) == (0, i)
            if answer is not None:
                assert decode(schema.RPCS[name].response, body) == answer
    finally:  # the module's other tests allocate on the segments they mount alone
        master.unmount_segment("pipe/seg0", client_id="pipe-client")


def test_a_defect_in_a_handler_is_answered_and_the_connection_serves_on(served, monkeypatch):
    """A handler that fails when called, one whose steps fail, and one whose value cannot be
    encoded: each request gets an answer, and the requests after it on the connection too."""
    _, gateway = served

    def fails_when_called(key, tenant):
        raise TypeError("a defect")

    def steps_fail(key, tenant):
        raise RuntimeError("a defect")
        yield

    def unencodable(key, tenant):
        return "not a GetReplicaListResponse"
        yield
    c = Conn(gateway.rpc_address)
    for name, handler, errc in (("ExistKey", fails_when_called, frames.ERRC_RPC_THROW_EXCEPTION),
                                ("ExistKey", steps_fail, 0),
                                ("GetReplicaList", unencodable, frames.ERRC_RPC_THROW_EXCEPTION)):
        monkeypatch.setattr(gateway.handlers, name, handler, raising=False)
        c.send(name, b"k", b"default")
        c.send("ServiceReady")
        err, _, body = c.reply()
        assert err == errc
        if errc == 0:  # the steps' failure is Mooncake's INTERNAL_ERROR
            assert decode(schema.RPCS[name].response, body)[0] == Err(schema.ErrorCode.INTERNAL_ERROR)
        err, _, body = c.reply()
        assert err == 0 and decode(schema.RPCS["ServiceReady"].response, body)[0] == schema.SERVICE_VERSION.encode()


def test_a_frame_that_arrives_byte_by_byte_is_served(served):
    _, gateway = served
    c = Conn(gateway.rpc_address)
    c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rpc = schema.RPCS["ExistKey"]
    frame = frames.request_frame(9, rpc.id, encode(rpc.request, (b"nope", b"default")))
    for i in range(len(frame)):
        c.sock.sendall(frame[i:i + 1])
    err, seq, body = c.reply()
    assert (err, seq, decode(rpc.response, body)) == (0, 9, (False, False))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["ExistKey", "BatchExistKey", "GetReplicaList", "PutStart", "Ping", "Remove"]),
       body=st.binary(max_size=200), truncate=st.booleans())
def test_fuzzed_frames_never_stop_the_gateway(served, name, body, truncate):
    _, gateway = served
    c = Conn(gateway.rpc_address)
    frame = frames.request_frame(1, schema.RPCS[name].id, body)
    c.sock.sendall(frame[:len(frame) // 2] if truncate else frame)
    if truncate:
        c.sock.close()  # a peer gone mid-frame
    else:
        err, seq, _ = c.reply()  # an answer, of whatever kind
        assert seq == 1
    assert Conn(gateway.rpc_address).call("ServiceReady")[0] == b"2.0.0"


def _default_config():
    return schema.ReplicateConfig(1, 0, 0, 0, None, False, [], b"", [], False, 0, b"", None)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(base=st.integers(0, 2**46).map(lambda b: b * 4096), size_kib=st.integers(64, 4096),
       sizes=st.lists(st.integers(1, 64 << 10), min_size=1, max_size=24))
def test_every_handed_out_address_lies_inside_the_segment(served, base, size_kib, sizes):
    """Mooncake's client writes and reads where the descriptors point: never outside its segment."""
    master, gateway = served
    c = Conn(gateway.rpc_address)
    seg_id, name = (uuid.uuid4().int >> 64, 1), f"seg-{uuid.uuid4().hex[:8]}".encode()
    size = size_kib << 10
    c.call("MountSegment", schema.Segment(seg_id, name, base, size, name, b"tcp", b""), CLIENT)
    try:
        keys = [f"addr-{uuid.uuid4().hex}".encode() for _ in sizes]
        replies, _ = c.call("BatchPutStart", CLIENT, keys, sizes, _default_config(), b"default")
        for reply, want in zip(replies, sizes):
            if isinstance(reply, Err):  # the segment is full
                assert reply.code == int(schema.ErrorCode.NO_AVAILABLE_HANDLE)
                continue
            (d,) = reply
            buf = d.descriptor_variant[1].buffer_descriptor
            assert buf.size_ == want and buf.transport_endpoint_ == name
            assert base <= buf.buffer_address_ and buf.buffer_address_ + buf.size_ <= base + size
    finally:
        c.call("UnmountSegment", seg_id, CLIENT)


def test_ping_asks_an_unknown_client_to_remount_and_remount_registers_it(served):
    _, gateway = served
    c = Conn(gateway.rpc_address)
    client = (uuid.uuid4().int >> 64, 2)
    assert c.call("Ping", client)[0].client_status == 2  # NEED_REMOUNT
    assert c.call("ReMountSegment", [], client)[0] is None
    assert c.call("Ping", client)[0].client_status == 1  # OK
    assert c.call("UnmountSegment", (9, 9), client)[0] == Err(int(schema.ErrorCode.SEGMENT_NOT_FOUND))


def test_a_batch_refused_as_a_whole_answers_each_key(served):
    _, gateway = served
    c = Conn(gateway.rpc_address)
    config = _default_config()._replace(dfs_replica_num=1)  # no DFS replicas here
    replies, _ = c.call("BatchPutStart", CLIENT, [b"a", b"b"], [1, 1], config, b"default")
    assert replies == [Err(int(schema.ErrorCode.INVALID_PARAMS))] * 2


# ---- HTTP ------------------------------------------------------------------------------

def http_call(gateway, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    host, port = gateway.metadata_url.split("//")[1].split("/")[0].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    return r.status, r.read()


def test_metadata_answers_as_mooncakes_server(served):
    _, gateway = served
    key = f"/metadata?key=mooncake%2Frpc_meta%2F127.0.0.1%3A{uuid.uuid4().int % 60000}"
    assert http_call(gateway, "GET", key) == (404, b"metadata not found")
    assert http_call(gateway, "PUT", key, b'{"rpc_port":1}') == (200, b"metadata updated")
    assert http_call(gateway, "PUT", key, b'{"rpc_port":1}') == (200, b"metadata unchanged")
    assert http_call(gateway, "PUT", key, b'{"rpc_port":2}') == (400, b"Duplicate rpc_meta key not allowed")
    assert http_call(gateway, "GET", key) == (200, b'{"rpc_port":1}')
    assert http_call(gateway, "DELETE", key) == (200, b"metadata deleted")
    assert http_call(gateway, "DELETE", key) == (404, b"metadata not found")
    assert http_call(gateway, "GET", "/metadata") == (400, b"Missing key parameter")
    assert http_call(gateway, "GET", "/health") == (200, b"OK")
    assert http_call(gateway, "GET", "/nothing")[0] == 404


def test_cache_evict_ends_the_guarantees_under_a_prefix(served):
    master, gateway = served
    prefix = uuid.uuid4().hex * 2  # 64 hex: the default radix_key_pattern
    master.mount_segment(f"g-{prefix[:8]}", 1 << 20, "writer")
    key = f"{prefix}_0"
    master.put_start("writer", key, 100, ReplicateConfig(guaranteed_ttl_ms=600_000))
    master.put_end("writer", key)
    status, body = http_call(gateway, "POST", "/v1/cache/evict", json.dumps({"prefix_hashes": [prefix]}).encode())
    assert status == 200 and json.loads(body) == {"tenant_id": "default", "expired": {prefix: 1}, "total": 1}
    assert master.describe(key).guaranteed_until_ms is None
    for bad in (b"not json", b"[]", b'{"prefix_hashes": ["XYZ"]}', b'{"prefix_hashes": []}',
                b'{"prefix_hashes": ["ab"], "tenant_id": "bad tenant"}'):
        status, reason = http_call(gateway, "POST", "/v1/cache/evict", bad)
        assert status == 400 and reason, bad
    assert http_call(gateway, "GET", "/v1/cache/evict")[0] == 405


def test_the_metrics_count_each_rpc_and_its_errors(valkey):
    import urllib.request
    master = Master.connect(valkey.url, MasterConfig(namespace=f"gw{uuid.uuid4().hex[:8]}"))
    metrics = free_port()
    thread = GatewayThread(master, Listeners("127.0.0.1", free_port(), 0, metrics))
    thread.start()
    try:
        c = Conn(thread.gateway.rpc_address)
        c.call("ServiceReady")
        c.call("Remove", b"missing", True, b"default")
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10).read().decode()
        assert 'mooncake_gateway_rpc_calls_total{rpc="ServiceReady"} 1.0' in text
        assert 'mooncake_gateway_rpc_errors_total{code="-704",rpc="Remove"} 1.0' in text
        assert 'mooncake_gateway_rpc_seconds_count{rpc="Remove"} 1.0' in text
        assert 'mooncake_gateway_rpc_seconds_bucket{le="+Inf",rpc="Remove"} 1.0' in text
        assert 'mooncake_gateway_rpc_connections_total 1.0' in text
    finally:
        thread.stop()
        master.close()
