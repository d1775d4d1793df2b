"""Builds the Redis Functions library from lua/, loads it when the server's copy differs, and
runs every call: `run` is the one place commands reach Redis (reload on "Function not found",
error replies and lost replies as MasterError)."""
from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

import redis

from .errors import ErrorCode, MasterError, parse_error_reply

LIBRARY_NAME = "mooncake"
LUA_DIR = Path(__file__).resolve().parent.parent / "lua"
FUNCTION_MISSING = "Function not found"  # the reply to an FCALL when the library is not loaded


@lru_cache(maxsize=1)
def library_source() -> tuple[str, str]:
    """(source, version). Shared helpers (lua/lib) come first; each operation file (lua/ops)
    is wrapped in do ... end so its locals stay its own."""
    parts = [p.read_text() for p in sorted((LUA_DIR / "lib").glob("*.lua"))]
    parts += ["do\n" + p.read_text() + "\nend" for p in sorted((LUA_DIR / "ops").glob("*.lua"))]
    body = "\n".join(parts)
    version = hashlib.sha1(body.encode()).hexdigest()[:16]
    source = f"#!lua name={LIBRARY_NAME}\nlocal LIBRARY_VERSION = '{version}'\n{body}"
    return source, version


def ensure_loaded(client: redis.Redis, force: bool = False) -> str:
    """Load the library unless the server already runs this exact version (raw redis errors)."""
    source, version = library_source()
    if not force:
        try:
            current = client.execute_command("FCALL_RO", "mc_version", 0)
            if (current.decode() if isinstance(current, bytes) else current) == version:
                return version
        except redis.ResponseError:
            pass
    client.execute_command("FUNCTION", "LOAD", "REPLACE", source)
    return version


def load(client: redis.Redis, force: bool = False) -> str:
    """ensure_loaded, with its failures as MasterError."""
    try:
        return ensure_loaded(client, force)
    except redis.BusyLoadingError as exc:
        raise error_of(exc) from None
    except redis.ResponseError as exc:
        raise MasterError(ErrorCode.INTERNAL_ERROR,
                          f"cannot load the functions library {LIBRARY_NAME!r} (a user that may not "
                          f"FUNCTION LOAD needs an administrator to load it): {exc}") from None
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise _no_reply(exc) from exc


def run(client: redis.Redis, commands: Sequence[Sequence[Any]], raise_on_error: bool = True) -> list[Any]:
    """Run commands (one: a plain call; several: one pipeline, no MULTI) and return their replies
    in order. Commands answered "Function not found" (FUNCTION FLUSH, a restart without
    persistence) are run once more after loading the library. Error replies become MasterError
    (a function's own "<NAME> <code> <detail>" keeps its code): the first is raised, or with
    raise_on_error=False each is returned in its place. No reply at all (timeout, lost
    connection) raises OUTCOME_UNKNOWN: the commands may or may not have run."""
    try:
        replies = _send(client, commands)
        missing = [i for i, r in enumerate(replies) if isinstance(r, redis.ResponseError) and FUNCTION_MISSING in str(r)]
        if missing:
            load(client, force=True)
            for i, reply in zip(missing, _send(client, [commands[i] for i in missing])):
                replies[i] = reply
    except redis.AuthenticationError as exc:  # refused at login: nothing ran
        raise MasterError(ErrorCode.INTERNAL_ERROR, f"Redis refused the login: {exc}") from None
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise _no_reply(exc) from exc
    except redis.DataError as exc:  # an argument redis-py cannot send
        raise MasterError(ErrorCode.INVALID_PARAMS, str(exc)) from None
    for i, reply in enumerate(replies):
        if isinstance(reply, _ERROR_REPLIES):
            replies[i] = error_of(reply)
            if raise_on_error:
                raise replies[i]
    return replies


# Error replies (LOADING is a ConnectionError in redis-py, but a reply: the command did not run).
_ERROR_REPLIES = (redis.ResponseError, redis.BusyLoadingError)


def _send(client: redis.Redis, commands: Sequence[Sequence[Any]]) -> list[Any]:
    if len(commands) == 1:
        try:
            return [client.execute_command(*commands[0])]
        except _ERROR_REPLIES as exc:
            return [exc]
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    return pipe.execute(raise_on_error=False)


# Error replies that say the server did not run the command now, and may later.
_NOT_NOW = ("LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN")


def error_of(exc: redis.RedisError) -> MasterError:
    """An error reply as MasterError: a function's own keeps its code; a server that did not run
    the call now (LOADING, BUSY, ...) is UNAVAILABLE; anything else from Redis (NOPERM, OOM, a
    library still missing after a reload) is INTERNAL_ERROR."""
    err = parse_error_reply(str(exc))
    if err is not None:
        return err
    if isinstance(exc, redis.BusyLoadingError) or str(exc).split(" ", 1)[0] in _NOT_NOW:
        return MasterError(ErrorCode.UNAVAILABLE, f"the call did not run, retry it: {exc}")
    if FUNCTION_MISSING in str(exc):
        return MasterError(ErrorCode.INTERNAL_ERROR, f"functions library {LIBRARY_NAME!r} missing after loading it: {exc}")
    return MasterError(ErrorCode.INTERNAL_ERROR, f"Redis replied: {exc}")


def _no_reply(exc: Exception) -> MasterError:
    return MasterError(ErrorCode.OUTCOME_UNKNOWN,
                       f"no reply from Redis ({type(exc).__name__}: {exc}); the call may or may not have run")
