"""fsck: a store built by a mix of operations audits clean; each derived structure, corrupted by
hand with plain Redis commands, is found; fsck(repair=True) fixes what it can (overlapping
allocations are reported, never auto-fixed) and a second fsck is clean."""
from __future__ import annotations

import pytest

from mooncake_redis import MasterError
from mooncake_redis.config import ReplicateConfig, SoftPinAction
from mooncake_redis import fsck as fsck_module
from mooncake_redis.fsck import KINDS, _Audit, fsck
from mooncake_redis.layout import stored_status

from helpers import T0, all_shard_keys, keys_of, replicas_in, reps_value, shard_keys, watched_silence

pytestmark = pytest.mark.cluster  # these API tests run on the test cluster too (conftest)

SEG = 1 << 18  # 256 KiB per segment (split across the shards)
SOFT = ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=5_000)
LONG_SOFT = ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=3_600_000)
HARD = ReplicateConfig(with_hard_pin=True)


def populate(m) -> None:
    """Puts, ends, reads, removes, a revoke, groups, soft/hard pins, a preempted put (held
    extent), eviction, expired-but-unswept soft pins, and an unmount with its sweep."""
    m.mount_segment("seg-a", SEG, "client-1")
    m.mount_segment("seg-b", SEG, "client-1", base=1 << 30)
    two = ReplicateConfig(replica_num=2)
    for i in range(16):
        m.put_start("client-1", f"obj-{i}", 4096, two)
        m.put_end("client-1", f"obj-{i}")
    for i in range(0, 16, 3):
        m.get_replica_list(f"obj-{i}")
    m.remove("obj-1")
    m.remove("obj-3", force=True)                                     # leased, forced
    # an abandoned put preempted by a new one: its extent is held until the release deadline
    m.put_start("client-1", "abandoned", 3000)
    m.advance_clock(m.config.put_start_discard_timeout + 1)
    m.put_start("client-1", "abandoned", 3000)
    m.put_end("client-1", "abandoned")
    assert m.run_eviction().evicted_objects > 0
    for i in range(4):
        m.put_start("client-1", f"processing-{i}", 2048)              # never ended
        m.put_start("client-1", f"soft-{i}", 1024, SOFT)
        m.put_end("client-1", f"soft-{i}")
        m.put_start("client-1", f"longsoft-{i}", 1024, LONG_SOFT)
        m.put_end("client-1", f"longsoft-{i}")
        m.put_start("client-1", f"hard-{i}", 1024, HARD)
        m.put_end("client-1", f"hard-{i}")
    m.put_start("client-1", "revoked", 512)
    m.put_revoke("client-1", "revoked")
    # groups: complete members, a member in progress, a hard-pinned member, one retired group
    for g, n in (("g1", 4), ("g2", 3), ("g3", 2), ("g4", 2)):
        for i in range(n):
            cfg = ReplicateConfig(group_id=g, with_hard_pin=(g == "g3" and i == 0),
                                  soft_pin_action=SoftPinAction.ENABLE if g == "g2" else SoftPinAction.PRESERVE)
            m.put_start("client-1", f"{{{g}}}m{i}", 1024, cfg)
            if not (g == "g2" and i == 2):
                m.put_end("client-1", f"{{{g}}}m{i}")
    m.get_replica_list("{g1}m0")                                      # leases the whole group
    m.remove("{g1}m3", force=True)                                    # leave_group
    m.remove("{g4}m0")
    m.remove("{g4}m1")                                                # last member: retire_group
    for i in range(6):
        m.put_start("client-1", f"late-{i}", 2048)
        m.put_end("client-1", f"late-{i}")
    m.get_replica_list("late-0")
    m.advance_clock(6_000)  # soft-* pins expire; their units wait in the soft tier for the sweep
    # objects on a segment that goes away: the unmount sweep deletes the ones left with no replica
    m.mount_segment("seg-c", SEG, "client-2", base=1 << 31)
    for i in range(4):
        m.put_start("client-1", f"only-c-{i}", 512, ReplicateConfig(preferred_segments=("seg-c",)))
        m.put_end("client-1", f"only-c-{i}")
    m.put_start("client-1", "on-b-and-c", 512, ReplicateConfig(replica_num=2, preferred_segments=("seg-c", "seg-b")))
    m.put_end("client-1", "on-b-and-c")
    assert m.unmount_segment("seg-c", "client-2") == 4
    # remount (a new mount id), then unmount without the sweep and mount again: the object keeps
    # a dead replica field on seg-c next to its live one on seg-b
    m.mount_segment("seg-c", SEG, "client-2", base=1 << 31)
    m.put_start("client-1", "b-and-c-again", 512, ReplicateConfig(replica_num=2, preferred_segments=("seg-c", "seg-b")))
    m.put_end("client-1", "b-and-c-again")
    for p in all_shard_keys(m):
        m.redis.execute_command("FCALL", "mc_unmount_segment", 1, p.P, 2, "name", "seg-c", "client_id", "client-2")
    m.mount_segment("seg-c", SEG, "client-2", base=1 << 31)
    assert [r.segment for r in m.describe("b-and-c-again").replicas] == ["seg-b"]
    assert [r.segment for r in m.describe("b-and-c-again").dead_replicas] == ["seg-c"]


@pytest.fixture
def store(new_master):
    m = new_master(eviction_high_watermark_ratio=0.05, eviction_ratio=0.02)
    populate(m)
    return m


# ---- helpers -------------------------------------------------------------------------------
def objects(m):
    """(shard, key, fields) of every object of tenant "default", with its status (a complete
    object stores none: layout.stored_status)."""
    out = []
    for shard in range(m.shards):
        prefix = shard_keys(m, shard).object("default", "")
        for k in m.redis.scan_iter(match=prefix + b"*"):
            raw = m.redis.hgetall(k)
            h = {f.decode(): v.decode() for f, v in raw.items()} | {"status": stored_status(raw).decode()}
            out.append((shard, k[len(prefix):].decode(), h))
    return sorted(out, key=lambda t: t[1])


def pick(m, pred):
    for shard, key, h in objects(m):
        if pred(key, h):
            return shard, key, h
    raise AssertionError("no object fits")


def ordinary_unit(m):
    """An ungrouped, complete, unpinned object that sits in a tier."""
    def fits(key, h):
        unit = f"o:default:{key}"
        p = keys_of(m, key)
        return (h["status"] == "complete" and h.get("hard_pin", "0") == "0" and "group" not in h
                and m.redis.zscore(p.tier_ordinary, unit) is not None)
    return pick(m, fits)


def kinds(report):
    return set(report.kinds())


def assert_clean(m):
    report = fsck(m)
    assert report.ok, report.summary()
    assert report.findings == [] and report.unverified == {}
    return report


def repair_and_recheck(m, expect: set[str]):
    found = fsck(m)
    assert expect <= kinds(found), found.summary()
    assert not found.ok
    fixed = fsck(m, repair=True)
    assert expect <= kinds(fixed), fixed.summary()
    assert all(f.repaired for f in fixed.findings), fixed.summary()
    assert len(fixed.repaired) == len(fixed.findings)
    assert_clean(m)
    return fixed


# ---- a clean store -------------------------------------------------------------------------
def test_clean_store_after_mixed_operations(store):
    m = store
    seen = []
    report = fsck(m, progress=seen.append)
    assert report.ok, report.summary()
    n = len(objects(m))
    assert report.objects_checked == n > 25
    assert seen and seen[-1] == n and seen == sorted(seen)
    # the mix really produced the states fsck has to understand
    held = sum(m.redis.zcard(shard_keys(m, s).held) for s in range(m.shards))
    soft = sum(m.redis.zcard(shard_keys(m, s).tier_soft) for s in range(m.shards))
    processing = sum(m.redis.zcard(shard_keys(m, s).processing) for s in range(m.shards))
    assert held == 1 and soft >= 4 and processing == 5
    now = m.now_ms()
    due = sum(m.redis.zcount(shard_keys(m, s).deadline_soft_pin, "-inf", now) for s in range(m.shards))
    assert due >= 1  # expired pins still in the soft tier: not drift
    with pytest.raises(MasterError):
        m.describe("only-c-0")  # swept with seg-c
    # repair on a clean store changes nothing
    before = {k: m.redis.dump(k) for k in m.redis.scan_iter()}
    again = fsck(m, repair=True)
    assert again.ok and again.repaired == []
    assert {k: m.redis.dump(k) for k in m.redis.scan_iter()} == before


def test_clean_after_sweeps_and_full_cleanup(store):
    m = store
    m.advance_clock(m.config.put_start_release_timeout + 60_000)
    for shard in range(m.shards):
        m.evict_step(shard)
    m.put_start("client-1", "after", 100)  # releases the held extent
    assert_clean(m)
    m.advance_clock(m.config.default_kv_lease_ttl)
    for shard, key, h in objects(m):
        if h["status"] == "processing":
            m.put_revoke(h["writer"], key)
    m.remove_all(force=True)
    m.advance_clock(m.config.put_start_release_timeout)
    m.put_start("client-1", "last", 100)
    assert_clean(m)


# ---- corruption: one derived structure at a time ---------------------------------------------
def corrupt_used_bytes(m):
    m.redis.hincrby(shard_keys(m, 0).P, "used_bytes", 4096)
    return {"shard_used_bytes"}


def corrupt_capacity_and_objects(m):
    m.redis.hincrby(shard_keys(m, m.shards - 1).P, "capacity_bytes", -1)
    m.redis.hincrby(shard_keys(m, 0).P, "objects", 3)
    return {"shard_capacity_bytes", "shard_objects"}


def corrupt_tier_entry(m):
    _, key, _ = ordinary_unit(m)
    m.redis.zrem(keys_of(m, key).tier_ordinary, f"o:default:{key}")
    return {"unit_missing"}


def corrupt_bogus_units(m):
    m.redis.zadd(shard_keys(m, 0).tier_ordinary, {"o:default:no-such-object": 5})
    m.redis.zadd(shard_keys(m, 0).tier_soft, {"garbage without a kind": 1})
    m.redis.zadd(shard_keys(m, 0).tier_ordinary, {"g:default:no-such-group": 5})
    _, key, _ = pick(m, lambda k, h: h.get("hard_pin") == "1" and "group" not in h)
    m.redis.zadd(keys_of(m, key).tier_ordinary, {f"o:default:{key}": 1})     # a hard-pinned object
    _, key, _ = pick(m, lambda k, h: h["status"] == "processing" and "group" not in h)
    m.redis.zadd(keys_of(m, key).tier_soft, {f"o:default:{key}": 1})         # a put in progress
    _, key, _ = pick(m, lambda k, h: h.get("group") == "g1")
    m.redis.zadd(keys_of(m, key).tier_ordinary, {f"o:default:{key}": 1})     # a group member's own unit
    return {"stray_unit"}


def corrupt_tier_score(m):
    _, key, h = ordinary_unit(m)
    # the tier's score below the hash's lease (a score above it is a lease a read granted: the
    # tier holds it)
    p, unit = keys_of(m, key), f"o:default:{key}"
    m.redis.hset(p.object("default", key), "lease_until", int(m.redis.zscore(p.tier_ordinary, unit)) + 7)
    return {"unit_score"}


def corrupt_read_mark(m):
    shard, key, h = pick(m, lambda k, h: h.get("special") == "1" and int(h.get("soft_pin_until", 0)) > 0)
    m.redis.hdel(shard_keys(m, shard).object("default", key), "special")
    return {"read_mark_missing"}


def corrupt_tier_placement(m):
    (_, k1, _), (_, k2, _) = [o for o in objects(m) if o[1].startswith("longsoft")][:2]
    p1, u1 = keys_of(m, k1), f"o:default:{k1}"
    score = m.redis.zscore(p1.tier_soft, u1)
    m.redis.zrem(p1.tier_soft, u1)                       # soft-pinned, yet ordinary
    m.redis.zadd(p1.tier_ordinary, {u1: score})
    m.redis.zadd(keys_of(m, k2).tier_ordinary, {f"o:default:{k2}": 1})   # in both tiers
    return {"unit_wrong_tier", "unit_in_both_tiers"}  # the deadline entry is right: the tier is wrong


def corrupt_deadline(m):
    key = "longsoft-3"
    assert int(m.describe(key).soft_pin_until_ms) > m.now_ms()
    m.redis.zrem(keys_of(m, key).deadline_soft_pin, f"o:default:{key}")
    return {"soft_deadline"}


def corrupt_processing(m):
    _, key, _ = pick(m, lambda k, h: h["status"] == "processing")
    m.redis.zrem(keys_of(m, key).processing, f"default:{key}")
    first = key
    _, key, h = pick(m, lambda k, h: h["status"] == "processing" and k != first)
    k = keys_of(m, key)  # a put in progress as an earlier package wrote it: put_started beside the score
    m.redis.hset(k.object("default", key), "put_started", int(m.redis.zscore(k.processing, f"default:{key}")) + 1)
    _, key, _ = ordinary_unit(m)
    m.redis.zadd(keys_of(m, key).processing, {f"default:{key}": 1})
    m.redis.zadd(shard_keys(m, 0).processing, {"default:gone": 1})
    return {"processing_missing", "processing_score", "processing_stale"}


def corrupt_held_bound(m):
    shard = next(s for s in range(m.shards) if m.redis.zcard(shard_keys(m, s).held))
    k = shard_keys(m, shard)
    first = m.redis.zrange(k.held, 0, 0, withscores=True)[0][1]
    m.redis.hset(k.config, "held_due", int(first) + 1)  # later than the deadline: put_start would not look
    if m.shards > 1:
        m.redis.hset(shard_keys(m, (shard + 1) % m.shards).config, "held_due", "soon")
    return {"held_bound"}


def corrupt_segment_used(m):
    m.redis.hincrby(shard_keys(m, 0).segment("seg-a"), "used", 100)
    return {"segment_used"}


def corrupt_segment_index(m):
    m.redis.zincrby(shard_keys(m, 0).segments, 10, "seg-b")
    m.redis.zadd(shard_keys(m, 0).segments, {"ghost": 100})
    m.redis.zadd(shard_keys(m, 0).free("ghost2")[0], {"0": 0})
    if m.shards > 1:
        m.redis.zrem(shard_keys(m, 1).segments, "seg-a")
    expect = {"segment_free", "segment_stale_index", "orphan_free_list"}
    return expect | {"segment_not_indexed"} if m.shards > 1 else expect


def corrupt_group_member(m):
    _, key, _ = pick(m, lambda k, h: h.get("group") == "g1")
    m.redis.srem(keys_of(m, key).group_members("default", "g1"), key)
    return {"group_member_missing"}


def corrupt_group_record(m):
    p = keys_of(m, "g2")
    m.redis.sadd(p.group_members("default", "g2"), "{g2}ghost")
    m.redis.hincrby(keys_of(m, "g1").group("default", "g1"), "processing", 1)
    m.redis.hset(keys_of(m, 'g3').group("default", "g3"), "hard_pinned", 0)
    return {"group_member_stray", "group_counters"}


def corrupt_group_soft_pin(m):
    p = keys_of(m, "g1")
    m.redis.zadd(p.aggregate("soft_pin", "g:default:g1"), {"{g1}ghost": 2**40})  # a member that is not one
    return {"group_soft_pin"}


def corrupt_group_unit(m):
    p = keys_of(m, "g1")
    m.redis.zrem(p.tier_ordinary, "g:default:g1")
    m.redis.zadd(keys_of(m, 'g2').tier_ordinary, {"g:default:g2": 1})  # g2 has a member in progress
    return {"unit_missing", "stray_unit"}


def corrupt_unit_memo(m):
    p = keys_of(m, "g1")
    if m.redis.zscore(p.tier_ordinary, "g:default:g1") is None:  # another corruption took it
        m.redis.zadd(p.tier_ordinary, {"g:default:g1": m.now_ms()})
    m.redis.hset(p.group("default", "g1"), "at", "")  # the memo says no index holds an entry
    return {"unit_memo"}


def corrupt_free_extent(m):
    p = shard_keys(m, 0)
    member = m.redis.zrange(p.free("seg-a")[0], 0, 0)[0]
    m.redis.zrem(p.free("seg-a")[0], member)
    m.redis.zrem(p.free("seg-a")[1], member)
    return {"gap"}


def corrupt_free_lists(m):
    p = shard_keys(m, 0)
    by_off, by_size = p.free("seg-b")
    member, off = m.redis.zrange(by_off, 0, 0, withscores=True)[0]
    length = int(m.redis.zscore(by_size, member))
    assert length >= 4
    # split one free extent in two (uncoalesced), and add a member to by_off only
    m.redis.zadd(by_size, {member: 2})
    m.redis.zadd(by_off, {str(int(off) + 2): int(off) + 2})
    m.redis.zadd(by_size, {str(int(off) + 2): length - 2})
    m.redis.zadd(by_off, {"123456789": 5})  # not a free extent of this slice at all
    return {"uncoalesced", "free_list_mismatch"}


def corrupt_free_over_allocated(m):
    shard, key, h = pick(m, lambda k, h: h["status"] == "complete" and "seg-a" in replicas_in(h))
    p = shard_keys(m, shard)
    off = replicas_in(h)["seg-a"][0]
    m.redis.zadd(p.free("seg-a")[0], {str(off): off})
    m.redis.zadd(p.free("seg-a")[1], {str(off): int(h["size"])})
    return {"free_overlaps_allocated"}


def corrupt_dead_object(m):
    # an object whose only replica sits on an unmounted segment (unmount without its sweep);
    # its real extents are now owned by nobody, so segment bytes and free lists drift as well
    shard, key, h = pick(m, lambda k, h: h["status"] == "complete" and "group" not in h
                         and h.get("hard_pin", "0") == "0")
    p = shard_keys(m, shard)
    okey = p.object("default", key)
    m.redis.hset(okey, "reps", reps_value({"seg-c": (0, "1")}))
    return {"no_live_replica"}


CORRUPTIONS = [corrupt_used_bytes, corrupt_capacity_and_objects, corrupt_tier_entry, corrupt_bogus_units,
               corrupt_tier_score, corrupt_read_mark, corrupt_tier_placement, corrupt_deadline, corrupt_processing, corrupt_held_bound, corrupt_segment_used,
               corrupt_segment_index, corrupt_group_member, corrupt_group_record, corrupt_group_soft_pin, corrupt_group_unit,
               corrupt_unit_memo,
               corrupt_free_extent, corrupt_free_lists, corrupt_free_over_allocated]


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=lambda f: f.__name__[len("corrupt_"):])
def test_corruption_found_and_repaired(store, corrupt):
    assert_clean(store)
    expect = corrupt(store)
    report = repair_and_recheck(store, expect)
    for f in report.findings:
        assert f.kind in KINDS and f.subject and str(f)


def test_a_record_without_a_memo_is_placed_through_every_index(store):
    """A group record written before the memo existed (no `at`) means any index: fsck finds
    nothing to say, and the next placement reaches an entry in any index and writes the memo."""
    p = keys_of(store, "g1")
    gkey = p.group("default", "g1")
    store.redis.hdel(gkey, "at")
    assert_clean(store)
    store.redis.zadd(p.tier_soft, {"g:default:g1": store.now_ms()})  # an entry the rule does not name
    cfg = ReplicateConfig(group_id="g1", soft_pin_action=SoftPinAction.PRESERVE)
    store.put_start("client-1", "{g1}late", 1024, cfg)  # a new member: the group is placed
    store.put_end("client-1", "{g1}late")
    assert store.redis.zscore(p.tier_soft, "g:default:g1") is None
    assert store.redis.hget(gkey, "at") is not None
    assert_clean(store)


def test_dead_object_is_swept(store):
    m = store
    for p in all_shard_keys(m):
        m.redis.delete(p.sweep_pending)  # no sweep owed: a dead object is fsck's to report
    expect = corrupt_dead_object(m)
    # deleting the hash also fixes what it was counted in: the second pass is clean
    repair_and_recheck(m, expect)


def test_every_corruption_at_once(store):
    m = store
    expect = set()
    for corrupt in CORRUPTIONS:
        expect |= corrupt(m)
    report = fsck(m)
    assert expect <= kinds(report), report.summary()
    fixed = fsck(m, repair=True)
    assert all(f.repaired for f in fixed.findings), fixed.summary()
    assert_clean(m)


def test_overlap_reported_not_repaired(store):
    m = store
    # two objects on the same segment slice; point B's replica at A's bytes
    by_slice = {}
    for shard, key, h in objects(m):
        for seg, rep in replicas_in(h).items():
            if h["status"] == "complete":
                by_slice.setdefault((shard, seg), []).append((key, rep, h))
    (shard, seg), pair = next((k, v) for k, v in sorted(by_slice.items()) if len(v) >= 2)
    (a, a_rep, _), (b, _, b_h) = pair[:2]
    okey = shard_keys(m, shard).object("default", b)
    m.redis.hset(okey, "reps", reps_value({**replicas_in(b_h), seg: a_rep}))
    report = fsck(m)
    overlaps = [f for f in report.findings if f.kind == "overlap"]
    assert len(overlaps) == 1 and overlaps[0].severity == "critical", report.summary()
    assert a in overlaps[0].subject and b in overlaps[0].subject
    assert "gap" in kinds(report)  # B's real extent is now owned by nobody
    fixed = fsck(m, repair=True)
    assert [f.kind for f in fixed.findings if f.kind == "overlap"] == ["overlap"]
    assert not any(f.repaired for f in fixed.findings if f.kind in ("overlap", "gap"))
    assert "overlap" in kinds(fsck(m))  # still there: overlaps are never auto-fixed
    m.redis.hset(okey, "reps", b_h["reps"])  # the operator's fix
    assert_clean(m)


def test_counter_repair_is_compare_and_set(store):
    m = store
    m.redis.hincrby(shard_keys(m, 0).P, "used_bytes", 4096)
    audit = _Audit(m, batch=64, retries=0, progress=None)
    report = audit.run(repair=False)
    assert "shard_used_bytes" in kinds(report)
    m.redis.hincrby(shard_keys(m, 0).P, "used_bytes", 1)  # stands for a write landing between read and repair
    audit.repair()
    counters = [f for f in report.findings if f.kind == "shard_used_bytes"]
    assert counters and not any(f.repaired for f in counters)
    assert "moved" in counters[0].note
    m.redis.hincrby(shard_keys(m, 0).P, "used_bytes", -1)
    repair_and_recheck(m, {"shard_used_bytes"})


def test_direct_function_contracts(store):
    m = store
    p = shard_keys(m, 0)
    fc = lambda fn, *a: m.redis.execute_command("FCALL", fn, 1, p.P, *a)  # noqa: E731
    used = int(m.redis.hget(p.P, "used_bytes"))
    assert fc("mc_fsck_counters", "used_bytes", used + 1, 5) == [[0, used]]
    assert fc("mc_fsck_counters", "used_bytes", used, 0) == [[1, used]]
    seg_used = int(m.redis.hget(p.segment("seg-a"), "used"))
    assert fc("mc_fsck_segment_used", "seg-a", seg_used + 1, 3)[0] == 0
    assert fc("mc_fsck_segment_used", "seg-a", seg_used, 0)[:2] == [1, seg_used]
    assert fc("mc_fsck_forget_segment", "seg-a") == 0           # mounted: left alone
    assert fc("mc_fsck_unit", "not a unit") == b"removed"
    # rebuild refuses when the free lists moved since they were read
    mount = m.redis.hget(p.segment("seg-a"), "mount")
    base, size = int(m.redis.hget(p.segment("seg-a"), "base")), int(m.redis.hget(p.segment("seg-a"), "size"))
    reply = fc("mc_fsck_rebuild_free", "seg-a", mount, base, base + size, 0, 0, 0)
    assert reply[0] == 0
    reply = fc("mc_fsck_rebuild_free", "seg-a", b"999", base, base + size, 0, 0, 0)
    assert reply[0] == 0
    with pytest.raises(Exception):
        fc("mc_fsck_counters", "put_failed", 0, 1)
    assert_clean(m)


def test_busy_shard_is_retried_then_unverified(store):
    m = store
    m.redis.hincrby(shard_keys(m, 0).P, "used_bytes", 4096)
    calls = []

    def bump_all(n):  # a write to every shard: whichever shard is being scanned moves
        for shard in range(m.shards):
            m.redis.incr(shard_keys(m, shard).mount_seq)
        calls.append(n)

    def bump_once(n):
        if not calls:
            bump_all(n)
        else:
            calls.append(n)

    report = fsck(m, progress=bump_once)  # the moved pass is retried, the retry is still
    assert report.unverified == {} and "shard_used_bytes" in kinds(report), report.summary()
    report = fsck(m, retries=1, progress=bump_all)
    assert 0 in report.unverified and not report.ok
    assert "shard_used_bytes" not in kinds(report)  # not trusted from a moving shard
    repair_and_recheck(m, {"shard_used_bytes"})


def test_free_lists_rebuilt_in_windows(store, monkeypatch):
    """A segment rebuilt in many bounded calls (2 allocated extents per window) comes out right."""
    m = store
    monkeypatch.setattr(fsck_module.allocator, "WINDOW_EXTENTS", 2)
    for shard in range(m.shards):
        p = shard_keys(m, shard)
        for seg in ("seg-a", "seg-b"):
            by_off, by_size = p.free(seg)
            members = m.redis.zrange(by_off, 0, -1)
            for member in members[::2]:          # leak every other free extent
                m.redis.zrem(by_off, member)
                m.redis.zrem(by_size, member)
            m.redis.zadd(by_off, {"77": 1 << 40})  # misfiled, beyond the segment
            m.redis.zadd(by_size, {"88": 3})       # only in by_size
    report = repair_and_recheck(m, {"gap", "free_list_mismatch", "free_bad_entry"})
    assert any(f.kind == "gap" for f in report.repaired)


def test_group_too_large_is_unverified(store, monkeypatch):
    monkeypatch.setattr(fsck_module.groups, "GROUP_MAX_MEMBERS", 2)
    report = fsck(store)
    assert not report.ok and not report.findings
    assert any("g1" in why for why in report.unverified.values())


def test_malformed_held_entry_is_reported(store):
    m = store
    m.redis.zadd(shard_keys(m, 0).held, {"not a held entry": 1})
    report = fsck(m, repair=True)
    by_kind = {f.kind: f for f in report.findings}
    assert sorted(by_kind) == ["bad_held", "held_bound"]  # the entry was added by hand, below the bound
    assert not by_kind["bad_held"].repairable and "not auto-repairable" in str(by_kind["bad_held"])
    assert by_kind["held_bound"].repaired and m.redis.hget(shard_keys(m, 0).config, "held_due") == b"1"


def test_confirming_pass_drops_transient_findings():
    """repair=True acts only on aggregate findings two still passes agree on; an action any of
    whose findings was seen once does not run."""
    from mooncake_redis.fsck import Counters, Finding, Rebuild, SegmentUsed, _Pass

    def f(kind, subject, found, action):
        return Finding(kind, 0, subject, "1", found, action=action)

    seg = SegmentUsed(0, b"x", 2, -1)
    counters = Counters(0, (("objects", 5, 1), ("used_bytes", 9, 1)))
    rebuild = Rebuild(0, b"x")
    first, second = _Pass(), _Pass()
    first.aggregate = [f("segment_used", "segment x", "2", seg), f("shard_objects", "P.objects", "5", counters),
                       f("gap", "segment x [0, 4)", "4", rebuild)]
    second.aggregate = [f("segment_used", "segment x", "2", seg), f("shard_objects", "P.objects", "5", counters),
                        f("shard_used_bytes", "P.used_bytes", "9", counters),  # seen once: a race
                        f("gap", "segment x [0, 4)", "4", rebuild), f("gap", "segment x [8, 9)", "1", rebuild)]
    second.rebuild = {b"x": ("mount", [])}
    _Audit.confirm(first, second)
    kept = {(x.kind, x.subject): x for x in second.aggregate}
    assert set(kept) == {("segment_used", "segment x"), ("shard_objects", "P.objects"), ("gap", "segment x [0, 4)")}
    assert kept[("segment_used", "segment x")].action == seg
    assert kept[("shard_objects", "P.objects")].action is None
    assert kept[("gap", "segment x [0, 4)")].action is None and second.rebuild == {}


def test_foreign_key_in_object_namespace(store):
    m = store
    m.redis.set(shard_keys(m, 0).object("default", "not-a-hash"), "x")
    report = fsck(m, repair=True)
    assert [(f.kind, f.repairable) for f in report.findings] == [("bad_object", False)], report.summary()
    m.redis.delete(shard_keys(m, 0).object("default", "not-a-hash"))
    assert_clean(m)


def test_dead_replicas_with_a_sweep_owed_are_not_drift(store):
    m = store
    m.put_start("client-1", "soon-dead", 512, ReplicateConfig(preferred_segments=("seg-c",)))
    m.put_end("client-1", "soon-dead")
    for p in all_shard_keys(m):  # the unmount steps alone: the sweep is owed (P:sweep_pending)
        m.redis.execute_command("FCALL", "mc_unmount_segment", 1, p.P, 2, "name", "seg-c", "client_id", "client-2")
    assert_clean(m)
    for p in all_shard_keys(m):
        m.redis.delete(p.sweep_pending)  # the marker lost: now fsck owns the sweep
    repair_and_recheck(m, {"no_live_replica"})
    with pytest.raises(MasterError):
        m.describe("soon-dead")


def test_clean_after_a_worker_pass(store):
    """The background loops (discard abandoned puts, release held extents, expire a client and
    sweep its replicas, evict) keep every derived structure right."""
    from mooncake_redis.worker import Worker

    m = store
    watched_silence(m, m.config.put_start_release_timeout, ping=("client-1", "client-2"))
    m.ping("client-2")
    watched_silence(m, m.config.client_ttl + 1, ping=("client-1",))  # client-2 (seg-c) expires
    m.ping("client-1")
    done = Worker(m).run_once()
    assert done.discarded_puts >= 4 and done.segments_unmounted == m.shards, done
    assert_clean(m)
    assert m.run_eviction().final  # and eviction down to the (low) target
    assert_clean(m)


# ---- deadlines the sweep has not reached yet (issue 24.7) ---------------------------------------
GUARANTEED_SOFT = dict(guaranteed_ttl_ms=1_000, soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=3_600_000)


def test_an_ended_guarantee_awaiting_its_sweep_is_not_drift(new_master):
    """Between a guarantee's deadline and the sweep that ends it, a soft-pinned object (and a
    group whose member it is) sits in no tier and has no soft-pin deadline entry yet: the rule
    already says soft tier, the entries follow at the sweep. fsck asks the functions whether a
    sweep is due (mc_fsck_sweep_due) and reports nothing; the sweep places both; a deadline
    entry that is really missing, or a due guarantee the sweep cannot see, is still reported."""
    m = new_master()
    m.mount_segment("seg-a", SEG, "client-1")
    m.put_start("client-1", "gsoft", 1024, ReplicateConfig(**GUARANTEED_SOFT))
    m.put_end("client-1", "gsoft")
    m.put_start("client-1", "{gg}m0", 1024, ReplicateConfig(group_id="gg", **GUARANTEED_SOFT))
    m.put_end("client-1", "{gg}m0")
    units = [(keys_of(m, "gsoft"), "o:default:gsoft"), (keys_of(m, "gg"), "g:default:gg")]
    for p, unit in units:
        assert m.redis.zscore(p.tier_soft, unit) is None and m.redis.zscore(p.deadline_soft_pin, unit) is None
    assert_clean(m)
    m.advance_clock(1_000)  # both guarantees end now; no sweep has run
    for p, unit in units:
        assert m.redis.zscore(p.tier_soft, unit) is None and m.redis.zscore(p.deadline_soft_pin, unit) is None
    assert_clean(m)
    assert fsck(m, repair=True).findings == []
    for shard in range(m.shards):
        m.evict_step(shard)  # each step sweeps the due deadlines first
    for p, unit in units:
        assert m.redis.zscore(p.tier_soft, unit) is not None
        assert m.redis.zscore(p.deadline_soft_pin, unit) == T0 + 3_600_000
    assert_clean(m)
    # drift is still drift: a deadline entry gone, and (on another store state) a due guarantee
    # whose P:guaranteed entry is gone, so that no sweep will ever place the unit
    m.redis.zrem(keys_of(m, "gsoft").deadline_soft_pin, "o:default:gsoft")
    repair_and_recheck(m, {"soft_deadline"})
    m.put_start("client-1", "gsoft2", 1024, ReplicateConfig(**GUARANTEED_SOFT))
    m.put_end("client-1", "gsoft2")
    m.redis.zrem(keys_of(m, "gsoft2").guaranteed, "default:gsoft2")
    m.advance_clock(1_000)
    repair_and_recheck(m, {"guarantee_index", "unit_missing", "soft_deadline"})


def test_sweep_due_function_contract(new_master):
    """mc_fsck_sweep_due: read-only, 1-1024 units, one answer per unit (a unit it does not know,
    or a key of another type, is 0)."""
    m = new_master()
    m.mount_segment("seg-a", SEG, "client-1")
    m.put_start("client-1", "k", 1024, ReplicateConfig(**GUARANTEED_SOFT))
    m.put_end("client-1", "k")
    p = keys_of(m, "k")
    m.redis.set(p.object("default", "not-a-hash"), "x")

    def due(*units):
        return m.redis.execute_command("FCALL_RO", "mc_fsck_sweep_due", 1, p.P, *units)

    units = ["o:default:k", "o:default:missing", "g:default:none", "garbage", "o:default:not-a-hash"]
    assert due(*units) == [0, 0, 0, 0, 0]
    m.advance_clock(1_000)
    assert due(*units) == [1, 0, 0, 0, 0]
    with pytest.raises(Exception, match="INVALID_PARAMS"):
        due()
    with pytest.raises(Exception, match="INVALID_PARAMS"):
        due(*["o:default:k"] * 1025)


# ---- figures stored malformed (issue 24.8) ---------------------------------------------------
def guaranteed_replica(m):
    """A guaranteed object: (its shard keys, the segment of its replica)."""
    m.put_start("client-1", "gkey", 512, ReplicateConfig(guaranteed_ttl_ms=60_000))
    m.put_end("client-1", "gkey")
    [replica] = m.describe("gkey").replicas
    return keys_of(m, "gkey"), replica.segment


def malformed_used_bytes(m):
    m.redis.hset(shard_keys(m, 0).P, "used_bytes", "notanumber")
    return {"shard_used_bytes"}


def malformed_counters(m):
    p = shard_keys(m, m.shards - 1).P
    m.redis.hset(p, mapping={"capacity_bytes": "1e3", "objects": "9007199254740993", "guaranteed_bytes": " 7"})
    return {"shard_capacity_bytes", "shard_objects", "shard_guaranteed_bytes"}


def malformed_segment_used(m):
    m.redis.hset(shard_keys(m, 0).segment("seg-a"), "used", "notanumber")
    return {"segment_used"}


def malformed_guaranteed_bytes(m):
    p, seg = guaranteed_replica(m)
    m.redis.hset(p.guaranteed_tenants, "default", "lots")
    m.redis.hset(p.segment(seg), "g:default", "-")
    return {"tenant_guaranteed_bytes", "segment_guaranteed_bytes"}


MALFORMED = [malformed_used_bytes, malformed_counters, malformed_segment_used, malformed_guaranteed_bytes]


@pytest.mark.parametrize("corrupt", MALFORMED, ids=lambda f: f.__name__[len("malformed_"):])
def test_malformed_figures_found_and_repaired(store, corrupt):
    """A derived figure that is not an integer (canonical, within 2^53) is drift: reported with
    the value stored, and set to the recomputed value (mc_fsck_figures, compare-and-set)."""
    assert_clean(store)
    expect = corrupt(store)
    report = repair_and_recheck(store, expect)
    assert {f.kind for f in report.findings if f.found.startswith("malformed ")} == expect, report.summary()


def test_malformed_figures_nothing_derives_are_reported(store):
    m = store
    p = shard_keys(m, 0)
    m.redis.hset(p.P, "offload_done", "garbage")
    m.redis.hset(p.metrics, mapping={"passes_total": "zz", "last_worker": "any text"})
    report = fsck(m, repair=True)
    assert {(f.kind, f.subject, f.found, f.repairable) for f in report.findings} == {
        ("bad_figure", "P.offload_done", "malformed 'garbage'", False),
        ("bad_worker_figure", "P:metrics.passes_total", "malformed 'zz'", False)}, report.summary()
    assert m.redis.hget(p.P, "offload_done") == b"garbage"  # not repaired
    m.redis.hset(p.P, "offload_done", 0)
    m.redis.hset(p.metrics, "passes_total", 0)
    assert_clean(m)


def test_a_malformed_segment_record_is_not_repaired_away(store):
    """A segment whose size is malformed is reported (bad_segment); fsck --repair neither drops
    its replicas' objects nor rewrites the shard counters without it."""
    m = store
    p = shard_keys(m, 0)
    size = m.redis.hget(p.segment("seg-a"), "size")
    counters = m.redis.hgetall(p.P)
    n = len(objects(m))
    m.redis.hset(p.segment("seg-a"), "size", "big")
    report = fsck(m, repair=True)
    assert "bad_segment" in kinds(report) and "no_live_replica" not in kinds(report), report.summary()
    refused = [f for f in report.findings if f.kind in ("shard_used_bytes", "shard_capacity_bytes")]
    assert refused and not any(f.repaired for f in refused) and all("bad_segment" in f.note for f in refused)
    assert m.redis.hgetall(p.P) == counters and len(objects(m)) == n
    m.redis.hset(p.segment("seg-a"), "size", size)
    assert_clean(m)


def test_figure_repairs_contracts(store):
    m = store
    p = shard_keys(m, 0)
    fc = lambda fn, *a: m.redis.execute_command("FCALL", fn, 1, p.P, *a)  # noqa: E731
    used, n_objects = int(m.redis.hget(p.P, "used_bytes")), m.redis.hget(p.P, "objects")
    # compare-and-add never writes to (nor fails half way on) a malformed figure
    m.redis.hset(p.P, "objects", "x")
    assert fc("mc_fsck_counters", "used_bytes", used, 0, "objects", 0, 1) == [[1, used], [0, b"x"]]
    assert m.redis.hget(p.P, "objects") == b"x"
    # mc_fsck_figures: compare-and-set on the malformed value read, only a malformed one
    assert fc("mc_fsck_figures", "", "objects", "y", 5) == [[0, b"x"]]
    assert fc("mc_fsck_figures", "", "objects", "x", 5) == [[1, 5]]
    assert m.redis.hget(p.P, "objects") == b"5"
    for bad in (("", "objects", "5", 6),                 # a number: compare-and-add's job
                ("", "offload_done", "x", 0),            # not a figure fsck derives
                ("", "used_bytes", "x", -1),             # values are >= 0
                ("seg:no-such-segment", "used", "x", 0),
                ("seg:seg-a", "size", "x", 0),
                ("seg:seg-a", "used", "x", 1 << 40)):    # more than the segment
        with pytest.raises(Exception):
            fc("mc_fsck_figures", *bad)
    seg_used = m.redis.hget(p.segment("seg-a"), "used")
    m.redis.hset(p.segment("seg-a"), "used", "u")
    with pytest.raises(Exception):  # a bad quadruple anywhere: nothing written
        fc("mc_fsck_figures", "seg:seg-a", "used", "u", seg_used, "", "objects", "5", 0)
    assert m.redis.hget(p.segment("seg-a"), "used") == b"u"
    size = int(m.redis.hget(p.segment("seg-a"), "size"))
    assert fc("mc_fsck_segment_used", "seg-a", 0, 0)[0] == 0  # malformed: no match, no error
    assert fc("mc_fsck_figures", "seg:seg-a", "used", "u", seg_used) == [[1, int(seg_used)]]
    assert m.redis.zscore(p.segments, "seg-a") == size - int(seg_used)
    m.redis.hset(p.P, "objects", n_objects)
    assert_clean(m)
