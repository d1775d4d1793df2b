"""The Mooncake wire codec (mooncake_redis.gateway: codec, schema, frames) against bytes recorded
between the real 0.3.13.post1 client and mooncake_master (tests/data/mooncake-wire), plus
hand-made edge cases and hypothesis fuzzing of the decoder."""
from __future__ import annotations

import collections
import json
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mooncake_redis.gateway import codec, frames, schema
from mooncake_redis.gateway.codec import CodecError, Err, decode, encode

CAPTURES = Path(__file__).parent / "data" / "mooncake-wire"
# non-empty bodies per capture (requests and responses), all re-encoded below
EXPECTED_BODIES = {"single_rpc.jsonl": 58, "two_rpc.jsonl": 84}


# ------------------------------------------------------------------ captures

def _streams(path: Path) -> dict[tuple[int, str], bytes]:
    """The TCP byte streams of a recproxy capture, per (conn, direction); chunks are not frames."""
    streams: dict[tuple[int, str], bytearray] = collections.defaultdict(bytearray)
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if rec["dir"] in ("c2s", "s2c"):
            streams[(rec["conn"], rec["dir"])] += bytes.fromhex(rec["hex"])
    return {k: bytes(v) for k, v in streams.items()}


def _split(stream: bytes, is_request: bool):
    """(seq, function_id or err_code, body) of every frame; the stream must end on a frame."""
    p, out = 0, []
    head = frames.REQ_HEADER if is_request else frames.RSP_HEADER
    while p < len(stream):
        if is_request:
            seq, tag, length, attach = frames.parse_request_header(stream[p:p + head])
        else:
            tag, seq, length, attach = frames.parse_response_header(stream[p:p + head])
        assert attach == 0
        out.append((seq, tag, stream[p + head:p + head + length]))
        p += head + length
    assert p == len(stream), "a frame is cut off at the end of the stream"
    return out


def _bodies(path: Path):
    """(kind, rpc, type, body) of every non-empty body; responses found by (conn, seq)."""
    streams, out = _streams(path), []
    for conn in sorted({c for c, _ in streams}):
        names = {}
        for seq, fid, body in _split(streams.get((conn, "c2s"), b""), True):
            rpc = schema.BY_ID[fid]
            names[seq] = rpc
            if body:
                out.append(("request", rpc, rpc.request, body))
        for seq, err_code, body in _split(streams.get((conn, "s2c"), b""), False):
            assert err_code == 0
            rpc = names[seq]
            out.append(("response", rpc, rpc.response, body))
    return out


ALL_BODIES = [b for name in EXPECTED_BODIES for b in _bodies(CAPTURES / name)]


@pytest.mark.parametrize("name", sorted(EXPECTED_BODIES))
def test_captures_reencode_byte_identical(name):
    bodies = _bodies(CAPTURES / name)
    assert len(bodies) == EXPECTED_BODIES[name]
    for kind, rpc, t, body in bodies:
        value, literal = decode(t, body)
        assert literal, "Debug builds send the literal on every message"
        assert encode(t, value, literal=True) == body, (kind, rpc.name)


def test_captures_cover_the_setup_and_data_rpcs():
    seen = {(kind, rpc.name) for kind, rpc, _, _ in ALL_BODIES}
    for name in ("ExistKey", "BatchExistKey", "GetReplicaList", "PutStart", "PutEnd", "Ping",
                 "MountSegment", "ReMountSegment", "UnmountSegment", "FetchTasks", "Remove", "RemoveAll"):
        assert ("request", name) in seen and ("response", name) in seen, name
    assert ("response", "ServiceReady") in seen and ("response", "GetStorageConfig") in seen


def _strip_literal(t: codec.Type, body: bytes, keep_metainfo: bool) -> bytes:
    """The body as a Release (NDEBUG) build sends it: no literal; no metainfo byte at width 1."""
    h, meta = struct.unpack_from("<IB", body)
    assert meta & 4
    rest = body[5 + len(t.literal0):]
    if meta == 4 and not keep_metainfo:
        return struct.pack("<I", h & ~1) + rest
    return struct.pack("<IB", h, meta & ~4) + rest


@pytest.mark.parametrize("keep_metainfo", [False, True])
def test_literal_free_forms_decode_the_same(keep_metainfo):
    for _, rpc, t, body in ALL_BODIES:
        value, _ = decode(t, body)
        bare = _strip_literal(t, body, keep_metainfo)
        assert decode(t, bare) == (value, False), rpc.name
        if not keep_metainfo:  # what we send without literal is what a Release build sends
            assert encode(t, value) == bare


def _encode_at_width(t: codec.Type, value, code: int, literal: bool) -> bytes:
    """Every length at width code (struct_pack never writes a wider width than it needs, but a
    receiver must read any)."""
    out = [t.heads[literal][code]]
    t.writer(code)(value, out)
    return b"".join(out)


@pytest.mark.parametrize("code", [1, 2, 3])
def test_every_length_width_decodes(code):
    for _, rpc, t, body in ALL_BODIES:
        value, _ = decode(t, body)
        for literal in (False, True):
            wide = _encode_at_width(t, value, code, literal)
            assert decode(t, wide) == (value, literal), rpc.name
            assert encode(t, value, literal=True) == body  # and back to the canonical form


# ------------------------------------------------------------------ hashes, ids, known bytes

@pytest.mark.parametrize("t, expected_hash", [
    (schema.RPCS["ExistKey"].request, 0x7CF91ED8),
    (schema.RPCS["PutStart"].request, 0xE385BD0E),
    (schema.RPCS["GetReplicaList"].response, 0x88C6276C),
    (schema.RPCS["Ping"].request, 0x3C6D83E0),
    (schema.RPCS["Ping"].response, 0x742A8F52),
    (schema.RPCS["PutStart"].response, 0xC43927A6),
    (schema.RPCS["PutEnd"].request, 0xD1819222),
    (schema.RPCS["MountSegment"].request, 0x9EF70DAE),
    (schema.RPCS["ServiceReady"].response, 0x1CB3CC34),
])
def test_type_hashes(t, expected_hash):
    assert t.hash == expected_hash


def test_function_ids():
    assert schema.RPCS["ExistKey"].id == 0x89385F09
    assert schema.RPCS["Ping"].id == 0xD6C2DAE5
    assert schema.RPCS["PutStart"].id == 0x65EA9AC1
    assert schema.BY_ID[0x1F7EF174].name == "GetReplicaList"
    assert len(schema.NAMES_BY_ID) == 65
    assert schema.NAMES_BY_ID[schema.function_id("CopyStart")] == "CopyStart"  # not served, named
    assert set(schema.BY_ID) <= set(schema.NAMES_BY_ID)
    assert schema.SCHEMAS[schema.CLIENT_RELEASE] is schema.RPCS


def test_reference_example_exist_key():
    # is_exist("nope") from REFERENCE.md: request body and the reply
    t = schema.RPCS["ExistKey"]
    body = bytes.fromhex("d91ef97c04fd800c800cff00046e6f70650764656661756c74")
    assert decode(t.request, body) == ((b"nope", b"default"), True)
    assert encode(t.request, ("nope", "default"), literal=True) == body
    assert encode(t.response, False, literal=True) == bytes.fromhex("d300e89004870b01000100")


def test_recorded_put_start_reply():
    rsp = schema.RPCS["PutStart"].response
    rd = schema.ReplicaDescriptor(1, (schema.DescriptorKind.MEMORY, schema.MemoryDescriptor(
        schema.BufferDescriptor(11, 0x7F2B7F000000, b"tcp", b"127.0.0.1:12888"))),
        schema.ReplicaStatus.PROCESSING)
    body = encode(rsp, [rd])
    assert body[4:] == bytes.fromhex(
        "0101010000000000000000" "0b00000000000000" "0000007f2b7f0000" "03746370"
        "0f3132372e302e302e313a3132383838" "02000000")
    value, _ = decode(rsp, body)
    assert value == [rd] and type(value[0]) is schema.ReplicaDescriptor
    assert type(value[0].descriptor_variant[1].buffer_descriptor) is schema.BufferDescriptor


def test_values_map_to_python():
    grl = schema.RPCS["GetReplicaList"].response
    assert decode(grl, encode(grl, Err(schema.ErrorCode.OBJECT_NOT_FOUND)))[0] == Err(-704)
    e_void = schema.RPCS["PutEnd"].response
    assert decode(e_void, encode(e_void, None)) == (None, False)
    assert decode(schema.RPCS["RemoveAll"].response, encode(schema.RPCS["RemoveAll"].response, -3))[0] == -3
    ping = schema.RPCS["Ping"].request  # one parameter: sent bare, read as a 1-tuple
    assert encode(ping, ((1, 2),)) == struct.pack("<IQQ", ping.hash, 1, 2)
    assert decode(ping, encode(ping, ((1, 2),)))[0] == ((1, 2),)
    assert decode(schema.RPCS["ServiceReady"].request, b"") == ((), False)
    assert encode(None, ()) == b""
    ready = schema.RPCS["ServiceReady"].response
    assert decode(ready, encode(ready, schema.SERVICE_VERSION))[0] == b"2.0.0"
    regex = schema.RPCS["GetReplicaListByRegex"].response
    assert decode(regex, encode(regex, {b"a": [], b"b": []}))[0] == {b"a": [], b"b": []}


@pytest.mark.parametrize("n, meta", [(255, None), (256, 0x08), (65535, 0x08), (65536, 0x10)])
def test_width_from_the_longest_string(n, meta):
    t = schema.RPCS["ExistKey"].request
    body = encode(t, (b"k" * n, b"default"))
    if meta is None:
        assert body[:4] == struct.pack("<I", t.hash) and body[4] == n
    else:
        assert body[:5] == struct.pack("<IB", t.hash | 1, meta)
        assert decode(t, body)[0] == (b"k" * n, b"default")
    lit = encode(t, (b"k" * n, b"default"), literal=True)
    assert lit[4] == (meta or 0) | 4


def test_width_from_the_longest_container():
    # as recorded: a 301-key batch_is_exist goes out with metainfo 0x0c (2-byte lengths + literal)
    t = schema.RPCS["BatchExistKey"]
    keys = [b"key-%d" % i for i in range(301)]
    body = encode(t.request, (keys, b"default"), literal=True)
    assert body[4] == 0x0C and struct.unpack_from("<H", body, 5 + len(t.request.literal0))[0] == 301
    assert decode(t.request, body) == ((keys, b"default"), True)
    assert encode(t.response, [True] * 300 + [False])[4] == 0x08


# ------------------------------------------------------------------ refusals

def _ok_body(name="PutStart"):
    return next(b for k, r, _, b in ALL_BODIES if r.name == name and k == "request")


def test_decode_refuses():
    t = schema.RPCS["PutStart"].request
    body = _ok_body()
    bad = {
        "short": body[:-1],
        "trailing": body + b"\0",
        "hash": struct.pack("<I", t.hash ^ 0x10) + body[4:],
        "compatible": body[:4] + bytes([body[4] | 1]) + body[5:],
        "literal": body[:6] + bytes([body[6] ^ 1]) + body[7:],
        "empty": b"",
        "head only": body[:3],
    }
    for what, b in bad.items():
        with pytest.raises(CodecError):
            decode(t, b)
        assert what
    with pytest.raises(CodecError):
        decode(None, b"\0")
    h = struct.unpack_from("<I", body)[0]
    for bit in range(1, 32):  # the top 31 bits are checked, each of them
        with pytest.raises(CodecError, match="hash"):
            decode(t, struct.pack("<I", h ^ (1 << bit)) + body[4:])
    rsp = schema.RPCS["GetReplicaList"].response
    ok = encode(rsp, schema.GetReplicaListResponse([], 10, None))
    with pytest.raises(CodecError, match="flag"):
        decode(rsp, ok[:4] + b"\x02" + ok[5:])  # expected flag 2
    put = schema.RPCS["PutStart"].response
    one = encode(put, [schema.ReplicaDescriptor(1, (2, schema.DiskDescriptor(b"f", 1)), 3)])
    with pytest.raises(CodecError, match="variant"):  # head 4, flag, count, id 8, then the index
        decode(put, one[:6 + 8] + b"\x05" + one[7 + 8:])


def test_counts_beyond_the_body_are_refused_before_allocating():
    t = schema.RPCS["BatchExistKey"].request
    for code, fmt in ((1, "<H"), (2, "<I"), (3, "<Q")):
        claim = (1 << (8 * struct.calcsize(fmt))) - 1
        body = struct.pack("<IB", t.hash | 1, code << 3) + struct.pack(fmt, claim) + b"\0" * 64
        with pytest.raises(CodecError, match="elements claimed"):
            decode(t, body)
    bpe = schema.RPCS["BatchPutStart"].request  # vector<u64>: one unpack, bounded first
    value = ((1, 2), [b"a"], [5], schema.ReplicateConfig(), b"default")
    body = encode(bpe, value)
    at = body.index(b"\x01\x05" + b"\0" * 7)  # count 1, then the u64 5
    with pytest.raises(CodecError, match="elements claimed"):
        decode(bpe, body[:at] + b"\xff" + body[at + 1:])
    t = schema.RPCS["ExistKey"].request  # a string longer than the body: refused, not sliced short
    with pytest.raises(CodecError):
        decode(t, struct.pack("<I", t.hash) + b"\xff" + b"x" * 10 + b"\x00")


def test_bool_bytes_above_one_are_refused():
    t = schema.RPCS["Remove"].request
    body = encode(t, (b"k", True, b"default"))
    assert body[6] == 1
    with pytest.raises(CodecError):
        decode(t, body[:6] + b"\x02" + body[7:])


def test_encode_refuses_misfits():
    t = schema.RPCS["PutEnd"].request
    for value in [((1, 2), schema.ObjectMeta(b"k"), 4),  # a field short
                  ((1, 2), schema.ObjectMeta(b"k"), 4, b"t", b"extra"),
                  ((1, -2), schema.ObjectMeta(b"k"), 4, b"t"),  # u64 below 0
                  ((1, 2), schema.ObjectMeta(7), 4, b"t"),  # an int for a string
                  ((1, 2), schema.ObjectMeta(b"k"), 1 << 40, b"t")]:  # beyond i32
        with pytest.raises(CodecError):
            encode(t, value)
    with pytest.raises(CodecError):
        encode(schema.RPCS["PutStart"].response, [schema.ReplicaDescriptor(1, (9, None), 3)])
    with pytest.raises(CodecError):
        encode(schema.RPCS["PutEnd"].response, True)  # expected<void> takes None or an Err


# ------------------------------------------------------------------ frames

def test_request_header_round_trip():
    frame = frames.request_frame(7, 0x89385F09, b"body")
    assert len(frame) == frames.REQ_HEADER + 4
    assert frames.parse_request_header(frame) == (7, 0x89385F09, 4, 0)


def test_response_frames():
    frame = frames.response_frame(9, b"xyz")
    assert frames.parse_response_header(frame) == (0, 9, 3, 0) and frame[16:] == b"xyz"
    assert frame[0] == frames.MAGIC and len(frame) == frames.RSP_HEADER + 3
    err = frames.error_frame(3, frames.ERRC_FUNCTION_NOT_REGISTERED, "the rpc function not registered")
    code, seq, length, _ = frames.parse_response_header(err)
    assert (code, seq, length) == (11, 3, len(err) - 16)
    assert decode(codec.string, err[16:])[0] == b"the rpc function not registered"
    assert frames.parse_error_body(code, err[16:]) == (11, "the rpc function not registered")
    big = frames.error_frame(1, 300, "user error")
    assert big[2] == 255 and frames.parse_error_body(255, big[16:]) == (300, "user error")
    assert frames.ERRC_INVALID_RPC_ARGUMENTS == 4


@pytest.mark.parametrize("offset, value", [(0, 22), (1, 1), (2, 1), (3, 2)])
def test_bad_request_headers(offset, value):
    frame = bytearray(frames.request_frame(0, 1, b""))
    frame[offset] = value
    with pytest.raises(frames.FrameError):
        frames.parse_request_header(bytes(frame))


def test_oversized_and_short_request_headers():
    with pytest.raises(frames.FrameError, match="claims"):
        frames.parse_request_header(struct.pack("<BBBBIIII", 21, 0, 0, 0, 0, 1, frames.MAX_BODY, 1))
    at_limit = struct.pack("<BBBBIIII", 21, 0, 0, 0, 0, 1, frames.MAX_BODY, 0)
    assert frames.parse_request_header(at_limit)[2] == frames.MAX_BODY
    with pytest.raises(frames.FrameError):
        frames.parse_request_header(b"\x15" * 19)


# ------------------------------------------------------------------ hypothesis

ALL_TYPES = sorted({t for r in schema.RPCS.values() for t in (r.request, r.response) if t is not None},
                   key=lambda t: t.name)
_INTS = {"b": (-(1 << 7), (1 << 7) - 1), "B": (0, (1 << 8) - 1), "h": (-(1 << 15), (1 << 15) - 1),
         "H": (0, (1 << 16) - 1), "i": (-(1 << 31), (1 << 31) - 1), "I": (0, (1 << 32) - 1),
         "q": (-(1 << 63), (1 << 63) - 1), "Q": (0, (1 << 64) - 1)}


def values(t: codec.Type, long: bool = False) -> st.SearchStrategy:
    """Python values of a type, the way decode returns them (long: strings beyond 255 bytes)."""
    k, parts = t.kind, t.parts
    if k == "scalar":
        return st.floats(allow_nan=False) if t.fixed == "d" else st.integers(*_INTS[t.fixed])
    if k == "bool":
        return st.booleans()
    if k == "void":
        return st.none()
    if k == "uuid":
        return st.tuples(st.integers(0, (1 << 64) - 1), st.integers(0, (1 << 64) - 1))
    if k == "string":
        return st.binary(max_size=300 if long else 12)
    if k == "vector":
        return st.lists(values(parts[0], long), max_size=4)
    if k == "map":
        return st.dictionaries(values(parts[0], long), values(parts[1], long), max_size=3)
    if k == "optional":
        return st.none() | values(parts[0], long)
    if k == "variant":
        return st.one_of([st.tuples(st.just(i), values(a, long)) for i, a in enumerate(parts)])
    if k == "expected":
        return values(parts[0], long) | st.builds(Err, values(parts[1], long))
    if k == "struct":
        return st.tuples(*(values(p, long) for p in parts)).map(t.cls._make)
    assert k == "args"
    return st.tuples(*(values(p, long) for p in parts))


@st.composite
def typed_values(draw):
    t = draw(st.sampled_from(ALL_TYPES))
    return t, draw(values(t, long=draw(st.booleans())))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(typed_values(), st.booleans())
def test_round_trip_of_generated_values(tv, literal):
    t, value = tv
    body = encode(t, value, literal=literal)
    assert decode(t, body) == (value, literal)
    assert encode(t, decode(t, body)[0], literal=literal) == body


def _must_only_raise_codec_error(t, body):
    try:
        value, literal = decode(t, body)
    except CodecError:
        return
    # whatever decodes is a value of the type: it encodes again (not necessarily to the same
    # bytes, a wider width than needed being legal on the way in)
    assert decode(t, encode(t, value, literal=literal))[0] == value


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(ALL_TYPES), st.binary(max_size=64), st.integers(0, 3), st.booleans())
def test_random_bodies_raise_only_codec_error(t, tail, code, literal):
    _must_only_raise_codec_error(t, tail)  # anything at all
    _must_only_raise_codec_error(t, t.heads[literal][code] + tail)  # past a valid head


@settings(max_examples=800, deadline=None)
@given(st.sampled_from(ALL_BODIES), st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255),
                                                       st.sampled_from(["set", "insert", "delete"])),
                                             min_size=1, max_size=4))
def test_mutated_captured_bodies_raise_only_codec_error(captured, edits):
    _, _, t, body = captured
    b = bytearray(body)
    for pos, byte, op in edits:
        pos %= len(b) + 1
        if op == "insert":
            b.insert(pos, byte)
        elif pos < len(b):
            if op == "set":
                b[pos] = byte
            else:
                del b[pos]
    _must_only_raise_codec_error(t, bytes(b))
