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
from typing import Any, Sequence

import hiredis
import redis
from redis._parsers import BaseParser

from ..errors import ErrorCode, MasterError
from . import resp
from .replies import finish, missing_functions, no_reply, reload

READ_SIZE = 65536


class _Pipe:
    """One connection: a writer, a reader task, and the callers waiting for replies in order."""

    def __init__(self, redis_conn: redis.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.redis_conn = redis_conn  # keeps the socket it opened
        self.reader, self.writer = reader, writer
        self.parser = hiredis.Reader(protocolError=redis.InvalidResponse, replyError=BaseParser.parse_error,
                                     notEnoughData=resp._NOT_ENOUGH)
        self.waiting: collections.deque = collections.deque()  # [wanted, replies, future]
        self.broken: Exception | None = None
        self.task = asyncio.get_running_loop().create_task(self._read())

    def send(self, request: bytes, count: int) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self.waiting.append([count, [], future])
        self.writer.write(request)
        return future

    async def _read(self) -> None:
        parser, waiting = self.parser, self.waiting
        try:
            while True:
                data = await self.reader.read(READ_SIZE)
                if not data:
                    raise redis.ConnectionError("Connection closed by server.")
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

    def fail(self, exc: Exception) -> None:
        self.broken = exc
        while self.waiting:
            future = self.waiting.popleft()[2]
            if not future.done():
                future.set_exception(exc)
        self.writer.close()

    def close(self) -> None:
        self.task.cancel()
        self.fail(redis.ConnectionError("closed"))
        self.redis_conn.disconnect()


class AsyncLean:
    def __init__(self, client: redis.Redis):
        self.client = client
        self._pipe: _Pipe | None = None
        self._opening: asyncio.Lock | None = None

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
            reader, writer = await asyncio.open_connection(sock=sock, limit=READ_SIZE)
            self._pipe = _Pipe(redis_conn, reader, writer)
            return self._pipe

    async def send(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        request = resp.pack(commands)
        pipe = await self._connection()
        replies = await pipe.send(request, len(commands))
        refused = resp._refusal(replies)
        if refused is not None:
            pipe.fail(refused)
            raise refused
        return replies

    async def run(self, commands: Sequence[Sequence[Any]], raise_on_error: bool = True) -> list[Any]:
        """As send.run, awaited."""
        try:
            replies = await self.send(commands)
            missing = missing_functions(replies)
            if missing:
                await asyncio.to_thread(reload, self.client)
                for i, reply in zip(missing, await self.send([commands[i] for i in missing])):
                    replies[i] = reply
        except redis.AuthenticationError as exc:
            raise MasterError(ErrorCode.INTERNAL_ERROR, f"Redis refused the login: {exc}") from None
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            raise no_reply(exc) from exc
        except redis.DataError as exc:
            raise MasterError(ErrorCode.INVALID_PARAMS, str(exc)) from None
        return finish(replies, raise_on_error)

    async def close(self) -> None:
        """Close the connection and wait until it is closed (before Redis may stop: a client
        that closes first keeps the server's port free of TIME_WAIT)."""
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            pipe.close()
            with contextlib.suppress(Exception):
                await pipe.writer.wait_closed()


def for_shards(shards: Any) -> AsyncLean | None:
    """An AsyncLean for a Shards transport whose client the lean path serves (a plain server,
    no WAIT after writes), else None."""
    if shards.wait or resp.lean_for(shards.redis, [("FCALL",)]) is None:
        return None
    return AsyncLean(shards.redis)
