"""The gateway process: Mooncake's coro_rpc protocol on one port, the transfer engine's HTTP
metadata on another, Prometheus metrics on a third, a heartbeat in the store.

Each connection reads frames in a loop; every request becomes a task on the thread pool (the
handler calls Master, then the reply is encoded there too) and its reply frame is written in
request order. The event loop only frames, decodes and writes: nothing in it blocks. A request
the gateway cannot serve gets an answer at once: an RPC the client release registers but this
gateway does not serve gets Mooncake's UNSUPPORTED error (or coro_rpc's function_not_registered
where the reply type is unknown), an undecodable one coro_rpc's invalid_rpc_arguments; a frame
with a wrong header or an oversized body closes the connection (the client reconnects)."""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from ..master import Master
from . import frames, schema
from .codec import CodecError, Err, decode, encode
from .handlers import Handlers, log
from .metadata import MetadataServer
from .store import GatewayStore

THREADS = 16                 # handlers in flight at once, all connections together
HEARTBEAT_S = 1.0            # how often a gateway renews its entry in the store
HEARTBEAT_TTL_MS = 5_000     # after which `status` no longer lists a silent gateway
LATENCY_BUCKETS = (50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 50e-3, 0.25, 1.0)


@dataclass
class Listeners:
    host: str = "127.0.0.1"
    rpc_port: int = 50051      # 0: no RPC listener (only the metadata server)
    metadata_port: int = 8080  # 0: no metadata server
    metrics_port: int = 0      # 0: no metrics endpoint


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.calls = Counter("mooncake_gateway_rpc_calls", "RPCs answered, by name", ["rpc"], registry=self.registry)
        self.errors = Counter("mooncake_gateway_rpc_errors", "RPCs answered with an error, by name and Mooncake code",
                              ["rpc", "code"], registry=self.registry)
        self.latency = Histogram("mooncake_gateway_rpc_seconds", "Time from a request's arrival to its reply",
                                 ["rpc"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.http = Counter("mooncake_gateway_http_requests", "Metadata server requests, by path and status",
                            ["path", "status"], registry=self.registry)
        self.connections = Counter("mooncake_gateway_rpc_connections", "RPC connections accepted",
                                   registry=self.registry)

    def answered(self, rpc: str, value: Any, started: float) -> None:
        self.calls.labels(rpc).inc()
        self.latency.labels(rpc).observe(time.perf_counter() - started)
        if isinstance(value, Err):
            self.errors.labels(rpc, str(value.code)).inc()
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, Err):
                    self.errors.labels(rpc, str(item.code)).inc()


class Gateway:
    def __init__(self, master: Master, listeners: Listeners, threads: int = THREADS, gateway_id: str | None = None):
        self.master = master
        self.listeners = listeners
        self.handlers = Handlers(master)
        self.store = GatewayStore(master)
        self.metrics = GatewayMetrics()
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="gateway")
        self.id = gateway_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._servers: list[asyncio.base_events.Server] = []
        self._tasks: list[asyncio.Task] = []
        self._stopped = asyncio.Event()
        self.rpc_address = ""
        self.metadata_url = ""

    # ---- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        host = self.listeners.host
        if self.listeners.rpc_port:
            rpc = await asyncio.start_server(self._serve_rpc, host, self.listeners.rpc_port)
            self._servers.append(rpc)
            self.rpc_address = f"{host}:{rpc.sockets[0].getsockname()[1]}"
        if self.listeners.metadata_port:
            metadata = MetadataServer(self.store, self.run, lambda path, status: self.metrics.http.labels(
                path, str(status)).inc())
            http = await asyncio.start_server(metadata.serve, host, self.listeners.metadata_port)
            self._servers.append(http)
            self.metadata_url = f"http://{host}:{http.sockets[0].getsockname()[1]}/metadata"
        if self.listeners.metrics_port:
            from prometheus_client import start_http_server
            start_http_server(self.listeners.metrics_port, host, registry=self.metrics.registry)
        await self.run(self._heartbeat)
        self._tasks.append(asyncio.get_running_loop().create_task(self._heartbeats()))

    def banner(self) -> str:
        return f"mooncake gateway: rpc {self.rpc_address or 'off'}, metadata {self.metadata_url or 'off'}"

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
        for task in self._tasks:
            task.cancel()
        for server in self._servers:
            await server.wait_closed()
        try:
            await self.run(self.store.heartbeat, self.id, self.rpc_address or "off", self.metadata_url, 0)
        except Exception as exc:  # leaving is a courtesy: the entry expires by itself
            log.warning("gateway %s could not leave the store's list: %s", self.id, exc)
        self.pool.shutdown(wait=True)
        self._stopped.set()

    async def run(self, fn: Any, *args: Any) -> Any:
        """Run a blocking call (Master, the store) on the thread pool."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def _heartbeat(self) -> None:
        self.store.heartbeat(self.id, self.rpc_address or "off", self.metadata_url, HEARTBEAT_TTL_MS)

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            try:
                await self.run(self._heartbeat)
            except Exception as exc:  # Redis away: requests fail on their own; keep trying
                log.warning("gateway heartbeat failed: %s", exc)

    # ---- coro_rpc ------------------------------------------------------------------------
    async def _serve_rpc(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.metrics.connections.inc()
        replies: asyncio.Queue = asyncio.Queue()
        sender = asyncio.get_running_loop().create_task(self._send_replies(replies, writer))
        try:
            while True:
                head = await reader.readexactly(frames.REQ_HEADER)
                seq, function_id, length, attach_length = frames.parse_request_header(head)
                if length + attach_length > frames.MAX_BODY:
                    raise frames.FrameError(f"a frame of {length + attach_length} bytes (at most {frames.MAX_BODY})")
                body = await reader.readexactly(length) if length else b""
                if attach_length:
                    await reader.readexactly(attach_length)  # no Mooncake RPC sends an attachment
                replies.put_nowait(self._dispatch(seq, function_id, body))
        except frames.FrameError as exc:
            log.warning("closing an RPC connection: %s", exc)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            replies.put_nowait(None)
            await sender
            writer.close()

    async def _send_replies(self, replies: asyncio.Queue, writer: asyncio.StreamWriter) -> None:
        while True:
            reply = await replies.get()
            if reply is None:
                return
            try:
                frame = await reply if not isinstance(reply, bytes) else reply
                writer.write(frame)
                if replies.empty():
                    await writer.drain()
            except (ConnectionError, asyncio.CancelledError):
                return

    def _dispatch(self, seq: int, function_id: int, body: bytes) -> Any:
        """The reply frame (bytes), or a future of it."""
        rpc = schema.BY_ID.get(function_id)
        name = rpc.name if rpc else schema.NAMES_BY_ID.get(function_id)
        if rpc is None or not self.handlers.serves(rpc.name):
            log.info("RPC %s (0x%08x) is not served", name or "unknown", function_id)
            self.metrics.calls.labels(name or "unknown").inc()
            if rpc is not None and self._is_expected(rpc.response):
                self.metrics.errors.labels(rpc.name, str(schema.ErrorCode.UNSUPPORTED)).inc()
                return frames.response_frame(seq, encode(rpc.response, Err(schema.ErrorCode.UNSUPPORTED)))
            return frames.error_frame(seq, frames.ERRC_FUNCTION_NOT_REGISTERED,
                                      f"function not registered: {name or hex(function_id)}")
        started = time.perf_counter()
        try:
            args, literal = decode(rpc.request, body) if rpc.request is not None else ((), False)
        except CodecError as exc:
            log.warning("RPC %s: undecodable request: %s", rpc.name, exc)
            self.metrics.errors.labels(rpc.name, "invalid_rpc_arguments").inc()
            return frames.error_frame(seq, frames.ERRC_INVALID_RPC_ARGUMENTS, f"invalid rpc arguments: {exc}")
        return asyncio.get_running_loop().run_in_executor(self.pool, self._answer, rpc, seq, args, literal, started)

    @staticmethod
    def _is_expected(t: Any) -> bool:
        return t.kind == "expected"

    @staticmethod
    def _per_key(t: Any, args: tuple) -> int | None:
        """For a reply that is a vector of expecteds (a batch): the number of keys, else None."""
        if t.kind != "vector" or t.parts[0].kind != "expected":
            return None
        return next((len(a) for a in args if isinstance(a, list)), 0)

    def _answer(self, rpc: schema.Rpc, seq: int, args: tuple, literal: bool, started: float) -> bytes:
        """On the thread pool: the handler, then its reply frame."""
        try:
            value = self.handlers.call(rpc.name, args)
        except Exception:  # a defect: answer, log, keep serving
            log.exception("RPC %s failed", rpc.name)
            value = Err(schema.ErrorCode.INTERNAL_ERROR)
        if isinstance(value, Err) and self._per_key(rpc.response, args) is not None:
            value = [value] * self._per_key(rpc.response, args)  # a whole batch refused: each key's answer
        if isinstance(value, Err) and not self._is_expected(rpc.response):
            self.metrics.errors.labels(rpc.name, str(value.code)).inc()
            return frames.error_frame(seq, frames.ERRC_INVALID_RPC_ARGUMENTS, f"{rpc.name} failed: {value.code}")
        self.metrics.answered(rpc.name, value, started)
        return frames.response_frame(seq, encode(rpc.response, value, literal=literal))


def event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop's where it is installed, else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class GatewayThread:
    """A gateway on its own event loop in a background thread (for `serve`, and for tests):
    start() returns once it listens (or raises OSError for a port that is taken), stop() ends
    it and waits."""

    def __init__(self, master: Master, listeners: Listeners, threads: int = THREADS):
        self.gateway = Gateway(master, listeners, threads)
        self._loop = event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="gateway-loop", daemon=True)

    def start(self) -> Gateway:
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.gateway.start(), self._loop).result()
        except BaseException:
            self._shutdown()
            raise
        return self.gateway

    def stop(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self.gateway.stop(), self._loop).result()
        self._shutdown()

    def _shutdown(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop.close()
