"""The assembled Lua library (mooncake_redis/library.py `assemble`) on a real Valkey and a real
Redis 7: it keeps room to grow under Lua 5.1's 200 locals a function, in the main chunk and in the
scope of every lua/ file, and an error inside it names lua/<file>:<line>, whether FUNCTION LOAD
fails or a function fails at run time."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import redis

from mooncake_redis import library
from mooncake_redis.errors import MasterError
from mooncake_redis.server import EmbeddedValkey
from mooncake_redis.transport import run

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


def load(client, lib: library.Library) -> str | None:
    """None when FUNCTION LOAD took the library, else the server's error."""
    try:
        client.execute_command("FUNCTION", "LOAD", "REPLACE", lib.source)
    except redis.ResponseError as exc:
        return str(exc)
    return None


def scopes() -> list[str]:
    lua = library.lua_dir()
    return ["main"] + [f"lua/{p.parent.name}/{p.name}" for d in ("lib", "ops") for p in sorted((lua / d).glob("*.lua"))]


def test_the_library_loads_with_spare_locals_in_every_scope(client):
    error = load(client, library.assemble(library.lua_dir(), spare_locals=HEADROOM))
    assert error is None, (f"the library has no room for {HEADROOM} more locals in some scope: {error} "
                           "(split the file, or move locals into a module table)")


def test_too_many_locals_fail_to_load_and_name_the_scope(client):
    """The check above can fail: 200 spare locals in an ops file's scope do not load, and the
    error names that file."""
    lib = library.assemble(library.lua_dir(), spare_locals=LUA_MAX_LOCALS, spare_scopes={"lua/ops/put_end.lua"})
    error = load(client, lib)
    assert error is not None and "more than 200 local variables" in error
    assert "main function" not in error  # the file's own function, not the main chunk
    assert library.locate_lines(error, lib) != error


def headroom(client, scope: str) -> int:
    """The most spare locals `scope` takes (binary search on the server)."""
    lo, hi = 0, LUA_MAX_LOCALS  # lo loads, hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ok = load(client, library.assemble(library.lua_dir(), spare_locals=mid, spare_scopes={scope})) is None
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
    load(client, library.library())


# ---- errors name lua/<file>:<line> ---------------------------------------------------------

TEST_OPS = '''-- a test-only ops file
local register, S = Base.register, Base.S

register('mc_test_boom', {}, function(P, args, cfg)
  error('boom')
end)
register('mc_test_nil', {}, function(P, args, cfg)
  return S(nil)
end)
'''


@pytest.fixture
def lua_copy(tmp_path, monkeypatch):
    """A copy of lua/ that the package builds its library from (library.lua_dir patched)."""
    lua = tmp_path / "lua"
    shutil.copytree(library.lua_dir(), lua)
    monkeypatch.setattr(library, "lua_dir", lambda: lua)
    library.library.cache_clear()
    yield lua
    monkeypatch.undo()
    library.library.cache_clear()


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_a_library_that_fails_to_load_names_the_file_and_line(client, lua_copy):
    broken = lua_copy / "ops" / "put_end.lua"
    broken.write_text(broken.read_text().replace("local function check_writer(o, client)",
                                                 "local function check_writer(o, client) x = = 1", 1))
    with pytest.raises(MasterError) as err:
        library.load(client)
    line = line_of(broken, "x = = 1")
    assert f"lua/ops/put_end.lua:{line}: unexpected symbol near '='" in str(err.value)
    assert "user_function" not in str(err.value)


def test_a_runtime_error_names_the_file_and_line(client, lua_copy):
    test_ops = lua_copy / "ops" / "zz_test.lua"
    test_ops.write_text(TEST_OPS)
    library.load(client)
    P = "ns:{ns:0}"
    client.hset(f"{P}:config", "shards", "1")
    with pytest.raises(MasterError) as err:
        run(client, [["FCALL", "mc_test_boom", 1, P]])
    line = line_of(test_ops, "error('boom')")
    assert re.search(rf"lua/ops/zz_test\.lua:{line}: boom\b", str(err.value)), str(err.value)
    assert "user_function" not in str(err.value)
    # an error inside a module names the module's file (the innermost line)
    with pytest.raises(MasterError) as err:
        run(client, [["FCALL", "mc_test_nil", 1, P]])
    assert re.search(r"lua/lib/00_base\.lua:\d+: attempt to perform arithmetic", str(err.value)), str(err.value)
    assert "user_function" not in str(err.value)


def test_locate_lines_leaves_other_text_alone():
    lib = library.library()
    assert library.locate_lines("no line here", lib) == "no line here"
    assert library.locate_lines("user_function:1: x", lib) == "user_function:1: x"  # the #! line
    assert library.locate_lines("user_function:999999: x", lib) == "user_function:999999: x"
    n = lib.origins.index(("lua/ops/put_end.lua", 1)) + 1
    assert library.locate_lines(f"user_function:{n + 4}: x", lib) == "lua/ops/put_end.lua:5: x"
