"""The gateway process: Mooncake's coro_rpc protocol on one port, the transfer engine's HTTP
metadata on another, Prometheus metrics on a third, a heartbeat in the store.

Each connection reads frames in a loop; every request becomes a task and its reply frame is
written in request order. The event loop frames, decodes, runs the hot path's steps (their Redis calls on one pipelined
connection, mooncake_redis.transport.resp_async) and writes; the other handlers run on the thread pool,
so nothing in the loop blocks. A request
the gateway cannot serve gets an answer at once: an RPC the client release registers but this
gateway does not serve gets Mooncake's UNSUPPORTED error (or coro_rpc's function_not_registered
where the reply type is unknown), an undecodable one coro_rpc's invalid_rpc_arguments; a frame
with a wrong header or an oversized body closes the connection (the client reconnects)."""
from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from ..errors import MasterError
from ..master import Master
from ..steps import Blocking
from ..transport.resp_async import for_shards
from . import frames, schema
from .codec import CodecError, Err, decode, encode
from .handlers import Handlers, log, mooncake_code
from .metadata import MetadataServer
from .store import GatewayStore

THREADS = 16                 # blocking handlers in flight at once, all connections together
MAX_IN_FLIGHT = 256          # requests of one connection not yet answered before it stops reading
MAX_UNSENT = 4 << 20         # reply bytes of one connection not yet sent before it stops reading
HEARTBEAT_S = 5.0            # how often a gateway renews its entry in the store (each one a write)
HEARTBEAT_TTL_MS = 15_000    # after which `status` no longer lists a silent gateway (3 missed heartbeats)
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
        self._per_rpc: dict[str, tuple[Any, Any]] = {}

    def answered(self, rpc: str, value: Any, started: float) -> None:
        calls, latency = self._per_rpc.get(rpc) or self._per_rpc.setdefault(
            rpc, (self.calls.labels(rpc), self.latency.labels(rpc)))  # labels() costs: once per RPC
        calls.inc()
        latency.observe(time.perf_counter() - started)
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
        self.pipelined = for_shards(master.transport)  # None: the hot path runs on the pool too
        self._servers: list[asyncio.base_events.Server] = []
        self._tasks: list[asyncio.Task] = []
        self._connections: set[asyncio.StreamWriter] = set()
        self._metrics_http: Any = None
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
            self._metrics_http, _ = start_http_server(self.listeners.metrics_port, host, registry=self.metrics.registry)
        await self.run(self._heartbeat)
        self._tasks.append(asyncio.get_running_loop().create_task(self._heartbeats()))

    def banner(self) -> str:
        return f"mooncake gateway: rpc {self.rpc_address or 'off'}, metadata {self.metadata_url or 'off'}"

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
        for task in self._tasks:
            task.cancel()
        clients = list(self._connections)
        for writer in clients:  # the clients reconnect to another gateway
            writer.close()
        for writer in clients:
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        for server in self._servers:
            await server.wait_closed()
        if self.pipelined is not None:
            await self.pipelined.close()
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
            self._metrics_http.server_close()
        try:
            await self.run(self._heartbeat, 0)
        except Exception as exc:  # leaving is a courtesy: the entry expires by itself
            log.warning("gateway %s could not leave the store's list: %s", self.id, exc)
        self.pool.shutdown(wait=True)
        self._stopped.set()

    async def run(self, fn: Any, *args: Any) -> Any:
        """Run a blocking call (Master, the store) on the thread pool."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def _heartbeat(self, ttl_ms: int = HEARTBEAT_TTL_MS) -> None:
        """Renew this gateway's entry (0: leave) and hand its read counts to the store; counts a
        failed call did not deliver are kept for the next one."""
        reads, hits = self.handlers.reads.take()
        try:
            self.store.heartbeat(self.id, self.rpc_address or "off", self.metadata_url, ttl_ms, reads, hits)
        except Exception:
            self.handlers.reads.add(reads, hits)
            raise

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
        self._connections.add(writer)
        pending: collections.deque = collections.deque()  # replies (bytes or futures) in request order

        def flush(_: Any = None) -> None:
            """Write the replies that are ready, in request order."""
            while pending and (type(pending[0]) is bytes or pending[0].done()):
                reply = pending.popleft()
                writer.write(reply if type(reply) is bytes else reply.result())

        try:
            while True:
                head = await reader.readexactly(frames.REQ_HEADER)
                seq, function_id, length, attach_length = frames.parse_request_header(head)
                body = await reader.readexactly(length) if length else b""
                if attach_length:
                    await reader.readexactly(attach_length)  # no Mooncake RPC sends an attachment
                reply = self._dispatch(seq, function_id, body)
                pending.append(reply)
                if type(reply) is bytes:
                    flush()
                else:
                    reply.add_done_callback(flush)
                if len(pending) > MAX_IN_FLIGHT or writer.transport.get_write_buffer_size() > MAX_UNSENT:
                    waiting = [r for r in pending if type(r) is not bytes][:1]
                    if waiting:  # many requests in flight: let the oldest finish
                        await asyncio.wait(waiting)
                    await writer.drain()  # a client that does not read its replies
        except frames.FrameError as exc:
            log.warning("closing an RPC connection: %s", exc)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            for reply in pending:
                if type(reply) is not bytes:
                    reply.remove_done_callback(flush)
            writer.close()
            self._connections.discard(writer)

    def _dispatch(self, seq: int, function_id: int, body: bytes) -> Any:
        """The reply frame (bytes), or an awaitable of it."""
        rpc = schema.BY_ID.get(function_id)
        name = rpc.name if rpc else schema.NAMES_BY_ID.get(function_id)
        kind = self.handlers.kind(rpc.name) if rpc else None
        if rpc is None or kind is None:
            log.info("RPC %s (0x%08x) is not served", name or "unknown", function_id)
            self.metrics.calls.labels(name or "unknown").inc()
            if rpc is not None and rpc.response.kind == "expected":
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
        if kind == "inline":
            return self._frame(rpc, seq, args, literal, self.handlers.call(rpc.name, args), started)
        if kind == "steps" and self.pipelined is not None:
            return asyncio.get_running_loop().create_task(self._answer_steps(rpc, seq, args, literal, started))
        return asyncio.get_running_loop().run_in_executor(self.pool, self._answer, rpc, seq, args, literal, started)

    async def _answer_steps(self, rpc: schema.Rpc, seq: int, args: tuple, literal: bool, started: float) -> bytes:
        """On the event loop: the handler's steps, every round trip on the pipelined connection."""
        pipelined = self.pipelined
        assert pipelined is not None  # only then are the steps answered here
        try:
            steps = getattr(self.handlers, rpc.name)(*args)
            step = next(steps)
            while True:
                result = await (self.run(step.fn) if isinstance(step, Blocking) else pipelined.run(step))
                step = steps.send(result)
        except StopIteration as done:
            value = done.value
        except MasterError as exc:
            value = Err(mooncake_code(exc))
        except Exception:  # a defect: answer, log, keep serving
            log.exception("RPC %s failed", rpc.name)
            value = Err(schema.ErrorCode.INTERNAL_ERROR)
        return self._frame(rpc, seq, args, literal, value, started)

    def _answer(self, rpc: schema.Rpc, seq: int, args: tuple, literal: bool, started: float) -> bytes:
        """On the thread pool: the handler, blocking, then its reply frame."""
        try:
            value = self.handlers.call(rpc.name, args)
        except Exception:  # a defect: answer, log, keep serving
            log.exception("RPC %s failed", rpc.name)
            value = Err(schema.ErrorCode.INTERNAL_ERROR)
        return self._frame(rpc, seq, args, literal, value, started)

    def _frame(self, rpc: schema.Rpc, seq: int, args: tuple, literal: bool, value: Any, started: float) -> bytes:
        t = rpc.response
        if isinstance(value, Err) and t.kind == "vector" and t.parts[0].kind == "expected":
            # a batch refused as a whole: each key gets the error
            value = [value] * next((len(a) for a in args if isinstance(a, list)), 0)
        if isinstance(value, Err) and t.kind != "expected":
            self.metrics.errors.labels(rpc.name, str(value.code)).inc()
            return frames.error_frame(seq, frames.ERRC_INVALID_RPC_ARGUMENTS, f"{rpc.name} failed: {value.code}")
        self.metrics.answered(rpc.name, value, started)
        return frames.response_frame(seq, encode(t, value, literal=literal))


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
