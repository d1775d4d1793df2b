"""The key schema has one table per language: Lua's K (lua/lib/00_base.lua) and Python's
mooncake_redis.keys.K. They must agree, every suffix either side uses must come from them, and
no other Python module spells a suffix itself."""
from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from mooncake_redis.keys import K, PYTHON_ONLY, ShardKeys, object_key, shard_key

ROOT = Path(__file__).resolve().parent.parent
LUA = ROOT / "lua"


def lua_k_table() -> dict[str, str]:
    source = (LUA / "lib" / "00_base.lua").read_text()
    body = re.search(r"^local K = \{(.*?)^\}", source, re.S | re.M)
    assert body, "no `local K = { ... }` table in lua/lib/00_base.lua"
    text = re.sub(r"--[^\n]*", "", body.group(1))
    entries = re.findall(r"(\w+)\s*=\s*'([^']*)'", text)
    assert len(entries) == text.count("="), "an entry of Lua's K that is not `name = ':suffix'`"
    table = dict(entries)
    assert len(table) == len(entries), "a name twice in Lua's K"
    return table


def lua_sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in sorted(LUA.rglob("*.lua"))}


def test_python_table_is_luas_plus_the_python_only_names():
    lua = lua_k_table()
    assert {name: K[name] for name in lua if name in K} == lua
    assert set(K) - set(lua) == PYTHON_ONLY


def test_every_suffix_the_functions_use_is_in_the_table():
    used, literal = set(), set()
    for path, source in lua_sources().items():
        used |= {(path, name) for name in re.findall(r"\bK\.(\w+)", source)}
        # a suffix spelled out after the shard key (e.g. in an error message) must be one of K's
        literal |= {(path, s) for s in re.findall(r"\bP \.\. '(:[a-z_]+:?)", source)}
    assert used, "no K.<name> found: the Lua sources changed shape"
    assert {(p, n) for p, n in used if n not in K} == set()
    assert {(p, s) for p, s in literal if s not in K.values()} == set()


def _python_sources() -> list[Path]:
    skip = {ROOT / "mooncake_redis" / "keys.py"}
    files = [p for d in ("mooncake_redis", "cli", "bench") if (ROOT / d).is_dir() for p in (ROOT / d).rglob("*.py")]
    return [p for p in files if p not in skip]


@pytest.mark.parametrize("suffix", sorted(set(K.values())))
def test_no_other_module_spells_a_suffix(suffix):
    # a string literal or f-string part that starts with the suffix: ":held", b":held", f"{p}:held"
    # (not after "}}", a literal brace: a message spelling out a shard key, "...{{ns:0}}:config")
    pattern = re.compile(r"""(?:["']|(?<!\})\})""" + re.escape(suffix) + r"""(?:["'{:]|$)""", re.M)
    found = [f"{p.relative_to(ROOT)}:{n}" for p in _python_sources()
             for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert found == [], f"{suffix!r} spelled outside mooncake_redis/keys.py (use ShardKeys)"


def test_shard_keys_build_the_documented_names():
    k = ShardKeys("mc", 3)
    assert k.P == shard_key("mc", 3).encode() == b"mc:{mc:3}"
    assert (k.config, k.worker, k.metrics) == (b"mc:{mc:3}:config", b"mc:{mc:3}:worker", b"mc:{mc:3}:metrics")
    assert k.tiers == (b"mc:{mc:3}:evict:ordinary", b"mc:{mc:3}:evict:soft", b"mc:{mc:3}:evict:retained",
                       b"mc:{mc:3}:evict:soft_retained")
    assert k.segment(b"s\xff") == b"mc:{mc:3}:seg:s\xff"
    assert k.free("s") == (b"mc:{mc:3}:free:s:by_off", b"mc:{mc:3}:free:s:by_size")
    assert k.object("t", b"a:b") == object_key("mc", 3, "t", b"a:b") == b"mc:{mc:3}:obj:t:a:b"
    assert k.group("t", "g") == b"mc:{mc:3}:grp:t:g"
    assert k.group_members(b"t", b"g") == b"mc:{mc:3}:grpm:t:g"
    assert k.aggregate("soft_pin", "g:t:g") == b"mc:{mc:3}:agg:soft_pin:g:t:g"
    assert k.prefix("object") == b"mc:{mc:3}:obj:"


def test_every_name_has_a_builder_and_every_key_carries_the_hash_tag():
    k = ShardKeys("ns", 12)
    parts = {"free_by_off", "free_by_size"}  # parts of free(segment)
    fixed = [name for name in K if isinstance(getattr(k, name, None), bytes)]
    methods = [name for name in K if callable(getattr(k, name, None))]
    assert set(fixed) | set(methods) | parts == set(K)
    built = [getattr(k, name) for name in fixed]
    for name in methods:
        builder = getattr(k, name)
        key = builder(*["x"] * len(inspect.signature(builder).parameters))
        built += list(key) if isinstance(key, tuple) else [key]  # free: (by_off, by_size)
    assert all(key.startswith(b"ns:{ns:12}:") for key in built)
