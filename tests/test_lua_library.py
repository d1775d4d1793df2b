"""The assembled Lua library (mooncake_redis/functions.py `assemble`) on a real Valkey and a real
Redis 7: it keeps room to grow under Lua 5.1's 200 locals a function, in the main chunk and in the
scope of every lua/ file."""
from __future__ import annotations

import shutil

import pytest
import redis

from mooncake_redis import functions
from mooncake_redis.server import EmbeddedValkey

REDIS_SERVER = shutil.which("redis-server")
HEADROOM = 30  # locals every scope must still have room for
LUA_MAX_LOCALS = 200  # Lua 5.1's LUAI_MAXVARS


@pytest.fixture(scope="module", params=["valkey", "redis"])
def server(request):
    """A private server per kind: these tests replace the library at will."""
    if request.param == "redis" and not REDIS_SERVER:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    srv = EmbeddedValkey(appendonly=False, **({"binary": REDIS_SERVER} if request.param == "redis" else {})).start()
    yield srv
    srv.stop()


@pytest.fixture
def client(server):
    c = redis.Redis.from_url(server.url)
    yield c
    c.close()


def load(client, lib: functions.Library) -> str | None:
    """None when FUNCTION LOAD took the library, else the server's error."""
    try:
        client.execute_command("FUNCTION", "LOAD", "REPLACE", lib.source)
    except redis.ResponseError as exc:
        return str(exc)
    return None


def scopes() -> list[str]:
    lua = functions.lua_dir()
    return ["main"] + [f"lua/{p.parent.name}/{p.name}" for d in ("lib", "ops") for p in sorted((lua / d).glob("*.lua"))]


def test_the_library_loads_with_spare_locals_in_every_scope(client):
    error = load(client, functions.assemble(functions.lua_dir(), spare_locals=HEADROOM))
    assert error is None, (f"the library has no room for {HEADROOM} more locals in some scope: {error} "
                           "(split the file, or move locals into a module table)")


def test_too_many_locals_fail_to_load_and_name_the_scope(client):
    """The check above can fail: 200 spare locals in an ops file's scope do not load, and the
    error names that file."""
    lib = functions.assemble(functions.lua_dir(), spare_locals=LUA_MAX_LOCALS, spare_scopes={"lua/ops/put_end.lua"})
    error = load(client, lib)
    assert error is not None and "more than 200 local variables" in error
    assert "main function" not in error  # the file's own function, not the main chunk


def headroom(client, scope: str) -> int:
    """The most spare locals `scope` takes (binary search on the server)."""
    lo, hi = 0, LUA_MAX_LOCALS  # lo loads, hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ok = load(client, functions.assemble(functions.lua_dir(), spare_locals=mid, spare_scopes={scope})) is None
        lo, hi = (mid, hi) if ok else (lo, mid)
    return lo


def test_locals_of_every_scope(client, server):
    """Counts the locals of the main chunk and of each file's scope (200 - the spare locals it
    takes) and prints them (pytest -s); each scope keeps HEADROOM spare. (On Valkey only: both
    servers run the same Lua 5.1 compiler.)"""
    if server.binary is not None:
        pytest.skip("counted on Valkey")
    counts = {scope: LUA_MAX_LOCALS - headroom(client, scope) for scope in scopes()}
    print(f"\nlocals per scope on {server.url} (Lua 5.1 allows {LUA_MAX_LOCALS}):")
    for scope, n in counts.items():
        print(f"  {n:4d}  {scope}")
    assert counts["main"] <= 20, f"the main chunk has {counts['main']} locals: a module table per lua/lib file"
    assert all(n <= LUA_MAX_LOCALS - HEADROOM for n in counts.values()), counts
    load(client, functions.library())
