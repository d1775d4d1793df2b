"""The gateway process: Mooncake's coro_rpc protocol on one port, the transfer engine's HTTP
metadata on another, Prometheus metrics on a third, a heartbeat in the store.

Each connection (gateway/connection.py) cuts frames from the bytes as they arrive and writes
the replies in request order. The event loop frames, decodes, runs the hot path's steps (their
Redis calls on one pipelined connection, mooncake_redis.transport.resp_async) and writes; the
other handlers run on the thread pool, so nothing in the loop blocks. A request the gateway
cannot serve gets an answer at once: an RPC the client release registers but this gateway does
not serve gets Mooncake's UNSUPPORTED error (or coro_rpc's function_not_registered
where the reply type is unknown), an undecodable one coro_rpc's invalid_rpc_arguments; a frame
with a wrong header or an oversized body closes the connection (the client reconnects)."""
from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..errors import ErrorCode, MasterError
from ..master import Master
from ..steps import Blocking
from ..transport.resp_async import for_shards
from . import frames, schema
from .codec import CodecError, Err, decode, encode
from .connection import Pending, RpcConnection
from .handlers import Handlers, log, mooncake_code
from .metadata import MetadataServer
from .metrics import GatewayMetrics
from .store import GatewayStore

THREADS = 16                 # blocking handlers in flight at once, all connections together
HEARTBEAT_S = 5.0            # how often a gateway renews its entry in the store (each one a write)
HEARTBEAT_TTL_MS = 15_000    # after which `status` no longer lists a silent gateway (3 missed heartbeats)


@dataclass
class Listeners:
    host: str = "127.0.0.1"
    rpc_port: int = 50051      # 0: no RPC listener (only the metadata server)
    metadata_port: int = 8080  # 0: no metadata server
    metrics_port: int = 0      # 0: no metrics endpoint


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
        self._connections: set[RpcConnection] = set()
        self._metrics_http: Any = None
        self._stopped = asyncio.Event()
        self.rpc_address = ""
        self.metadata_url = ""

    # ---- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        host = self.listeners.host
        if self.listeners.rpc_port:
            rpc = await asyncio.get_running_loop().create_server(self._connection, host, self.listeners.rpc_port)
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
        for connection in clients:  # the clients reconnect to another gateway
            connection.close()
        if clients:
            await asyncio.wait([c.closed for c in clients], timeout=10)
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
    def _connection(self) -> RpcConnection:
        return RpcConnection(self._dispatch, self._connections, self.metrics.connections.inc)

    def _dispatch(self, seq: int, function_id: int, body: bytes) -> bytes | Pending:
        """The reply frame (bytes), or the Pending that will hold it."""
        rpc = schema.BY_ID.get(function_id)
        name = rpc.name if rpc else schema.NAMES_BY_ID.get(function_id)
        kind = self.handlers.kind(rpc.name) if rpc else None
        if rpc is None or kind is None:
            log.info("RPC %s (0x%08x) is not served", name or "unknown", function_id)
            self.metrics.called(name or "unknown")
            if rpc is not None and rpc.response.kind == "expected":
                self.metrics.error(rpc.name, schema.ErrorCode.UNSUPPORTED)
                return frames.response_frame(seq, encode(rpc.response, Err(schema.ErrorCode.UNSUPPORTED)))
            return frames.error_frame(seq, frames.ERRC_FUNCTION_NOT_REGISTERED,
                                      f"function not registered: {name or hex(function_id)}")
        started = time.perf_counter()
        try:
            args, literal = decode(rpc.request, body) if rpc.request is not None else ((), False)
        except CodecError as exc:
            log.warning("RPC %s: undecodable request: %s", rpc.name, exc)
            self.metrics.error(rpc.name, "invalid_rpc_arguments")
            return frames.error_frame(seq, frames.ERRC_INVALID_RPC_ARGUMENTS, f"invalid rpc arguments: {exc}")
        if kind == "inline":
            return self._frame(rpc, seq, args, literal, self.handlers.call(rpc.name, args), started)
        pending = Pending()
        if kind == "steps" and self.pipelined is not None:
            self._step(getattr(self.handlers, rpc.name)(*args), None, None, (rpc, seq, args, literal, started), pending)
        else:
            asyncio.get_running_loop().run_in_executor(
                self.pool, self._answer, rpc, seq, args, literal, started).add_done_callback(
                lambda answered: pending.set(answered.result()) if not answered.cancelled() else None)
        return pending

    def _step(self, steps: Any, result: Any, error: MasterError | None, request: tuple, pending: Pending) -> None:
        """On the event loop: the handler's steps, one round trip at a time on the pipelined
        connection (a Blocking step on the thread pool), each step resumed from its replies'
        callback (no task per request); the reply frame into `pending` when the steps return."""
        rpc, seq, args, literal, started = request
        try:
            step = steps.send(result) if error is None else steps.throw(error)
            if isinstance(step, Blocking):
                asyncio.get_running_loop().run_in_executor(self.pool, step.fn).add_done_callback(
                    lambda ran: self._step(steps, *_outcome(ran), request, pending))
            else:
                self.pipelined.submit(step, lambda replies, failed: self._step(  # type: ignore[union-attr]
                    steps, replies, failed, request, pending))
            return
        except StopIteration as done:
            value = done.value
        except MasterError as exc:
            value = Err(mooncake_code(exc))
        except Exception:  # a defect: answer, log, keep serving
            log.exception("RPC %s failed", rpc.name)
            value = Err(schema.ErrorCode.INTERNAL_ERROR)
        pending.set(self._frame(rpc, seq, args, literal, value, started))

    def _answer(self, rpc: schema.Rpc, seq: int, args: tuple, literal: bool, started: float) -> bytes:
        """On the thread pool: the handler, blocking, then its reply frame."""
        try:
            value = self.handlers.call(rpc.name, args)
        except Exception:  # a defect: answer, log, keep serving
            log.exception("RPC %s failed", rpc.name)
            value = Err(schema.ErrorCode.INTERNAL_ERROR)
        return self._frame(rpc, seq, args, literal, value, started)

    def _frame(self, rpc: schema.Rpc, seq: int, args: tuple, literal: bool, value: Any, started: float) -> bytes:
        """The reply frame; a value that cannot be encoded (a defect) answers coro_rpc's
        rpc_throw_exception instead, so the replies after it on the connection are not held up."""
        try:
            return self._encode_reply(rpc, seq, args, literal, value, started)
        except Exception:
            log.exception("RPC %s: the reply could not be encoded", rpc.name)
            self.metrics.error(rpc.name, "unencodable_reply")
            return frames.error_frame(seq, frames.ERRC_RPC_THROW_EXCEPTION, f"{rpc.name}: internal error")

    def _encode_reply(self, rpc: schema.Rpc, seq: int, args: tuple, literal: bool, value: Any,
                      started: float) -> bytes:
        t = rpc.response
        if isinstance(value, Err) and t.kind == "vector" and t.parts[0].kind == "expected":
            # a batch refused as a whole: each key gets the error
            value = [value] * next((len(a) for a in args if isinstance(a, list)), 0)
        if isinstance(value, Err) and t.kind != "expected":
            self.metrics.error(rpc.name, value.code)
            return frames.error_frame(seq, frames.ERRC_INVALID_RPC_ARGUMENTS, f"{rpc.name} failed: {value.code}")
        self.metrics.answered(rpc.name, value, started)
        return frames.response_frame(seq, encode(t, value, literal=literal))


def _outcome(ran: asyncio.Future) -> tuple[Any, MasterError | None]:
    """(result, None) or (None, the MasterError) of a Blocking step run on the pool."""
    exc = ran.exception()
    if exc is None:
        return ran.result(), None
    if isinstance(exc, MasterError):
        return None, exc
    log.error("a blocking step failed", exc_info=exc)
    return None, MasterError(ErrorCode.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")


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
