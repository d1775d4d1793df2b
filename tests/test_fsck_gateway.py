"""fsck of the Mooncake gateway's segment records on shard 0 (P:gwseg:<segment>, P:gwsegids,
P:gwsegs): a store with gateway segments audits clean; each corruption, made with plain Redis
commands, is reported and fsck(repair=True) leaves a clean audit (mc_fsck_gateway); two records
claiming one uuid are reported, never guessed at; mc_fsck_gateway refuses bad arguments."""
from __future__ import annotations

import pytest

from mooncake_redis import ErrorCode
from mooncake_redis.fsck import KINDS, fsck
from mooncake_redis.gateway.store import GatewayStore, SegmentFacts

from helpers import raises_code, shard_keys, store_snapshot

UUID_A = "0f2fcc18-0000-4000-8000-00000000000a"
UUID_B = "0f2fcc18-0000-4000-8000-00000000000b"
CLIENT = "5a6b7c8d-0000-4000-8000-00000000000c"
SIZE = 1 << 20


def facts(name: str, uuid: str, base: int) -> SegmentFacts:
    return SegmentFacts(name, uuid, CLIENT, name, "tcp", base, SIZE)


@pytest.fixture
def gw(master):
    """Two segments mounted through a gateway (recorded), a few objects on them."""
    m = master
    store = GatewayStore(m)
    for name, uuid, base in (("10.0.0.1:1", UUID_A, 1 << 40), ("10.0.0.2:2", UUID_B, 1 << 41)):
        m.mount_segment(name, SIZE, CLIENT, base=base)
        store.record_segment(facts(name, uuid, base))
    for i in range(8):
        m.put_start(CLIENT, f"k{i}", 4096)
        m.put_end(CLIENT, f"k{i}")
    return m


def kinds(report) -> set[str]:
    return {f.kind for f in report.findings}


def assert_clean(m) -> None:
    report = fsck(m)
    assert report.ok, report.summary()


def test_a_store_with_gateway_segments_audits_clean(gw):
    assert_clean(gw)


def corrupt_missing_id(r, k):
    r.hdel(k.gw_segment_ids, UUID_A)


def corrupt_id_names_another(r, k):
    r.hset(k.gw_segment_ids, UUID_A, "10.0.0.2:2")


def corrupt_stale_id(r, k):
    r.hset(k.gw_segment_ids, "0f2fcc18-dead", "10.0.0.9:9")


def corrupt_record_uuid(r, k):
    r.hset(k.gw_segment("10.0.0.1:1"), "uuid", "0f2fcc18-new")


def corrupt_unlisted(r, k):
    r.zrem(k.gw_segments, "10.0.0.1:1")


def corrupt_stale_listing(r, k):
    r.zadd(k.gw_segments, {"10.0.0.9:9": 5})


CORRUPTIONS = [
    (corrupt_missing_id, {"gateway_segment_id"}),
    (corrupt_id_names_another, {"gateway_segment_id", "gateway_stale_id"}),
    (corrupt_stale_id, {"gateway_stale_id"}),
    (corrupt_record_uuid, {"gateway_segment_id", "gateway_stale_id"}),
    (corrupt_unlisted, {"gateway_segment_unlisted"}),
    (corrupt_stale_listing, {"gateway_stale_listing"}),
]


@pytest.mark.parametrize("corrupt,want", CORRUPTIONS, ids=[c.__name__[len("corrupt_"):] for c, _ in CORRUPTIONS])
def test_each_drift_is_found_and_repaired(gw, corrupt, want):
    m = gw
    k = shard_keys(m, 0)
    corrupt(m.redis, k)
    report = fsck(m)
    assert kinds(report) == want, report.summary()
    assert all(f.shard == 0 and f.repairable and KINDS[f.kind].severity == "error" for f in report.findings)
    fixed = fsck(m, repair=True)
    assert kinds(fixed) == want and all(f.repaired for f in fixed.findings), fixed.summary()
    assert_clean(m)
    store = GatewayStore(m)
    assert store.segment_name(UUID_B) == "10.0.0.2:2"  # the other record is untouched
    name = store.segment_name(UUID_A) or store.segment_name("0f2fcc18-new")
    assert name == "10.0.0.1:1"


def test_a_recorded_segment_not_mounted_is_a_warning_reap_agrees(gw):
    m = gw
    store = GatewayStore(m)
    store.record_segment(facts("10.0.0.3:3", "0f2fcc18-0000-4000-8000-000000000003", 1 << 42))  # never mounted
    report = fsck(m)
    assert [(f.kind, f.severity, f.subject) for f in report.findings] == [
        ("gateway_segment_unmounted", "warning", "segment 10.0.0.3:3")]
    assert "mc_gw_reap" in report.findings[0].note
    assert store.reap() == 1              # the worker's rule says the same
    assert_clean(m)
    # fsck's repair does what the reaper does: the record goes, with its metadata
    store.record_segment(facts("10.0.0.4:4", "0f2fcc18-0000-4000-8000-000000000004", 1 << 43))
    store.metadata_put(b"mooncake/ram/10.0.0.4:4", b"{}")
    fixed = fsck(m, repair=True)
    assert kinds(fixed) == {"gateway_segment_unmounted"} and all(f.repaired for f in fixed.findings), fixed.summary()
    assert store.segment_facts("10.0.0.4:4") is None and store.metadata_get(b"mooncake/ram/10.0.0.4:4") is None
    assert store.segment_name(UUID_A) == "10.0.0.1:1"  # mounted ones stay
    assert_clean(m)


def test_two_records_with_one_uuid_are_reported_not_guessed(gw):
    m = gw
    k = shard_keys(m, 0)
    m.redis.hset(k.gw_segment("10.0.0.2:2"), "uuid", UUID_A)  # B's record now claims A's uuid
    report = fsck(m, repair=True)
    assert kinds(report) == {"gateway_segment_id", "gateway_stale_id"}, report.summary()
    claim = next(f for f in report.findings if f.kind == "gateway_segment_id")
    assert not claim.repaired and "same uuid" in claim.note
    assert GatewayStore(m).segment_name(UUID_A) == "10.0.0.1:1"  # A keeps its entry
    m.redis.hset(k.gw_segment("10.0.0.2:2"), "uuid", UUID_B)  # the operator's fix
    fsck(m, repair=True)
    assert_clean(m)


def test_a_record_that_is_not_a_hash_is_reported(gw):
    m = gw
    key = shard_keys(m, 0).gw_segment("10.0.0.9:9")
    m.redis.set(key, "x")
    report = fsck(m, repair=True)
    assert [f.kind for f in report.findings] == ["gateway_bad_record"] and not report.findings[0].repairable
    m.redis.delete(key)
    assert_clean(m)


@pytest.mark.parametrize("argv", [[], ["segment"], ["segment", ""], ["segment", "a", "b"], ["uuid", "x" * 65],
                                  ["reap", ""], ["unmounted"], ["unmounted", *["n"] * 257], ["unmounted", ""],
                                  ["other", "a"]])
def test_mc_fsck_gateway_refuses_bad_arguments(gw, argv):
    m = gw
    before = store_snapshot(m)
    with raises_code(ErrorCode.INVALID_PARAMS):
        m.transport.call("mc_fsck_gateway", 0, *argv)
    assert store_snapshot(m) == before
