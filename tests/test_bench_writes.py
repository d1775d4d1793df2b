"""bench/writes.py: the write-path figures (instructions of put_start, put_end and remove, and per
unit evicted, with the radix index off and on, under callgrind, skipped without valgrind). No figure is asserted beyond
relations that must hold."""
from __future__ import annotations

import pytest
from test_bench_instructions import _valgrind_usable

from mooncake_redis.bench import instructions as bench_instructions
from mooncake_redis.bench import writes

WRITES = ["put_start", "put_end", "remove", "batch put_start", "batch put_end", "batch remove", "evict"]


@pytest.mark.slow
@pytest.mark.skipif(not _valgrind_usable(), reason=f"valgrind is not installed: {bench_instructions.INSTALL}")
@pytest.mark.parametrize("radix", [False, True])
def test_writes_count_every_call_and_a_chained_put_registers_its_node(radix):
    lines: list[str] = []
    got = writes.instructions(n=16, radix=radix, out=lines.append)
    assert list(got) == WRITES and f"radix index {'on' if radix else 'off'}" in lines[0]
    for name, fig in got.items():
        assert fig["instructions"] > 0 and fig["redis_calls"] > 0, name
        assert any(line.strip().startswith(name + " ") for line in lines[1:]), name
    # with the index, a put of a page names its node: the node's record takes it as a field (no
    # set: schema 7), and a remove of the node's last key deletes the record with it (no HDEL)
    commands = got["put_start"]["commands"]
    # (a new node's record and its first key in one HSET, beside the object's)
    assert commands.get("sadd", 0) == 0 and commands["hset"] == (2 if radix else 1), commands
    if radix:
        assert got["remove"]["commands"].get("hdel", 0) == 0 and "srem" not in got["remove"]["commands"]
    # a batch writes the shard counters once a call, not once a key (Ledger.with_ledger, lua/lib/05_ledger.lua)
    for name in ("batch put_start", "batch remove"):
        assert got[name]["commands"].get("zincrby", 0) < got[name.split()[1]]["commands"]["zincrby"], name
    # eviction takes whole units: an object's hash each (HGETALL), a node's keys with it (HSCAN of its record)
    assert got["evict"]["commands"].get("hgetall", 0) >= 1, got["evict"]["commands"]
    assert (got["evict"]["commands"].get("hscan", 0) > 0) == radix, got["evict"]["commands"]
