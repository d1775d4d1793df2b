"""Objects referenced by a replication/offload task are protected like hard-pinned ones."""
import pytest

from mooncake_redis import ErrorCode, MasterError, ReplicateConfig
from mooncake_redis.fsck import fsck

from helpers import WATERMARKS

MASTER_CONFIG = WATERMARKS  # new_master's defaults in this module (conftest)
KIB = 1024


def fill(m, keys, config=None):
    m.batch_put_start("client-1", keys, [KIB] * len(keys), config)
    m.batch_put_end("client-1", keys)


def present(m, key):
    try:
        m.describe(key)
        return True
    except MasterError:
        return False


def test_referenced_object_survives_pressure_and_blocks_remove(new_master):
    m = new_master(shards=1, evict_on_put=False)
    m.mount_segment("seg-a", 10 * KIB, "client-1")
    keys = [f"k{i}" for i in range(10)]
    fill(m, keys)
    assert m.add_task_ref("k0") == 1 and m.add_task_ref("k0") == 2
    with pytest.raises(MasterError) as e:
        m.remove("k0")
    assert e.value.code == ErrorCode.OBJECT_HAS_REPLICATION_TASK
    m.run_eviction()
    assert present(m, "k0") and not present(m, "k1")  # k0 is oldest, but the task holds it
    assert fsck(m).ok
    assert m.release_task_ref("k0") == 1 and m.release_task_ref("k0") == 0
    with pytest.raises(MasterError) as e:
        m.release_task_ref("k0")
    assert e.value.code == ErrorCode.INVALID_PARAMS
    m.advance_clock(1)
    m.put_start("client-1", "big", 2 * KIB)  # pressure again: now k0 is the oldest candidate
    m.put_end("client-1", "big")
    m.run_eviction()
    assert not present(m, "k0")
    assert fsck(m).ok


def test_a_referenced_member_keeps_its_group(new_master):
    m = new_master(evict_on_put=False)
    m.mount_segment("seg-a", 10 * KIB * m.shards, "client-1")
    group = [f"{{g}}/{i}" for i in range(3)]
    fill(m, group, ReplicateConfig(group_id="g"))  # the oldest unit
    m.advance_clock(1)
    others = [f"{{g}}x{i}" for i in range(7)]  # same shard as the group
    fill(m, others)
    m.add_task_ref(group[1])
    m.run_eviction()
    assert all(present(m, k) for k in group)
    assert not present(m, others[0])
    assert fsck(m).ok
    m.release_task_ref(group[1])
    m.advance_clock(1)
    m.put_start("client-1", "{g}big", 2 * KIB)
    m.put_end("client-1", "{g}big")
    m.run_eviction()
    assert not any(present(m, k) for k in group)  # the whole group went, together
    assert fsck(m).ok


def test_only_complete_objects_take_references(master):
    master.mount_segment("seg-a", 1 << 20, "client-1")
    master.put_start("client-1", "k", KIB)
    for key, code in (("k", ErrorCode.REPLICA_IS_NOT_READY), ("nope", ErrorCode.OBJECT_NOT_FOUND)):
        with pytest.raises(MasterError) as e:
            master.add_task_ref(key)
        assert e.value.code == code
