"""bench/luaprofile.py: the Lua VM instructions of a workload by function and line of lua/
(fakeredis's Lua 5.1 with a count hook). No figure is asserted beyond relations that must hold."""
from __future__ import annotations

import pytest

from mooncake_redis.bench import luaprofile


@pytest.mark.parametrize("radix", [False, True])
def test_a_profile_names_the_lines_of_lua_that_ran(radix):
    got = luaprofile.profile("remove", n=16, batch=8, radix=radix)
    assert got["total"] == sum(got["lines"].values()) == sum(got["functions"].values()) > 0
    assert got["per_key"] == got["total"] / 16
    files = {where.split(":", 1)[0] for where in got["lines"]}
    assert "lua/ops/remove.lua" in files and "lua/lib/10_alloc.lua" in files  # the remove and its frees
    # a node's code runs only with the index on (a node goes with its last key)
    assert any(f.endswith(" node_retired") for f in got["functions"]) == radix
    assert any(f.endswith(" remove_one") for f in got["functions"]), sorted(got["functions"])


def test_each_workload_runs_its_own_function():
    seen = {}
    for workload, op in [("put", "put_start"), ("put_end", "put_end"), ("exist", "get_replica_list"),
                         ("get", "get_replica_list"), ("evict", "evict")]:
        got = luaprofile.profile(workload, n=16, batch=8)
        seen[workload] = got["per_key"]
        assert any(w.startswith(f"lua/ops/{op}.lua:") for w in got["lines"]), (workload, sorted(got["lines"]))
    assert seen["exist"] < seen["put"]  # a read runs far less Lua than a put


def test_the_command_prints_both_tables():
    lines: list[str] = []
    luaprofile.main(["exist", "--n", "8", "--top", "3"], out=lines.append)
    assert lines[0].startswith("exist, radix index off: n=8 keys") and "Lua VM instructions a key" in lines[0]
    assert lines[1].strip() == "by function (its own lines):" and lines[5].strip() == "by line:"
    assert len(lines) == 9
