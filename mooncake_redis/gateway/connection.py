"""One client's coro_rpc connection, as an asyncio Protocol: frames are cut from the bytes as
they arrive (no stream reader, no coroutine per read), each request is dispatched at once, and
the replies are written in request order.

Back-pressure: a connection with more than MAX_IN_FLIGHT requests unanswered, or more than
MAX_UNSENT reply bytes its client has not read, stops reading until it is below again (the frames
already received wait in its buffer). A frame with a wrong header or an oversized body closes the
connection (the client reconnects)."""
from __future__ import annotations

import asyncio
import collections
import logging
import socket
from typing import Any, Callable

from . import frames

log = logging.getLogger("mooncake_redis.gateway")

MAX_IN_FLIGHT = 256          # requests of one connection not yet answered before it stops reading
MAX_UNSENT = 4 << 20         # reply bytes of one connection not yet sent before it stops reading



class Pending:
    """A reply still being worked out: its frame, once set, is written after the replies before it."""
    __slots__ = ("frame", "ready")

    def __init__(self) -> None:
        self.frame: bytes | None = None
        self.ready: Callable[[], None] | None = None  # the connection's flush

    def set(self, frame: bytes) -> None:
        self.frame = frame
        if self.ready is not None:
            self.ready()


Dispatch = Callable[[int, int, bytes], "bytes | Pending"]  # (seq, function_id, body) -> the reply frame


class RpcConnection(asyncio.Protocol):
    def __init__(self, dispatch: Dispatch, connections: set, on_open: Callable[[], None] = lambda: None):
        self.dispatch = dispatch
        self.connections = connections  # the gateway's open connections (it closes them on stop)
        self.on_open = on_open
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.pending: collections.deque = collections.deque()  # replies (bytes or Pending) in request order
        self.reading_paused = False   # we stopped reading (too much in flight or unsent)
        self.writing_paused = False   # the transport asked us to stop writing (its buffer is full)
        self.taking = False           # within _take_frames (a reply flushed there must not re-enter it)
        self.closed = asyncio.get_running_loop().create_future()  # set when the connection is lost

    # ---- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:  # uvloop's is no asyncio.Transport subclass
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.set_write_buffer_limits(high=MAX_UNSENT)
        self.connections.add(self)
        self.on_open()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._take_frames()

    def pause_writing(self) -> None:
        self.writing_paused = True
        self._pause_reading()

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        for reply in self.pending:
            if type(reply) is not bytes:
                reply.ready = None
        self.pending.clear()
        self.connections.discard(self)
        if not self.closed.done():
            self.closed.set_result(None)

    # ---- requests and replies -----------------------------------------------------------
    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _take_frames(self) -> None:
        """Dispatch every whole frame in the buffer (until reading is paused)."""
        buf, offset, header = self.buffer, 0, frames.REQ_HEADER
        self.taking = True
        try:
            while not self.reading_paused and len(buf) - offset >= header:
                seq, function_id, length, attach_length = frames.parse_request_header(buf, offset)
                end = offset + header + length + attach_length
                if len(buf) < end:
                    break
                body = bytes(buf[offset + header:offset + header + length])  # no Mooncake RPC sends an attachment
                offset = end
                self._request(seq, function_id, body)
        except frames.FrameError as exc:
            log.warning("closing an RPC connection: %s", exc)
            self.buffer.clear()
            self.close()
            return
        finally:
            self.taking = False
        if offset:
            del buf[:offset]

    def _request(self, seq: int, function_id: int, body: bytes) -> None:
        try:
            reply = self.dispatch(seq, function_id, body)
        except Exception:  # a defect of the gateway: answer it and keep the connection serving
            log.exception("request %d (function 0x%08x) failed", seq, function_id)
            reply = frames.error_frame(seq, frames.ERRC_RPC_THROW_EXCEPTION, "internal error")
        pending = self.pending
        if isinstance(reply, bytes):
            if not pending:
                self.transport.write(reply)  # type: ignore[union-attr]
                return
            pending.append(reply)
            self._flush()
        elif reply.frame is not None:  # answered already
            pending.append(reply.frame)
            self._flush()
        else:
            pending.append(reply)
            reply.ready = self._flush
            if len(pending) > MAX_IN_FLIGHT:
                self._pause_reading()

    def _flush(self) -> None:
        """Write the replies that are ready, in request order."""
        pending, transport = self.pending, self.transport
        if transport is None or transport.is_closing():
            return
        while pending and (type(pending[0]) is bytes or pending[0].frame is not None):
            reply = pending.popleft()
            transport.write(reply if type(reply) is bytes else reply.frame)
        if self.reading_paused and len(pending) <= MAX_IN_FLIGHT // 2:
            self._resume_reading()

    def _pause_reading(self) -> None:
        if not self.reading_paused and self.transport is not None:
            self.reading_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self.reading_paused and not self.writing_paused and len(self.pending) <= MAX_IN_FLIGHT // 2 \
                and self.transport is not None and not self.transport.is_closing():
            self.reading_paused = False
            self.transport.resume_reading()
            if not self.taking:
                self._take_frames()  # the frames that arrived before the pause
