"""A full Redis (maxmemory reached, noeviction) still serves reads and frees itself: the
functions that only free memory or rewrite values already there run at OOM (Base.FREES, the
allow-oom flag), so reads, remove, eviction (a worker pass) and unmount work while every put is
refused, on Valkey and on Redis 7."""
from __future__ import annotations

import pytest

from mooncake_redis import ErrorCode, Master, MasterConfig, MasterError
from mooncake_redis.server import EmbeddedValkey
from mooncake_redis.worker import Worker

from helpers import OWNER, WRITER

T0 = 1_700_000_000_000
OBJECT = 1024


@pytest.fixture(params=["valkey", "redis"])
def full_store(request):
    binary = None if request.param == "valkey" else request.getfixturevalue("redis7").binary
    server = EmbeddedValkey(appendonly=False, binary=binary).start()
    master = Master.connect(server.url, MasterConfig(shards=1))
    master.freeze_clock(T0)
    master.mount_segment("seg", 1000 * OBJECT, OWNER)
    keys = [f"k{i:04d}" for i in range(995)]  # 99.5% of the segment: above the high watermark
    for start in range(0, len(keys), 100):
        chunk = keys[start:start + 100]
        assert all(isinstance(r, list) for r in master.batch_put_start(WRITER, chunk, [OBJECT] * len(chunk)))
        assert master.batch_put_end(WRITER, chunk) == [ErrorCode.OK] * len(chunk)
    used = int(master.redis.info("memory")["used_memory"])
    master.redis.config_set("maxmemory", used - (1 << 20))  # past it: noeviction refuses writes
    yield master, keys
    master.redis.config_set("maxmemory", 0)
    master.close()
    server.stop()


def test_a_full_redis_refuses_puts_and_still_frees_itself(full_store):
    master, keys = full_store
    with pytest.raises(MasterError) as refused:
        master.put_start(WRITER, "new", OBJECT)
    assert "maxmemory" in str(refused.value)
    assert master.exist_key(keys[1]) and master.get_replica_list(keys[1]).replicas  # reads are served
    master.remove(keys[0])  # remove runs at OOM
    assert not master.exist_key(keys[0])
    before = master.usage().objects
    done = Worker(master).run_once()  # claim, sweeps, eviction: all at OOM
    assert done.evicted_objects > 0 and master.usage().objects == before - done.evicted_objects
    assert master.unmount_segment("seg", OWNER) >= 0  # and unmount, with its sweep
    assert master.usage().objects == 0 and master.segments() == []


FREES = {"mc_remove", "mc_put_revoke", "mc_evict", "mc_unmount_segment", "mc_finish_drain", "mc_unmount_local_disk", "mc_sweep_replicas",
         "mc_sweep_done", "mc_discard_puts", "mc_expire_clients", "mc_offload_sweep", "mc_claim", "mc_release_claim",
         "mc_radix_apply", "mc_radix_ack", "mc_gw_reap", "mc_gw_segment_forget", "mc_gw_metadata_delete",
         "mc_exist_key", "mc_get_replica_list", "mc_ping"}


def test_exactly_the_freeing_functions_run_at_oom(valkey):
    master = Master.connect(valkey.url, MasterConfig(namespace="oomflags"))
    try:
        [library] = master.redis.execute_command("FUNCTION", "LIST", "LIBRARYNAME", "mooncake")
        flags = {f[b"name"].decode(): {x.decode() for x in f[b"flags"]} for f in library[b"functions"]}
        assert {name for name, f in flags.items() if "allow-oom" in f} == FREES  # as the function contract lists them
    finally:
        master.close()
