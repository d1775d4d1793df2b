"""Clients for a store's URL (`client_from_url`): redis://, rediss://, unix://, memory://<name>
(an in-process fakeredis server) and redis+cluster:// (transport.cluster), with the default
timeouts."""
from __future__ import annotations

import math
import re
import threading
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..errors import ErrorCode, MasterError
from .cluster import cluster_from_url, is_cluster_url

CONNECT_TIMEOUT_S = 5.0  # default: seconds to open a connection
SOCKET_TIMEOUT_S = 10.0  # default: seconds to wait for a reply (a function call takes well under 1 ms)

_memory_servers: dict[str, Any] = {}
_memory_lock = threading.Lock()


def client_from_url(url: str, socket_timeout: float | None = SOCKET_TIMEOUT_S,
                    connect_timeout: float | None = CONNECT_TIMEOUT_S) -> redis.Redis:
    """A client for `url`; memory://<name> is an in-process fakeredis server, and
    redis+cluster://host:port[,host:port...] a Redis Cluster (transport.cluster). Timeouts are
    seconds (None: wait forever); redis-py never resends a command by itself, since a resent
    FCALL could run twice."""
    for value, what in ((socket_timeout, "socket_timeout"), (connect_timeout, "connect_timeout")):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not 0 < value < math.inf):
            raise MasterError(ErrorCode.INVALID_PARAMS, f"{what} must be a positive number of seconds or None")
    if not isinstance(url, str):
        raise MasterError(ErrorCode.INVALID_PARAMS, "url must be a str")
    if is_cluster_url(url):
        try:
            # a RedisCluster stands in for a Redis: the transport routes what differs (transport.cluster)
            return cluster_from_url(url, socket_timeout, connect_timeout)  # type: ignore[return-value]
        except ValueError as exc:
            raise MasterError(ErrorCode.INVALID_PARAMS, f"bad Redis URL: {exc}") from None
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise MasterError(ErrorCode.OUTCOME_UNKNOWN, f"no node of the cluster answered: {exc}") from None
    if url.startswith("memory://"):
        try:
            import fakeredis
        except ImportError:
            raise MasterError(ErrorCode.INVALID_PARAMS, "memory:// URLs need fakeredis: "
                              "pip install 'mooncake-redis[memory]'") from None
        name = url[len("memory://"):] or "default"
        with _memory_lock:
            server = _memory_servers.setdefault(name, fakeredis.FakeServer())
        return fakeredis.FakeRedis(server=server)
    try:
        client = redis.Redis.from_url(url, socket_timeout=socket_timeout, socket_connect_timeout=connect_timeout,
                                      retry=Retry(NoBackoff(), 0))
    except ValueError as exc:
        raise MasterError(ErrorCode.INVALID_PARAMS, f"bad Redis URL: {exc}") from None
    _check_connection_kwargs(client.connection_pool)
    return client


def check_url(url: str) -> None:
    """Raise MasterError INVALID_PARAMS for a URL that client_from_url would refuse, or whose
    first command would fail on its form (an unknown query parameter such as ?foo=1 reaches
    redis-py's connection as a keyword argument), without connecting. A redis+cluster:// or
    memory:// URL is checked when it is opened."""
    if not isinstance(url, str):
        raise MasterError(ErrorCode.INVALID_PARAMS, "url must be a str")
    if is_cluster_url(url) or url.startswith("memory://"):
        return
    try:
        pool = redis.ConnectionPool.from_url(url)
    except ValueError as exc:
        raise MasterError(ErrorCode.INVALID_PARAMS, f"bad Redis URL: {exc}") from None
    _check_connection_kwargs(pool)


def _check_connection_kwargs(pool: redis.ConnectionPool) -> None:
    """Build (not open) one connection of `pool`: redis-py passes a URL's query parameters to
    it unchecked, so a name it does not take fails only there."""
    try:
        pool.connection_class(**pool.connection_kwargs)
    except TypeError as exc:
        name = re.search(r"unexpected keyword argument '([^']*)'", str(exc))
        what = f"unknown query parameter {name.group(1)!r}" if name else str(exc)
        raise MasterError(ErrorCode.INVALID_PARAMS, f"bad Redis URL: {what}") from None
