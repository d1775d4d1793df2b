"""The cluster path: `redis+cluster://` URLs, and the routing of commands to the node that serves
their key's slot.

A store's shard lives in one slot (every key of shard i carries the hash tag `{<ns>:<i>}`), so
every command reaches exactly one node. redis-py's RedisCluster keeps the slot map; the sending
is ours: commands are grouped by node and pipelined per node (one round trip per node), and a
command is sent again only when its node said it did not run it (MOVED, ASK, TRYAGAIN,
READONLY after a failover). A lost reply is never resent (RedisCluster's own pipeline would
resend it, and a resent FCALL could run twice); the slot map is refreshed so the next call
reaches the new primary.
"""
from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, Sequence, TypeGuard
from urllib.parse import unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot
from redis.exceptions import AskError, MovedError, ReadOnlyError, RedisClusterException, TryAgainError
from redis.retry import Retry

from ..errors import ErrorCode, MasterError
from .replies import FUNCTION_MISSING, reload

CLUSTER_SCHEME = "redis+cluster"
MAX_REDIRECTS = 5  # rounds of MOVED/ASK/TRYAGAIN for one batch (a slot moves once per round at most)
# Commands that carry no key: in a cluster they go to one primary (the default node).
KEYLESS = frozenset({"TIME", "SCAN", "CONFIG", "ACL", "FUNCTION", "INFO", "CLUSTER", "PING", "WAIT",
                     "DBSIZE", "FLUSHALL", "FLUSHDB"})
# Commands that change nothing: a batch of only these needs no WAIT (min_replicas_ack).
READS = frozenset({"FCALL_RO", "GET", "HGET", "HGETALL", "HMGET", "EXISTS", "ZCARD", "ZRANGE", "ZSCORE",
                   "ZCOUNT", "ZRANGEBYSCORE", "ZREVRANGE", "SCARD", "SMEMBERS", "SISMEMBER", "SCAN", "ZSCAN",
                   "HSCAN", "SSCAN", "TIME", "TYPE", "TTL", "PTTL", "HLEN", "STRLEN"})


def is_cluster_url(url: str) -> bool:
    return url.startswith(CLUSTER_SCHEME + "://")


def cluster_from_url(url: str, socket_timeout: float | None, connect_timeout: float | None) -> RedisCluster:
    """A RedisCluster for redis+cluster://[user:password@]host:port[,host:port...] (any of the
    nodes; the others are found from the first that answers). Raises ValueError for a bad URL,
    redis errors when no node answers."""
    parts = urlsplit(url)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    username, _, password = userinfo.partition(":") if userinfo else ("", "", "")
    nodes = []
    for item in hosts.split(","):
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"expected host:port in a {CLUSTER_SCHEME}:// URL, not {item!r}")
        nodes.append(ClusterNode(host.strip("[]"), int(port)))
    if parts.path not in ("", "/", "/0"):
        raise ValueError("a cluster has only database 0")
    try:
        return RedisCluster(startup_nodes=nodes, username=unquote(username) or None,
                            password=unquote(password) or None, socket_timeout=socket_timeout,
                            socket_connect_timeout=connect_timeout, retry=Retry(NoBackoff(), 0),
                            require_full_coverage=False)
    except RedisClusterException as exc:  # no node answered, or no slot map
        raise redis.ConnectionError(str(exc)) from None


def is_cluster(client: Any) -> TypeGuard[RedisCluster]:
    return isinstance(client, RedisCluster)


def primary_clients(client: Any) -> list[redis.Redis]:
    """One plain client per primary (a cluster), or [client]: for what each server needs
    (the library, the preflight checks, FLUSHALL in tests)."""
    if not is_cluster(client):
        return [client]
    return [client.get_redis_connection(node) for node in client.get_primaries()]


def command_key(command: Sequence[Any]) -> Any:
    """The key a command is routed by, or None for a keyless one."""
    name = _name(command)
    if name in ("FCALL", "FCALL_RO", "EVAL", "EVALSHA"):
        return command[3] if int(command[2]) > 0 else None
    if name in KEYLESS or len(command) < 2:
        return None
    return command[1]


def slot_of(key: Any) -> int:
    return key_slot(key if isinstance(key, bytes) else str(key).encode())


def node_of_slot(client: RedisCluster, slot: int) -> ClusterNode:
    node = client.nodes_manager.get_node_from_slot(slot)
    if node is None:
        raise redis.exceptions.ClusterDownError(f"CLUSTERDOWN slot {slot} is not served")
    return node


def node_client(client: Any, key: Any) -> redis.Redis:
    """The plain client of the node that serves `key`'s slot (the client itself when not a
    cluster): for a SCAN or a MULTI pipeline confined to one shard."""
    if not is_cluster(client):
        return client
    return client.get_redis_connection(node_of_slot(client, slot_of(key)))


def node_name(client: Any, key: Any) -> str:
    """host:port of the node that serves `key` ("" when not a cluster)."""
    return node_of_slot(client, slot_of(key)).name if is_cluster(client) else ""


def refresh(client: RedisCluster) -> None:
    """Re-read the slot map (after a lost connection or a redirect); a failure leaves the old."""
    try:
        client.nodes_manager.initialize()
    except (redis.RedisError, RedisClusterException):
        pass


def needs_wait(commands: Sequence[Sequence[Any]]) -> bool:
    return any(_name(c) not in READS for c in commands)


def check_wait(reply: Any, wanted: int) -> None:
    """Raise when WAIT says fewer than `wanted` replicas hold the writes before it."""
    if isinstance(reply, Exception) or int(reply) < wanted:
        got = reply if isinstance(reply, Exception) else f"{int(reply)} replica(s)"
        raise MasterError(ErrorCode.OUTCOME_UNKNOWN,
                          f"the writes ran but reached {got}, not the {wanted} min_replicas_ack asks for; "
                          f"they may be lost if their primary fails")


def send_plain(client: redis.Redis, commands: Sequence[Sequence[Any]], wait: tuple[int, int] | None = None,
               asking: Sequence[bool] = ()) -> list[Any]:
    """One pipeline (no MULTI) on one server; replies in order, error replies in place. With
    `wait` (replicas, timeout ms) and any write among the commands, a WAIT follows them and a
    shortfall raises (check_wait). `asking[i]` sends ASKING before command i."""
    pipe = client.pipeline(transaction=False)
    where = []
    for i, command in enumerate(commands):
        if i < len(asking) and asking[i]:
            pipe.execute_command("ASKING")
        where.append(len(pipe.command_stack))
        pipe.execute_command(*command)
    waited = wait if wait and needs_wait(commands) else None
    if waited:
        pipe.execute_command("WAIT", *waited)
    out = pipe.execute(raise_on_error=False)
    if waited:
        check_wait(out[-1], waited[0])
    return [out[i] for i in where]


def send(client: RedisCluster, commands: Sequence[Sequence[Any]], wait: tuple[int, int] | None) -> list[Any]:
    """Run commands on a cluster: grouped by node, one pipeline per node; replies in input order.
    A command a node did not run (MOVED, ASK, TRYAGAIN, READONLY) goes again to the right node,
    up to MAX_REDIRECTS rounds; one answered "Function not found" goes again after loading the
    library on its node (replies.reload). A lost reply refreshes the slot map and raises (redis
    ConnectionError/TimeoutError)."""
    replies: list[Any] = [None] * len(commands)
    todo = list(range(len(commands)))
    ask: dict[int, ClusterNode] = {}
    for round_ in range(MAX_REDIRECTS + 1):
        groups: dict[str, list[int]] = defaultdict(list)
        nodes: dict[str, ClusterNode] = {}
        for i in todo:
            key = command_key(commands[i])
            node = ask.get(i) or (node_of_slot(client, slot_of(key)) if key is not None
                                  else client.get_default_node())
            groups[node.name].append(i)
            nodes[node.name] = node
        asked, ask, again = ask, {}, []
        moved = busy = False
        for name, idx in groups.items():
            plain = client.get_redis_connection(nodes[name])
            try:
                out = send_plain(plain, [commands[i] for i in idx], wait, [i in asked for i in idx])
                missing = [j for j, r in enumerate(out)
                           if isinstance(r, redis.ResponseError) and FUNCTION_MISSING in str(r)]
                if missing:  # a new node, or a replica promoted before the library reached it
                    reload(plain)
                    for j, r in zip(missing, send_plain(plain, [commands[idx[j]] for j in missing], wait)):
                        out[j] = r
            except (redis.ConnectionError, redis.TimeoutError):
                refresh(client)
                raise
            for i, reply in zip(idx, out):
                replies[i] = reply
                if isinstance(reply, (MovedError, ReadOnlyError, TryAgainError)):  # MovedError is an AskError
                    busy = busy or isinstance(reply, TryAgainError)
                    moved = moved or not isinstance(reply, TryAgainError)
                    again.append(i)
                elif isinstance(reply, AskError):
                    target = client.get_node(host=reply.host, port=reply.port)
                    if target is None:
                        refresh(client)
                        target = client.get_node(host=reply.host, port=reply.port)
                    if target is not None:
                        ask[i] = target
                        again.append(i)
        if not again or round_ == MAX_REDIRECTS:
            return replies
        if moved:
            refresh(client)
        if busy:
            time.sleep(0.01 * (round_ + 1))  # TRYAGAIN: a multi-key step of a migration in flight
        todo = again
    return replies


def _name(command: Sequence[Any]) -> str:
    name = command[0]
    return (name.decode() if isinstance(name, bytes) else str(name)).upper()
