"""Connect-time checks of a real Redis/Valkey server (Master.connect; not for memory://).

1. maxmemory-policy must be noeviction: any other policy may delete store keys under memory
   pressure, which corrupts the store (a half-deleted object, a lost free list).
2. With ACLs, the user must be allowed every command the functions and this package run, on
   the store's keys: a command refused inside a function fails it half way, after some of its
   writes. Checked with ACL DRYRUN when the user may run ACL WHOAMI and ACL DRYRUN.
A user that may not run CONFIG GET or the ACL commands gets a warning, not a refusal.
"""
from __future__ import annotations

import logging
import re
from typing import Any

import redis

from .errors import ErrorCode, MasterError
from .keys import shard_key
from .library import library_source
from .transport import run
from .transport.cluster import primary_clients

log = logging.getLogger(__name__)

# ACL DRYRUN arguments (K = the store's shard key) of every command the functions (lua/) and
# this package (client, worker, fsck, CLI) run. FUNCTION LOAD is not needed when an
# administrator loads the library.
DRYRUN_ARGS = {
    "DEL": "K", "EXISTS": "K", "GET": "K", "SET": "K v", "INCR": "K", "INCRBY": "K 1",
    "HDEL": "K f", "HGET": "K f", "HGETALL": "K", "HINCRBY": "K f 1", "HMGET": "K f", "HSET": "K f v",
    "HSETNX": "K f v", "HKEYS": "K", "HSCAN": "K 0",
    "SADD": "K m", "SREM": "K m", "SCARD": "K", "SMEMBERS": "K", "SRANDMEMBER": "K 1", "SISMEMBER": "K m",
    "ZADD": "K 1 m", "ZCARD": "K", "ZCOUNT": "K 0 1", "ZINCRBY": "K 1 m", "ZRANGE": "K 0 1",
    "ZRANGEBYSCORE": "K 0 1", "ZREM": "K m", "ZREVRANGE": "K 0 1", "ZREVRANGEBYSCORE": "K 1 0",
    "ZREMRANGEBYSCORE": "K 0 1", "ZSCORE": "K m", "ZMSCORE": "K m", "ZRANDMEMBER": "K -1 WITHSCORES",
    "ZSCAN": "K 0", "SCAN": "0", "TIME": "", "MULTI": "", "EXEC": "",
    "XADD": "K 0-* f v", "XRANGE": "K - +", "XREVRANGE": "K + -",  # the KV event streams
    "FCALL": "mc_now 1 K", "FCALL_RO": "mc_now 1 K",
}
_LUA_CALL = re.compile(r"redis\.p?call\(\s*['\"]([A-Za-z]+)['\"]")


def needed_commands() -> set[str]:
    """Every command a master user must be allowed (those the functions run read from lua/)."""
    return set(DRYRUN_ARGS) | {c.upper() for c in _LUA_CALL.findall(library_source()[0])}


def check_server(client: redis.Redis, namespace: str, require_noeviction: bool = True) -> None:
    """Both checks, on every primary of a cluster."""
    for server in primary_clients(client):
        _check_policy(server, require_noeviction)
        _check_acl(server, namespace)


def _reply(client: redis.Redis, *command: str) -> tuple[Any, str]:
    """(reply, "") or, when Redis refuses the command itself (NOPERM, unknown), (None, why)."""
    try:
        return run(client, [command])[0], ""
    except MasterError as exc:
        if exc.code == ErrorCode.OUTCOME_UNKNOWN:
            raise
        return None, exc.message


REQUIRED_POLICY = "noeviction"  # the only maxmemory-policy under which Redis deletes no store key


def maxmemory_policy(client: redis.Redis) -> tuple[str | None, str]:
    """(the server's maxmemory-policy, "") or, when it cannot be read (CONFIG GET refused by an
    ACL, renamed, or a server without it), (None, why). Reads only."""
    reply, why = _reply(client, "CONFIG", "GET", "maxmemory-policy")
    if isinstance(reply, list):
        reply = dict(zip(reply[::2], reply[1::2]))
    policy = (reply or {}).get(b"maxmemory-policy") if isinstance(reply, (dict, type(None))) else None
    if policy is None:
        return None, why or "CONFIG GET maxmemory-policy answered nothing"
    return policy.decode(errors="replace") if isinstance(policy, bytes) else str(policy), ""


def _check_policy(client: redis.Redis, require_noeviction: bool) -> None:
    policy, _ = maxmemory_policy(client)
    if policy is None:
        log.warning("cannot read the server's maxmemory-policy (CONFIG GET refused): make sure it is "
                    "noeviction, any other policy may delete store keys")
        return
    if policy != REQUIRED_POLICY and require_noeviction:
        raise MasterError(ErrorCode.INTERNAL_ERROR,
                          f"Redis runs with maxmemory-policy {policy}, which may delete store keys and corrupt "
                          f"the store; set it to noeviction (CONFIG SET maxmemory-policy noeviction) or "
                          f"connect with require_noeviction=False")


def _check_acl(client: redis.Redis, namespace: str) -> None:
    user, why = _reply(client, "ACL", "WHOAMI")
    if user is None:
        if "unknown" in why.lower():  # a server without ACLs (before Redis 6)
            return
        log.warning("cannot check this Redis user's permissions (ACL WHOAMI refused); a user lacking a "
                    "command the functions run makes calls fail half way (see docs/operations.md, Running against "
                    "your own Redis)")
        return
    user = user.decode() if isinstance(user, bytes) else user
    key = shard_key(namespace, 0)
    names = sorted(needed_commands())
    replies = run(client, [("ACL", "DRYRUN", user, name,
                            *[key if a == "K" else a for a in DRYRUN_ARGS.get(name, "K").split()])
                           for name in names], raise_on_error=False)
    denied = []
    for name, reply in zip(names, replies):
        if isinstance(reply, MasterError):  # DRYRUN itself refused (NOPERM, Redis 6), or odd arguments
            if "dryrun" in reply.message.lower():
                log.warning("cannot check the permissions of Redis user %r (ACL DRYRUN refused): %s",
                            user, reply.message)
                return
            log.debug("ACL DRYRUN %s: %s", name, reply.message)
        elif reply not in (b"OK", "OK"):
            denied.append(reply.decode(errors="replace") if isinstance(reply, bytes) else str(reply))
    if denied:
        raise MasterError(ErrorCode.INTERNAL_ERROR,
                          f"Redis user {user!r} may not run what a master of namespace {namespace!r} needs "
                          f"(see docs/operations.md, Running against your own Redis): "
                          + "; ".join(dict.fromkeys(denied)))
