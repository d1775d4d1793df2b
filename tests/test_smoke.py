from mooncake_redis import ErrorCode, MasterError
import pytest


def test_put_read_remove_roundtrip(master):
    master.mount_segment("seg-a", 1 << 20, "client-1")
    replicas = master.put_start("client-1", "k1", 4096)
    assert len(replicas) == 1 and replicas[0].size == 4096
    with pytest.raises(MasterError) as e:
        master.get_replica_list("k1")
    assert e.value.code == ErrorCode.REPLICA_IS_NOT_READY
    master.put_end("client-1", "k1")
    got = master.get_replica_list("k1")
    assert got.replicas[0].offset == replicas[0].offset
    assert got.lease_ttl_ms == master.config.default_kv_lease_ttl
    master.advance_clock(master.config.default_kv_lease_ttl)
    master.remove("k1")
    assert master.usage().used_bytes == 0
    assert not master.exist_key("k1")
