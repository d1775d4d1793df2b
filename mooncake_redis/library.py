"""The `mooncake` Redis Functions library: built from the Lua sources (`assemble`, `library`,
`library_source`, with a line map from the chunk's lines to lua/<file>:<line>, `locate_lines`)
and loaded when the server's copy is an older protocol or another build of the same one
(`server_library`, `ensure_loaded`, `load`). Also the store's schema version, recorded in its
configuration (`check_schema`, `stored_config`).

Sending is the transport's (mooncake_redis.transport): this module uses it to reach every
primary, and installs itself there (transport.replies.use_library) so that a "Function not
found" reloads it and error replies name its lines."""
from __future__ import annotations

import hashlib
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Collection, NamedTuple

import redis

from .errors import ErrorCode, MasterError
from .keys import HASHTABLE_FIELD, HASHTABLE_NOTE, shard_key
from .transport import replies
from .transport.cluster import primary_clients
from .transport.replies import error_of, no_reply

LIBRARY_NAME = "mooncake"
# The library's protocol: its FCALL interface (functions, arguments, replies). Raise it with any
# change a process of the previous build cannot use. A process never replaces a library of a
# newer protocol (a rolling upgrade must not downgrade it); protocol 1 replied to mc_version
# with the bare version, later ones with {version, protocol}; protocol 3 added `revoked` to
# mc_discard_puts' reply and `queued` to mc_evict's; protocol 4 gave mc_radix_reconcile and
# mc_radix_stats node ids (the caller's SCAN) in place of a cursor into the node index.
LIBRARY_PROTOCOL = 4
# The store's layout (keys and fields), written as `schema_version` into every shard's config
# hash by Master.connect; a package refuses a store of a newer schema. Stores written before the
# field existed have schema 1.
SCHEMA_VERSION = 9  # 2: an object's memory replicas in one field (mooncake_redis/layout.py); 3: the read mark;
# 4: a complete object has no status field; 5: a radix node's key set holds keys without its hash;
# 6: a radix key's `node` field says where the hash sits in the key; 7: a radix node's keys are
# fields of its record (no set); 8: a radix node may list a child in its record (kid); 9: no
# index of a shard's radix nodes (P:rnodes): walks SCAN their records
OBJECTS_SCHEMA = 7  # the newest schema whose objects mc_upgrade_objects rewrites (8, 9 rewrite none)
SCHEMA_FIELD = "schema_version"


def lua_dir() -> Path:
    """The Lua sources: mooncake_redis/lua in a wheel; the repository's top-level lua/ in an
    editable install or a checkout (setuptools maps it to mooncake_redis.lua only when building)."""
    here = Path(__file__).resolve().parent
    packaged = here / "lua"
    return packaged if packaged.is_dir() else here.parent / "lua"


class Library(NamedTuple):
    """The assembled library: its source, its version, and where each of its lines comes from
    (`origins[n - 1]` for line n as the server's Lua counts them: ("lua/ops/put_end.lua", line),
    or None for a line the assembly added)."""
    source: str
    version: str
    origins: tuple[tuple[str, int] | None, ...]

    def locate(self, line: int) -> str | None:
        """"lua/<file>:<line>" of a line of the chunk, or None when it is not from a file."""
        where = self.origins[line - 1] if 0 < line <= len(self.origins) else None
        return f"{where[0]}:{where[1]}" if where else None


def module_name(path: Path) -> str:
    """The module a lua/lib file defines: NN_<name>.lua is <Name> (10_alloc.lua: Alloc)."""
    return path.stem.split("_", 1)[1].capitalize()


def assemble(lua: Path, protocol: int = LIBRARY_PROTOCOL, spare_locals: int = 0,
             spare_scopes: Collection[str] | None = None) -> Library:
    """Build the library from the sources under `lua`. Each lua/lib/NN_<name>.lua is a module:
    its chunk (its own locals, imports from earlier modules at its top) runs as a function whose
    returned table becomes <Name>, a local of the main chunk declared before all of them, so that
    a module may also call a later one at run time (Radix.node_retired). Each lua/ops file runs
    as a function too, after every module: its locals count in its own scope (Lua 5.1 allows 200
    a function), never in the main chunk's. `spare_locals` adds that many unused locals to each
    scope of `spare_scopes` ("main" and file names such as "lua/ops/put_end.lua"; None: all of
    them), which tests/test_lua_library.py uses to measure the headroom. The version is a hash
    of everything after its own line (the protocol line included)."""
    libs, ops = sorted((lua / "lib").glob("*.lua")), sorted((lua / "ops").glob("*.lua"))
    if not libs and not ops:
        raise MasterError(ErrorCode.INTERNAL_ERROR, f"no Lua sources under {lua} (a broken installation)")

    def spares(scope: str) -> str:
        if spare_scopes is not None and scope not in spare_scopes:
            return ""
        return "".join(f"local _spare_{i} = {i}\n" for i in range(spare_locals))

    lines: list[str] = []
    origins: list[tuple[str, int] | None] = []

    def add(text: str, origin: tuple[str, int] | None = None) -> None:
        for n, line in enumerate(text.splitlines()):
            lines.append(line)
            origins.append((origin[0], origin[1] + n) if origin else None)

    def add_file(path: Path, opening: str) -> None:
        name = f"lua/{path.parent.name}/{path.name}"
        add(f"{opening} -- {name}\n{spares(name)}")
        add(path.read_text(), (name, 1))
        add("end)();")

    add(f"local LIBRARY_PROTOCOL = {protocol}")
    add(f"local {', '.join(module_name(p) for p in libs)} -- the modules of lua/lib, in order")
    add(spares("main"))
    for path in libs:
        add_file(path, f"{module_name(path)} = (function()")
    for path in ops:
        add_file(path, "(function()")
    body = "\n".join(lines)
    version = hashlib.sha1(body.encode()).hexdigest()[:16]
    # The server's Lua counts the #! line as line 1 (Valkey 8, Redis 7): the version line is 2.
    source = f"#!lua name={LIBRARY_NAME}\nlocal LIBRARY_VERSION = '{version}'\n{body}"
    return Library(source, version, (None, None, *origins))


@lru_cache(maxsize=1)
def library() -> Library:
    """The library of this package's Lua sources (lua_dir)."""
    return assemble(lua_dir())


def library_source() -> tuple[str, str]:
    """(source, version) of the library."""
    lib = library()
    return lib.source, lib.version


# Where a Lua error names a line of the library: "user_function:42:" in a failed FUNCTION LOAD
# and in a runtime error of Valkey and Redis 7.
_LUA_LINE = re.compile(r"user_function:(\d+)")


def locate_lines(text: str, lib: Library | None = None) -> str:
    """`text` with every line of the library it names ("user_function:42") as its file and line
    ("lua/ops/put_start.lua:17")."""
    lib = lib or library()
    return _LUA_LINE.sub(lambda m: lib.locate(int(m.group(1))) or m.group(0), text)


def server_library(client: redis.Redis) -> tuple[str, int] | None:
    """(version, protocol) of the library the server runs, or None when it has none (raw redis
    errors). Protocol 1 replied the bare version; later protocols reply {version, protocol}.
    On a cluster: the library of one primary (load puts the same on all)."""
    client = primary_clients(client)[0]
    try:
        reply = client.execute_command("FCALL_RO", "mc_version", 0)
    except redis.ResponseError:  # no library, or one without mc_version
        return None
    if isinstance(reply, (bytes, str)):
        return (reply.decode() if isinstance(reply, bytes) else reply), 1
    if isinstance(reply, list) and len(reply) == 2 and isinstance(reply[0], (bytes, str)):
        version, protocol = reply
        try:
            return (version.decode() if isinstance(version, bytes) else version), int(protocol)
        except (TypeError, ValueError):
            pass
    raise MasterError(ErrorCode.INTERNAL_ERROR,
                      f"the server's library {LIBRARY_NAME!r} replied {reply!r} to mc_version "
                      f"(expected a version, or a version and a protocol number)")


def ensure_loaded(client: redis.Redis) -> str:
    """Load the library (FUNCTION LOAD REPLACE) when the server has none, or one of an older
    protocol, or another build of the same protocol; refuse one of a newer protocol (raw redis
    errors)."""
    source, version = library_source()
    current = server_library(client)
    if current is not None:
        their_version, their_protocol = current
        if their_version == version:
            return version
        if their_protocol > LIBRARY_PROTOCOL:
            raise MasterError(ErrorCode.INTERNAL_ERROR,
                              f"the server runs library protocol {their_protocol}, newer than this "
                              f"package's {LIBRARY_PROTOCOL}: upgrade mooncake-redis")
    client.execute_command("FUNCTION", "LOAD", "REPLACE", source)
    return version


def check_schema(namespace: str, stored: dict) -> None:
    """Refuse a store (its shard 0 config hash, as HGETALL returned it) of a newer schema."""
    raw = stored.get(SCHEMA_FIELD.encode())
    if raw is None:
        return
    where = f"store {namespace!r} ({shard_key(namespace, 0)}:config)"
    if not raw.isdigit():
        raise MasterError(ErrorCode.INTERNAL_ERROR, f"{where}: field {SCHEMA_FIELD} has a corrupt value {raw!r}")
    if int(raw) > SCHEMA_VERSION:
        raise MasterError(ErrorCode.INTERNAL_ERROR,
                          f"{where} has schema version {int(raw)}, newer than this package's "
                          f"{SCHEMA_VERSION}: upgrade mooncake-redis")


def stored_config(config: Any) -> dict[str, str]:
    """The fields Master.connect writes to every shard's config hash: the MasterConfig, the
    schema version and the field that keeps the hash a hashtable (keys.HASHTABLE_FIELD)."""
    return {**config.to_redis(), SCHEMA_FIELD: str(SCHEMA_VERSION), HASHTABLE_FIELD: HASHTABLE_NOTE}


def load(client: redis.Redis) -> str:
    """ensure_loaded (on a cluster: on every primary; a replica gets it by replication), with its
    failures as MasterError."""
    try:
        versions = [ensure_loaded(c) for c in primary_clients(client)]
        return versions[0]
    except redis.BusyLoadingError as exc:
        raise error_of(exc) from None
    except redis.ResponseError as exc:
        raise MasterError(ErrorCode.INTERNAL_ERROR,
                          f"cannot load the functions library {LIBRARY_NAME!r} (a user that may not "
                          f"FUNCTION LOAD needs an administrator to load it): {locate_lines(str(exc))}") from None
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise no_reply(exc) from exc


replies.use_library(sys.modules[__name__])
