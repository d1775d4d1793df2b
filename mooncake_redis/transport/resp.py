"""The lean RESP path: function calls (FCALL, FCALL_RO) to a plain Redis server written as
pre-encoded RESP on a socket of our own, one connection per thread, replies parsed by hiredis.
redis-py's command path (pool, packing, per-command hooks) costs tens of microseconds per call
on loopback; this one a few.

What stays redis-py's, so that both paths behave alike: opening a connection (its Connection
class with the client's own connection kwargs: address, AUTH, SELECT, the protocol handshake,
timeouts, keepalive) and closing it; the exception class of an error reply (its parse_error,
the one its own hiredis parser uses); the encoding of arguments (hiredis.pack_command, as its
HiredisRespSerializer). The replies come in the protocol redis-py negotiated and hiredis parses
them as redis-py's parser does: a function call's reply is bytes, int, None or nested lists,
error replies are exceptions in their place, and a lost reply raises redis.ConnectionError or
redis.TimeoutError after dropping the connection. send.run turns all of it into
MasterError as it does for redis-py's path.

Only plain clients take this path (`lean_for`): memory:// (fakeredis), rediss:// (TLS), cluster
clients, clients that decode replies, and commands other than function calls (redis-py
reshapes some replies: HGETALL into a dict, SCAN into a tuple) keep redis-py.
"""
from __future__ import annotations

import os
import select
import socket
import threading
import weakref
from typing import Any, Sequence

import hiredis
import redis
from redis._parsers import BaseParser

# The commands this transport sends: redis-py hands their replies back untouched.
LEAN_COMMANDS = frozenset({"FCALL", "FCALL_RO"})
READ_SIZE = 65536  # bytes per recv

_NOT_ENOUGH = object()  # hiredis: no complete reply buffered yet
_PUSH = getattr(hiredis, "PushNotification", ())  # RESP3 out-of-band messages: not replies

# Bumped in a forked child: a connection opened before the fork is the parent's.
_generation = 0


def _forked() -> None:
    global _generation
    _generation += 1


if hasattr(os, "register_at_fork"):  # no fork, no inherited connections (Windows)
    os.register_at_fork(after_in_child=_forked)


def pack(commands: Sequence[Sequence[Any]]) -> bytes:
    """Commands as one RESP request, encoded as redis-py encodes them with hiredis installed
    (its HiredisRespSerializer): str as UTF-8, int and float in decimal, bytes-like objects as
    they are; any other type (bool, None, ...) raises redis.DataError, redis-py's own (its
    wording changes between releases)."""
    try:
        return b"".join([hiredis.pack_command(tuple(command)) for command in commands])
    except TypeError:
        pass
    try:  # bytearray and memoryview: redis-py sends them as bytes
        # hiredis' stub types the command as a 1-tuple; it takes any length
        return b"".join([hiredis.pack_command(tuple(bytes(a) if isinstance(a, (bytearray, memoryview)) else a  # type: ignore[arg-type]
                                                    for a in command)) for command in commands])
    except TypeError as exc:
        raise _refusal_of(commands, exc) from None


def _refusal_of(commands: Sequence[Sequence[Any]], exc: TypeError) -> redis.DataError:
    """redis-py's refusal of arguments it cannot send: its own packer's DataError (a Connection
    is built, never connected), else one with hiredis' words."""
    try:
        redis.connection.Connection().pack_commands([tuple(command) for command in commands])
    except redis.DataError as refused:
        return refused
    except TypeError:
        pass
    return redis.DataError(str(exc))


def _refusal(replies: list[Any]) -> redis.ConnectionError | None:
    """As redis-py reads replies: a connection-class error reply (NOAUTH, "max number of clients
    reached"), alone or first in an array, stands for the whole reply, and is raised, except
    LOADING, which send.run takes as a reply (the call did not run: UNAVAILABLE)."""
    for i, reply in enumerate(replies):
        if isinstance(reply, list) and reply and isinstance(reply[0], redis.ConnectionError):
            reply = replies[i] = reply[0]
        if isinstance(reply, redis.ConnectionError) and not isinstance(reply, redis.BusyLoadingError):
            return reply
    return None


class _Connection:
    """One thread's connection: redis-py's Connection opened it (handshake included); its socket
    is read and written here."""

    __slots__ = ("redis_conn", "sock", "reader", "buf", "poll", "generation", "epoch", "__weakref__")

    def __init__(self, redis_conn: redis.Connection, epoch: int):
        self.redis_conn = redis_conn
        self.sock: socket.socket = redis_conn._sock  # type: ignore[assignment]  # redis-py: None until connected
        self.reader = hiredis.Reader(protocolError=redis.InvalidResponse, replyError=BaseParser.parse_error,
                                     notEnoughData=_NOT_ENOUGH)
        self.buf = bytearray(READ_SIZE)
        self.poll = select.poll()
        self.poll.register(self.sock, select.POLLIN)
        self.generation = _generation
        self.epoch = epoch

    def usable(self, epoch: int) -> bool:
        """Opened in this process, not closed since, and idle: a socket that reads as ready
        before a request holds an EOF (the server closed it) or stray bytes."""
        return self.generation == _generation and self.epoch == epoch and not self.poll.poll(0)

    def read(self) -> Any:
        reader, sock, buf = self.reader, self.sock, self.buf
        reply = reader.gets()
        while reply is _NOT_ENOUGH or isinstance(reply, _PUSH):
            if reply is _NOT_ENOUGH:
                n = sock.recv_into(buf)
                if not n:
                    raise redis.ConnectionError("Connection closed by server.")
                reader.feed(buf, 0, n)  # type: ignore[arg-type]  # hiredis' stub omits bytearray, which it takes
            reply = reader.gets()
        return reply

    def close(self) -> None:
        self.redis_conn.disconnect()  # no shutdown in a forked child: the parent's socket stays up

    def __del__(self) -> None:
        # A thread that ends drops its connection; redis-py's Connection sits in a reference
        # cycle and would keep the socket open until the cyclic GC, so the server would close
        # it first (leaving its port in TIME_WAIT) if it stopped before that.
        self.close()


class LeanClient:
    """The lean transport of one redis.Redis client: a connection per thread, opened on first use
    and again after a lost one, a fork, or close()."""

    def __init__(self, client: redis.Redis):
        self.pool = client.connection_pool
        self.local = threading.local()
        # Every live thread's connection, for close(). Weak: a thread that ends takes its
        # connection with it (redis-py's Connection closes its socket when collected).
        self.open: "weakref.WeakSet[_Connection]" = weakref.WeakSet()
        self.epoch = 0  # bumped by close(): other threads' connections are then dropped on use

    def send(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """Write all commands at once, read their replies in order (error replies in place, as
        redis-py's exception classes). No reply: the connection is dropped and
        redis.ConnectionError / redis.TimeoutError raised. An argument that cannot be sent
        raises redis.DataError before anything is written."""
        request = pack(commands)
        conn = self._connection()
        try:
            conn.sock.sendall(request)
            replies = [conn.read() for _ in commands]
        except BaseException as exc:  # the stream is out of step: never reuse it
            self._drop(conn)
            if isinstance(exc, socket.timeout):
                raise redis.TimeoutError(f"Timeout waiting for the server: {exc}") from exc
            if isinstance(exc, (OSError, redis.InvalidResponse)):
                raise redis.ConnectionError(f"Error while talking to the server: {exc}") from exc
            raise
        refused = _refusal(replies)
        if refused is not None:
            self._drop(conn)
            raise refused
        return replies

    def _connection(self) -> _Connection:
        conn = getattr(self.local, "conn", None)
        if conn is not None:
            if conn.usable(self.epoch):
                return conn
            self._drop(conn)
        pool = self.pool
        redis_conn = pool.connection_class(**pool.connection_kwargs)
        redis_conn.connect()  # raises redis errors (ConnectionError, TimeoutError, AuthenticationError)
        conn = _Connection(redis_conn, self.epoch)
        self.local.conn = conn
        self.open.add(conn)
        return conn

    def _drop(self, conn: _Connection) -> None:
        if getattr(self.local, "conn", None) is conn:
            self.local.conn = None
        self.open.discard(conn)
        conn.close()

    def close(self) -> None:
        """Close every thread's connection; each thread opens a new one on its next call."""
        self.epoch += 1
        for conn in list(self.open):
            self.open.discard(conn)
            conn.close()


_clients: "weakref.WeakKeyDictionary[redis.Redis, LeanClient | None]" = weakref.WeakKeyDictionary()


def _eligible(client: Any) -> bool:
    """A plain redis.Redis over TCP or a unix socket whose function-call replies redis-py leaves
    as they come (no decoding, no client-side cache, no callback for FCALL)."""
    if type(client) is not redis.Redis or getattr(client, "connection", None) is not None:
        return False  # fakeredis, a subclass, a single-connection client
    pool = client.connection_pool
    kw = pool.connection_kwargs
    return (pool.connection_class in (redis.Connection, redis.UnixDomainSocketConnection)
            and not kw.get("decode_responses") and kw.get("encoding", "utf-8") == "utf-8"
            and kw.get("encoding_errors", "strict") == "strict"
            and getattr(pool, "cache", None) is None and kw.get("cache") is None
            and not any(name in client.response_callbacks for name in LEAN_COMMANDS))


def lean_for(client: Any, commands: Sequence[Sequence[Any]]) -> LeanClient | None:
    """The lean transport for these commands on this client, or None (use redis-py)."""
    try:
        lean = _clients[client]
    except KeyError:
        lean = _clients.setdefault(client, LeanClient(client) if _eligible(client) else None)
    except TypeError:  # not weak-referenceable
        return None
    if lean is None:
        return None
    for command in commands:
        if command[0] not in LEAN_COMMANDS:
            return None
    return lean


def close(client: Any) -> None:
    """Close the lean connections of `client` (if any); redis-py's are the client's own."""
    try:
        lean = _clients.get(client)
    except TypeError:
        return
    if lean is not None:
        lean.close()
