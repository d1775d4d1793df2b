"""coro_rpc framing (yalantinglibs coro_rpc_protocol.hpp), all fields little-endian.

Request header, 20 bytes: u8 magic 21 | u8 version 0 | u8 serialize_type 0 (struct_pack) |
u8 msg_type 0 | u32 seq_num | u32 function_id | u32 length | u32 attach_length; then the body and
the attachment. Response header, 16 bytes: u8 magic | u8 version | u8 err_code | u8 msg_type |
u32 seq_num (the request's) | u32 length | u32 attach_length.

An error reply (err_code != 0) carries the message as a struct_pack string; an errc above 255 is
sent as err_code 255 with a struct_pack pair<uint16_t, string> (prepare_response).
"""
from __future__ import annotations

import struct
from typing import NamedTuple

from .codec import args, decode, encode, string, u16

REQ_HEADER = 20
RSP_HEADER = 16
MAGIC = 21
VERSION = 0  # coro_rpc_protocol::VERSION_NUMBER; the server refuses anything above
MAX_BODY = 64 << 20  # body + attachment a request may claim; more is refused before reading

# coro_rpc::errc (ylt/coro_rpc/impl/errno.h), the response header's err_code
ERRC_OK = 0
ERRC_IO_ERROR = 1
ERRC_TIMED_OUT = 3
ERRC_INVALID_RPC_ARGUMENTS = 4  # the body did not deserialize as the handler's parameters
ERRC_RPC_THROW_EXCEPTION = 10
ERRC_FUNCTION_NOT_REGISTERED = 11
ERRC_PROTOCOL_ERROR = 12
ERRC_MESSAGE_TOO_LARGE = 14

_REQ = struct.Struct("<BBBBIIII")
_RSP = struct.Struct("<BBBBIII")
_ERR_PAIR = args(u16, string)  # std::pair<uint16_t, std::string_view>: literal as a 2-field struct


class FrameError(ValueError):
    """A header the gateway must not serve: the connection should be closed."""


class Request(NamedTuple):
    seq: int
    function_id: int
    body: bytes
    attachment: bytes


def parse_request_header(buf: bytes | bytearray, offset: int = 0) -> tuple[int, int, int, int]:
    """(seq, function_id, length, attach_length) of the 20-byte request header at `offset`; FrameError for a
    wrong magic, a version above 0, a serialize_type other than struct_pack, a msg_type other than
    0, or a body and attachment above MAX_BODY."""
    if len(buf) - offset < REQ_HEADER:
        raise FrameError(f"request header of {len(buf) - offset} bytes, needs {REQ_HEADER}")
    magic, version, serialize_type, msg_type, seq, fid, length, attach = _REQ.unpack_from(buf, offset)
    if magic != MAGIC:
        raise FrameError(f"magic {magic}, not {MAGIC}")
    if version > VERSION:
        raise FrameError(f"protocol version {version} (this server speaks {VERSION})")
    if serialize_type != 0:
        raise FrameError(f"serialize_type {serialize_type} (only 0, struct_pack)")
    if msg_type != 0:
        raise FrameError(f"msg_type {msg_type}")
    if length + attach > MAX_BODY:
        raise FrameError(f"frame claims {length + attach} bytes, more than {MAX_BODY}")
    return seq, fid, length, attach


def request_frame(seq: int, function_id: int, body: bytes, attachment: bytes = b"") -> bytes:
    """A request as the client sends it (for tests and probes)."""
    return _REQ.pack(MAGIC, VERSION, 0, 0, seq, function_id, len(body), len(attachment)) + body + attachment


def response_frame(seq: int, body: bytes, err_code: int = 0) -> bytes:
    """Response header + body."""
    return _RSP.pack(MAGIC, VERSION, err_code, 0, seq, len(body), 0) + body


def error_frame(seq: int, errc: int, message: str) -> bytes:
    """A coro_rpc error reply, as the server's prepare_response writes it: err_code = errc and the
    message as a struct_pack string (an errc above 255: err_code 255, body pair<u16, string>)."""
    if errc > 255:
        return response_frame(seq, encode(_ERR_PAIR, (errc, message)), 255)
    return response_frame(seq, encode(string, message), errc)


def parse_response_header(buf: bytes) -> tuple[int, int, int, int]:
    """(err_code, seq, length, attach_length) of a 16-byte response header."""
    if len(buf) < RSP_HEADER:
        raise FrameError(f"response header of {len(buf)} bytes, needs {RSP_HEADER}")
    magic, version, err_code, _msg_type, seq, length, attach = _RSP.unpack_from(buf)
    if magic != MAGIC or version > VERSION:
        raise FrameError(f"magic {magic} version {version}")
    return err_code, seq, length, attach


def parse_error_body(err_code: int, body: bytes) -> tuple[int, str]:
    """(errc, message) of an error reply's body; CodecError if it is not one."""
    if err_code == 255:
        (errc, msg), _ = decode(_ERR_PAIR, body)
    else:
        (msg, _), errc = decode(string, body), err_code
    if isinstance(msg, bytes):
        msg = msg.decode("utf-8", "replace")
    return errc, msg


__all__ = ["REQ_HEADER", "RSP_HEADER", "MAGIC", "MAX_BODY", "FrameError", "Request",
           "parse_request_header", "request_frame", "response_frame", "error_frame",
           "parse_response_header", "parse_error_body",
           "ERRC_INVALID_RPC_ARGUMENTS", "ERRC_FUNCTION_NOT_REGISTERED", "ERRC_RPC_THROW_EXCEPTION"]
