"""The asyncio pipelined path, the lean transport for an event loop (the Mooncake gateway's):
the commands of every caller on one connection, written as they come and answered in order, so
that the calls of all of a gateway's requests are pipelined into Redis with no thread in between.

What it shares with the blocking transport (transport.resp, send.run): the opening of
a connection (redis-py's Connection with the client's own kwargs, in a thread), the encoding
(resp.pack), the reply parser (hiredis, redis-py's error classes), and the meaning of every
reply: error replies become MasterError as replies.finish makes them, a lost reply is
OUTCOME_UNKNOWN, "Function not found" loads the library (on a thread) and sends again.
Only plain clients (resp.lean_for) without min_replicas_ack take this path (`for_shards`)."""
from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import Any, Callable, Sequence

import hiredis
import redis
from redis._parsers import BaseParser

from ..errors import ErrorCode, MasterError
from . import resp
from .replies import finish, missing_functions, no_reply, reload

Done = Callable[[Any, Any], None]  # done(replies, None) or done(None, MasterError)


class _Pipe(asyncio.Protocol):
    """One connection: replies parsed as their bytes arrive (a Protocol: no reader task), each
    handed to the callers waiting in order."""

    def __init__(self, redis_conn: redis.Connection):
        self.redis_conn = redis_conn  # keeps the socket it opened
        self.transport: asyncio.Transport | None = None
        self.parser = hiredis.Reader(protocolError=redis.InvalidResponse, replyError=BaseParser.parse_error,
                                     notEnoughData=resp._NOT_ENOUGH)
        self.waiting: collections.deque = collections.deque()  # [wanted, replies, future]
        self.broken: Exception | None = None
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: Any) -> None:  # uvloop's is no asyncio.Transport subclass
        self.transport = transport

    def send(self, request: bytes, count: int) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self.waiting.append([count, [], future])
        self.transport.write(request)  # type: ignore[union-attr]
        return future

    def data_received(self, data: bytes) -> None:
        parser, waiting = self.parser, self.waiting
        try:
            parser.feed(data)
            reply = parser.gets()
            while reply is not resp._NOT_ENOUGH:
                if not isinstance(reply, resp._PUSH):
                    if not waiting:
                        raise redis.InvalidResponse("a reply nobody asked for")
                    entry = waiting[0]
                    entry[1].append(reply)
                    if len(entry[1]) == entry[0]:
                        waiting.popleft()
                        if not entry[2].done():
                            entry[2].set_result(entry[1])
                reply = parser.gets()
        except Exception as exc:  # the stream is out of step: fail everyone waiting, never reuse it
            self.fail(exc if isinstance(exc, redis.RedisError) else redis.ConnectionError(str(exc)))

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(redis.ConnectionError("Connection closed by server."))
        if not self.closed.done():
            self.closed.set_result(None)

    def fail(self, exc: Exception) -> None:
        if self.broken is None:
            self.broken = exc
        while self.waiting:
            future = self.waiting.popleft()[2]
            if not future.done():
                future.set_exception(exc)
        if self.transport is not None:
            self.transport.close()

    def close(self) -> None:
        self.fail(redis.ConnectionError("closed"))
        self.redis_conn.disconnect()


class AsyncLean:
    def __init__(self, client: redis.Redis):
        self.client = client
        self._pipe: _Pipe | None = None
        self._opening: asyncio.Lock | None = None
        self._tasks: set[asyncio.Task] = set()  # the rare paths' tasks, kept until they end

    def _background(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connection(self) -> _Pipe:
        pipe = self._pipe
        if pipe is not None and pipe.broken is None:
            return pipe
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._pipe is not None and self._pipe.broken is None:
                return self._pipe
            pool = self.client.connection_pool
            redis_conn = pool.connection_class(**pool.connection_kwargs)
            await asyncio.to_thread(redis_conn.connect)  # the handshake: AUTH, SELECT, HELLO
            sock = redis_conn._sock
            sock.settimeout(None)
            pipe = _Pipe(redis_conn)
            await asyncio.get_running_loop().create_connection(lambda: pipe, sock=sock)
            self._pipe = pipe
            return pipe

    def submit(self, commands: Sequence[Sequence[Any]], done: Done, raise_on_error: bool = True) -> None:
        """Send commands; done(replies, None) or done(None, MasterError) once they are answered,
        with the meaning send.run gives them. The common case costs one future and no task: a
        connection to open or a library to load (rare) takes a task of its own."""
        pipe = self._pipe
        if pipe is None or pipe.broken is not None:
            self._background(self._open_then_submit(commands, done, raise_on_error))
            return
        try:
            request = resp.pack(commands)
        except redis.DataError as exc:
            done(None, MasterError(ErrorCode.INVALID_PARAMS, str(exc)))
            return
        pipe.send(request, len(commands)).add_done_callback(
            lambda sent: self._answered(pipe, commands, sent, done, raise_on_error))

    def _answered(self, pipe: _Pipe, commands: Sequence[Sequence[Any]], sent: asyncio.Future, done: Done,
                  raise_on_error: bool) -> None:
        exc = sent.exception()
        if exc is not None:
            done(None, _error(exc))
        else:
            self._settle(pipe, commands, sent.result(), done, raise_on_error)

    def _settle(self, pipe: _Pipe, commands: Sequence[Sequence[Any]], replies: list[Any], done: Done,
                raise_on_error: bool, reloaded: bool = False) -> None:
        refused = resp._refusal(replies)
        if refused is not None:
            pipe.fail(refused)
            done(None, _error(refused))
            return
        missing = [] if reloaded else missing_functions(replies)
        if missing:
            self._background(self._reload_then_resend(commands, replies, missing, done, raise_on_error))
            return
        try:
            result = finish(replies, raise_on_error)
        except MasterError as error:
            done(None, error)
            return
        done(result, None)

    async def _open_then_submit(self, commands: Sequence[Sequence[Any]], done: Done, raise_on_error: bool) -> None:
        try:
            await self._connection()
        except Exception as exc:
            done(None, _error(exc))
            return
        self.submit(commands, done, raise_on_error)

    async def _reload_then_resend(self, commands: Sequence[Sequence[Any]], replies: list[Any], missing: list[int],
                                  done: Done, raise_on_error: bool) -> None:
        """"Function not found": load the library (on a thread), send the calls that missed it
        again, and finish with all the replies."""
        try:
            await asyncio.to_thread(reload, self.client)
            pipe = await self._connection()
            again = [commands[i] for i in missing]
            for i, reply in zip(missing, await pipe.send(resp.pack(again), len(again))):
                replies[i] = reply
        except Exception as exc:
            done(None, _error(exc))
            return
        self._settle(pipe, commands, replies, done, raise_on_error, reloaded=True)

    async def run(self, commands: Sequence[Sequence[Any]], raise_on_error: bool = True) -> list[Any]:
        """As send.run, awaited."""
        future: asyncio.Future = asyncio.get_running_loop().create_future()

        def done(replies: list[Any] | None, error: MasterError | None) -> None:
            if not future.done():
                future.set_exception(error) if error is not None else future.set_result(replies)
        self.submit(commands, done, raise_on_error)
        return await future

    async def close(self) -> None:
        """Close the connection and wait until it is closed (before Redis may stop: a client
        that closes first keeps the server's port free of TIME_WAIT)."""
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            pipe.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(pipe.closed, 10)


def _error(exc: BaseException) -> MasterError:
    """What a failed send means to the caller (as send.run maps it)."""
    if isinstance(exc, MasterError):
        return exc
    if isinstance(exc, redis.AuthenticationError):
        return MasterError(ErrorCode.INTERNAL_ERROR, f"Redis refused the login: {exc}")
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError, OSError)):
        return no_reply(exc)
    if isinstance(exc, redis.DataError):
        return MasterError(ErrorCode.INVALID_PARAMS, str(exc))
    return MasterError(ErrorCode.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")


def for_shards(shards: Any) -> AsyncLean | None:
    """An AsyncLean for a Shards transport whose client the lean path serves (a plain server,
    no WAIT after writes), else None."""
    if shards.wait or resp.lean_for(shards.redis, [("FCALL",)]) is None:
        return None
    return AsyncLean(shards.redis)
