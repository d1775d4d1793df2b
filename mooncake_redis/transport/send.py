"""Sending: `run` is the one place commands reach Redis. Function calls to a plain server go by
the lean RESP path (transport.resp), a cluster's commands by the cluster path
(transport.cluster), everything else by redis-py; the replies mean what transport.replies says
(the library reloaded once on "Function not found", error replies and lost replies as
MasterError)."""
from __future__ import annotations

from typing import Any, Sequence

import redis

from ..errors import ErrorCode, MasterError
from . import cluster, resp
from .replies import ERROR_REPLIES, finish, missing_functions, no_reply, reload


def run(client: redis.Redis, commands: Sequence[Sequence[Any]], raise_on_error: bool = True,
        wait: tuple[int, int] | None = None) -> list[Any]:
    """Run commands (one: a plain call; several: one pipeline, no MULTI) and return their replies
    in order. Commands answered "Function not found" (FUNCTION FLUSH, a restart without
    persistence) are run once more after loading the library. Error replies become MasterError
    (a function's own "<NAME> <code> <detail>" keeps its code): the first is raised, or with
    raise_on_error=False each is returned in its place. No reply at all (timeout, lost
    connection) raises OUTCOME_UNKNOWN: the commands may or may not have run. Function calls to a
    plain server go by the lean transport (transport.resp), everything else by redis-py. With `wait`
    (replicas, timeout ms), writes are followed by WAIT on their server, and fewer replicas
    than asked raise OUTCOME_UNKNOWN. A cluster client (transport.cluster) sends each
    command to the node of its key's slot."""
    try:
        replies = _send(client, commands, wait)
        missing = missing_functions(replies)
        if missing:
            reload(client)
            for i, reply in zip(missing, _send(client, [commands[i] for i in missing], wait)):
                replies[i] = reply
    except redis.AuthenticationError as exc:  # refused at login: nothing ran
        raise MasterError(ErrorCode.INTERNAL_ERROR, f"Redis refused the login: {exc}") from None
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise no_reply(exc) from exc
    except redis.DataError as exc:  # an argument redis-py cannot send
        raise MasterError(ErrorCode.INVALID_PARAMS, str(exc)) from None
    return finish(replies, raise_on_error)


def _send(client: redis.Redis, commands: Sequence[Sequence[Any]], wait: tuple[int, int] | None) -> list[Any]:
    if cluster.is_cluster(client):
        return cluster.send(client, commands, wait)
    if wait:
        return cluster.send_plain(client, commands, wait)
    lean = resp.lean_for(client, commands)
    if lean is not None:
        return lean.send(commands)
    if len(commands) == 1:
        try:
            return [client.execute_command(*commands[0])]
        except ERROR_REPLIES as exc:
            return [exc]
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    return pipe.execute(raise_on_error=False)
