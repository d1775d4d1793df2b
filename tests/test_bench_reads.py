"""bench/reads.py: the read-path figures (instructions with the radix index off and on, under
callgrind, skipped without valgrind; memory per object). No figure is asserted beyond relations
that must hold."""
from __future__ import annotations

import pytest
from test_bench_instructions import _valgrind_usable

from mooncake_redis.bench import instructions as bench_instructions
from mooncake_redis.bench import reads

READS = ["exist_key", "get_replica_list", "batch_exist_key", "batch_get_replica_list"]


@pytest.mark.slow
@pytest.mark.skipif(not _valgrind_usable(), reason=f"valgrind is not installed: {bench_instructions.INSTALL}")
def test_reads_counts_every_read_with_the_radix_index_on_and_its_node_calls():
    lines: list[str] = []
    got = reads.instructions(n=8, radix=True, out=lines.append)
    assert list(got) == READS and "radix index on" in lines[0]
    for name, fig in got.items():
        assert fig["instructions"] > 0, name
        # every read of a radix key takes its object's fields and its node's record
        assert fig["commands"].get("hmget", 0) >= 2, (name, fig["commands"])
        assert any(line.split()[0] == name for line in lines[1:]), name
    # a batch shares its config read, clock and re-scores: fewer instructions per key than one call
    assert got["batch_exist_key"]["instructions"] < got["exist_key"]["instructions"]


@pytest.mark.slow
@pytest.mark.skipif(not _valgrind_usable(), reason=f"valgrind is not installed: {bench_instructions.INSTALL}")
def test_a_batch_reads_the_record_of_a_node_once_for_all_its_keys():
    """Two keys a node (a page's k and v): a batch takes each node's record once, so per key it
    makes the object's HMGET and half a node's; a call of one key reads both."""
    lines: list[str] = []
    got = reads.instructions(n=8, radix=True, out=lines.append, keys_per_node=2)
    assert "2 keys a node" in lines[0]
    for name in ("batch_exist_key", "batch_get_replica_list"):
        assert 1.4 < got[name]["commands"]["hmget"] < 1.6, (name, got[name]["commands"])
    assert got["exist_key"]["commands"]["hmget"] >= 3  # config, the object, its node
    with pytest.raises(ValueError):
        reads.instructions(n=8, radix=True, keys_per_node=0)


def test_memory_per_object_is_the_used_memory_a_stored_object_adds():
    lines: list[str] = []
    got = reads.memory(objects=10_000, out=lines.append)  # fewer: allocator noise dominates
    per, families = got["per_object"], got["families"]
    # an object is at least its hash (key and fields) and its tier entry, and far from a kilobyte
    assert 100 < per < 1000, per
    assert lines[0] == (f"memory per complete object (10,000 objects of one replica, shards=1, radix index off; "
                        f"used_memory delta): {per:.1f} B")
    assert families["obj"] > 50 and families["evict"] > 20, families
    assert not any(f.startswith("r") for f in families if families[f] > 1), families  # no radix keys
    # MEMORY USAGE estimates (and leaves out the keyspace's own table): near used_memory's delta
    assert 0.5 * per < sum(families.values()) < 1.5 * per, (per, families)
    assert lines[1].startswith("  MEMORY USAGE per object, by key family: obj ")


def test_memory_with_the_radix_index_counts_its_keys():
    """used_memory deltas of 2,000 objects are noisy (tens of bytes an object); MEMORY USAGE of
    the keys is not: the comparisons go by it."""
    lines: list[str] = []

    def total(got: dict) -> float:
        return sum(got["families"].values())

    off = reads.memory(objects=2_000, out=lines.append)
    on = reads.memory(objects=2_000, out=lines.append, radix=True, keys_per_node=2)
    assert "radix index on, 2 key(s) a node, chains of 8" in lines[2]
    assert total(on) > total(off)
    assert {"rnode", "rkids"} <= set(on["families"]), on["families"]
    assert "rkeys" not in on["families"]  # a node's keys are fields of its record (schema 7)
    assert "rnodes" not in on["families"]  # no index of a shard's nodes (schema 9)
    tagged = "tag_model_{hash}_{i}_k"
    long_off = reads.memory(objects=2_000, out=lines.append, key_format=tagged)
    long_on = reads.memory(objects=2_000, out=lines.append, radix=True, keys_per_node=2, key_format=tagged)
    # each figure is a line, then its families' line
    assert lines[-4].endswith(f"radix index off, keys {tagged}; used_memory delta): {long_off['per_object']:.1f} B")
    assert f"chains of 8, keys {tagged};" in lines[-2]
    assert long_off["families"]["obj"] > off["families"]["obj"]  # longer keys
    assert total(long_on) > total(long_off)
