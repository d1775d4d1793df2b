"""What a server's replies mean: error replies as MasterError (`finish`, `error_of`), a lost
reply as OUTCOME_UNKNOWN (`no_reply`), "Function not found" (`missing_functions`), and the
library that a missing function is loaded from (`reload`).

The transport never imports the library module (mooncake_redis.library imports the transport
to load itself, so that would be a cycle): the library installs itself here when it is
imported (`use_library`), which `import mooncake_redis` always does (it imports Master)."""
from __future__ import annotations

from typing import Any, Protocol

import redis

from ..errors import ErrorCode, MasterError, parse_error_reply

FUNCTION_MISSING = "Function not found"  # the reply to an FCALL when the library is not loaded

# Error replies (LOADING is a ConnectionError in redis-py, but a reply: the command did not run).
ERROR_REPLIES = (redis.ResponseError, redis.BusyLoadingError)


class Library(Protocol):
    """What the transport needs of the library (mooncake_redis.library is one)."""
    LIBRARY_NAME: str

    def load(self, client: redis.Redis) -> str: ...

    def locate_lines(self, text: str) -> str: ...


_library: Library | None = None


def use_library(library: Library) -> None:
    """The library to load on "Function not found" and whose lines error replies name."""
    global _library
    _library = library


def reload(client: redis.Redis) -> str:
    """Load the library on `client`'s server (Library.load: MasterError on failure)."""
    if _library is None:
        raise MasterError(ErrorCode.INTERNAL_ERROR, "no functions library to load (import mooncake_redis.library)")
    return _library.load(client)


def missing_functions(replies: list[Any]) -> list[int]:
    """The replies that say "Function not found" (the library is not loaded)."""
    return [i for i, r in enumerate(replies) if isinstance(r, redis.ResponseError) and FUNCTION_MISSING in str(r)]


def finish(replies: list[Any], raise_on_error: bool = True) -> list[Any]:
    """Error replies as MasterError: the first raised, or with raise_on_error=False each in its place."""
    for i, reply in enumerate(replies):
        if isinstance(reply, ERROR_REPLIES):
            replies[i] = error_of(reply)
            if raise_on_error:
                raise replies[i]
    return replies


# Error replies that say the server did not run the command now, and may later.
_NOT_NOW = ("LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN")


def error_of(exc: redis.RedisError) -> MasterError:
    """An error reply as MasterError: a function's own keeps its code; a server that did not run
    the call now (LOADING, BUSY, ...) is UNAVAILABLE; anything else from Redis (NOPERM, OOM, a
    library still missing after a reload, a Lua error: its lines named as lua/<file>:<line> of
    this package's library) is INTERNAL_ERROR."""
    err = parse_error_reply(str(exc))
    if err is not None:
        return err
    if isinstance(exc, redis.BusyLoadingError) or str(exc).split(" ", 1)[0] in _NOT_NOW:
        return MasterError(ErrorCode.UNAVAILABLE, f"the call did not run, retry it: {exc}")
    if FUNCTION_MISSING in str(exc):
        return MasterError(ErrorCode.INTERNAL_ERROR, f"functions library {_name()!r} missing after loading it: {exc}")
    return MasterError(ErrorCode.INTERNAL_ERROR, f"Redis replied: {_locate(str(exc))}")


def no_reply(exc: Exception) -> MasterError:
    return MasterError(ErrorCode.OUTCOME_UNKNOWN,
                       f"no reply from Redis ({type(exc).__name__}: {exc}); the call may or may not have run")


def _name() -> str:
    return _library.LIBRARY_NAME if _library is not None else "mooncake"


def _locate(text: str) -> str:
    return _library.locate_lines(text) if _library is not None else text
