"""bench/layout.py: exist_key's floor by object layout under callgrind (skipped without valgrind).
No figure is asserted beyond relations that must hold: the calls each layout makes."""
from __future__ import annotations

import pytest
from test_bench_instructions import _valgrind_usable

from mooncake_redis.bench import instructions as bench_instructions
from mooncake_redis.bench import layout


@pytest.mark.slow
@pytest.mark.skipif(not _valgrind_usable(), reason=f"valgrind is not installed: {bench_instructions.INSTALL}")
def test_the_layouts_make_the_calls_they_describe():
    lines: list[str] = []
    got = layout.probe(n=100, out=lines.append)
    assert list(got) == ["objects", "shard_hash", "no_lease"] and len(lines) == 4
    for name, figures in got.items():
        assert figures["x1"]["instructions"] > 0 and figures["x100"]["instructions"] > 0, name
    # a call of one key: config, clock, the read, the lease (none without the lease write)
    assert [got[n]["x1"]["redis_calls"] for n in got] == [4, 4, 3]
    # a call of 100 keys: one read a key with a hash per object, one read a call with a hash per shard
    assert got["objects"]["x100"]["redis_calls"] == pytest.approx(1.03)
    assert got["shard_hash"]["x100"]["redis_calls"] == pytest.approx(0.04)
    assert got["no_lease"]["x100"]["redis_calls"] == pytest.approx(0.03)
