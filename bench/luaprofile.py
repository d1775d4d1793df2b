"""Where a function's own Lua goes: the Lua VM instructions (bytecodes) the library runs per key
of a workload, by function and by line of lua/, beside `bench instructions` (whose callgrind
figures are the server's whole cost: the bytecodes, the redis.calls and the C they run).

The library runs on fakeredis's Lua 5.1 (lupa), the interpreter Valkey and Redis embed, with a
count hook on every instruction while the timed calls run; the counts are machine-independent
and, as the library's code paths depend only on the replies, those of the real servers. A
redis.call counts as the instructions around it (its command runs in Python here). One shard,
objects of 64 KiB with one replica in one segment, n keys in calls of `batch` keys (with the
radix index: `<hash64>_0`, each page's parent the page before it, in chains of 8):

    put        batch_put_start            put_end   batch_put_end (of keys put before)
    remove     batch_remove (of complete keys)      exist  batch_exist_key   get  batch_get_replica_list
    evict      eviction steps (mc_evict, 64 units a step) of complete, unleased keys down to the target

    python -m mooncake_redis.bench.luaprofile [put|put_end|remove|exist|get|evict] [--radix]
        [--n 512] [--batch 32] [--top 20]
"""
from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path
from typing import Any, Callable

from mooncake_redis import Master, MasterConfig
from mooncake_redis.library import library, lua_dir
from mooncake_redis.transport import client as transport_client

WORKLOADS = ("put", "put_end", "remove", "exist", "get", "evict")
OBJECT_SIZE, CLIENT, SEGMENT, CHAIN = 65536, "bench", "bench/seg0", 8
STORE = "luaprofile"

# Counts each instruction's (chunk line) while on; the library is one chunk, so a line is one of lua/.
_HOOK = """
local counts, getinfo = {}, debug.getinfo
local function on() debug.sethook(function() local i = getinfo(2, 'l'); if i then
  local l = i.currentline; counts[l] = (counts[l] or 0) + 1 end end, '', 1) end
local function off() debug.sethook() end
local function take() local c = counts; counts = {}; return c end
return on, off, take
"""


def _keys(n: int, radix: bool) -> tuple[list[str], list[str | None]]:
    keys: list[str] = []
    parents: list[str | None] = []
    for i in range(n):
        if radix:
            h = f"p{i:063x}"
            parents.append(keys[-1][:-2] if i % CHAIN else None)
            keys.append(h + "_0")
        else:
            parents.append(None)
            keys.append(f"p-{i:06d}")
    return keys, parents


def _functions(lua: Path) -> dict[str, list[tuple[int, str]]]:
    """Per lua/ file, the lines that open a function and its name, in order."""
    opening = re.compile(r"(?:local function ([\w.]+)|([\w.]+) = function|^function ([\w.:]+)|"
                         r"register\('(\w+)'|callback = (function))")
    out: dict[str, list[tuple[int, str]]] = {}
    for path in sorted(lua.rglob("*.lua")):
        rel = f"lua/{path.relative_to(lua)}"
        rows = []
        for n, line in enumerate(path.read_text().splitlines(), 1):
            m = opening.search(line)
            if m:
                rows.append((n, next(g for g in m.groups() if g)))
        out[rel] = rows
    return out


def profile(workload: str = "put", n: int = 512, batch: int = 32, radix: bool = False) -> dict[str, Any]:
    """Run `workload` over n keys with the count hook on: {"per_key": instructions a key,
    "lines": {"lua/<file>:<line>": count}, "functions": {"lua/<file>:<line> <name>": count}}."""
    if workload not in WORKLOADS:
        raise ValueError(f"workload must be one of {', '.join(WORKLOADS)}")
    transport_client._memory_servers.pop(STORE, None)  # a fresh store every run
    config = MasterConfig(namespace="luaprof", shards=1, enable_radix_tree=radix,
                          eviction_high_watermark_ratio=0.5, eviction_ratio=0.25)
    m = Master.connect(f"memory://{STORE}", config)
    try:
        m.freeze_clock(1_800_000_000_000)
        m.mount_segment(SEGMENT, n * OBJECT_SIZE, CLIENT)
        keys, parents = _keys(n, radix)
        parts = [(keys[i:i + batch], parents[i:i + batch]) for i in range(0, n, batch)]
        run = _workload(m, workload, parts, radix)
        runtime = transport_client._memory_servers[STORE]._lua_functions.runtime
        on, off, take = runtime.execute(_HOOK)
        on()
        try:
            run()
        finally:
            off()
        counts = {int(line): int(c) for line, c in take().items()}
    finally:
        m.close()
        transport_client._memory_servers.pop(STORE, None)
    return _attribute(counts, n)


def _workload(m: Master, workload: str, parts, radix: bool) -> Callable[[], None]:
    def put() -> None:
        for ks, ps in parts:
            got = m.batch_put_start(CLIENT, ks, [OBJECT_SIZE] * len(ks), None, "default", ps if radix else None)
            if any(not isinstance(x, list) for x in got):
                raise RuntimeError(f"batch_put_start refused a key: {got}")

    def put_end() -> None:
        for ks, _ in parts:
            m.batch_put_end(CLIENT, ks)

    def remove() -> None:
        for ks, _ in reversed(parts):
            m.batch_remove(ks[::-1])

    def evict() -> None:
        while m.evict_step(0, 64).state == "more":
            pass
    if workload == "put":
        return put
    put()
    if workload == "put_end":
        return put_end
    put_end()
    def exist() -> None:
        for ks, _ in parts:
            m.batch_exist_key(ks)

    def get() -> None:
        for ks, _ in parts:
            m.batch_get_replica_list(ks)
    m.advance_clock(10 * m.config.default_kv_lease_ttl)  # nothing leased: every unit evictable
    return {"remove": remove, "evict": evict, "exist": exist, "get": get}[workload]


def _attribute(counts: dict[int, int], n: int) -> dict[str, Any]:
    lib, funcs = library(), _functions(lua_dir())
    lines: collections.Counter[str] = collections.Counter()
    functions: collections.Counter[str] = collections.Counter()
    for line, c in counts.items():
        where = lib.locate(line)
        if where is None:
            lines["(the library's assembly)"] += c
            functions["(the library's assembly)"] += c
            continue
        lines[where] += c
        path, at = where.rsplit(":", 1)
        opening = [row for row in funcs.get(path, []) if row[0] <= int(at)]
        functions[f"{path}:{opening[-1][0]} {opening[-1][1]}" if opening else path] += c
    total = sum(counts.values())
    return {"per_key": total / n, "total": total, "lines": dict(lines), "functions": dict(functions)}


def main(argv: list[str] | None = None, out: Callable[[str], None] = print) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload", nargs="?", default="put", choices=WORKLOADS)
    p.add_argument("--radix", action="store_true", help="with the radix index on")
    p.add_argument("--n", type=int, default=512, help="keys (default 512)")
    p.add_argument("--batch", type=int, default=32, help="keys a call (default 32)")
    p.add_argument("--top", type=int, default=20, help="rows of each table (default 20)")
    a = p.parse_args(argv)
    got = profile(a.workload, a.n, a.batch, a.radix)
    out(f"{a.workload}, radix index {'on' if a.radix else 'off'}: n={a.n} keys in calls of {a.batch}: "
        f"{got['per_key']:,.0f} Lua VM instructions a key")
    for title, table in (("by function (its own lines)", got["functions"]), ("by line", got["lines"])):
        out(f"  {title}:")
        for where, c in collections.Counter(table).most_common(a.top):
            out(f"    {c / a.n:9,.1f}  {where}")
    return got


if __name__ == "__main__":
    main()
