"""The transport: how the package reaches a store's servers.

- shards: `Shards`, the shard routing every API family, Worker, fsck and the CLI share (one
  FCALL per shard and chunk, pipelined; BATCH_CHUNK, CHUNK_OF).
- send: `run`, the one place commands reach Redis.
- replies: what replies mean (`finish`, `error_of`, `no_reply`; "Function not found" reloads
  the library that mooncake_redis.library installs here).
- resp: the lean RESP path (function calls to a plain server on a socket of our own).
- resp_async: the asyncio pipelined path (the Mooncake gateway's).
- cluster: the Redis Cluster path (redis+cluster:// URLs, commands routed to their slot's node).
- client: `client_from_url`, a client for a store's URL (`check_url`: its form, not connecting).

Building and loading the library is mooncake_redis.library's, errors mooncake_redis.errors'."""
from .client import CONNECT_TIMEOUT_S, SOCKET_TIMEOUT_S, check_url, client_from_url
from .replies import error_of, finish, no_reply
from .send import run
from .shards import BATCH_CHUNK, CHUNK_OF, SCAN_COUNT, Shards

__all__ = ["Shards", "BATCH_CHUNK", "CHUNK_OF", "SCAN_COUNT", "run", "finish", "error_of", "no_reply",
           "client_from_url", "check_url", "CONNECT_TIMEOUT_S", "SOCKET_TIMEOUT_S"]
