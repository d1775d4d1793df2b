"""Mooncake's task queue (mc_task_create / fetch / complete / query): tasks go to the owner of the
source segment, are handed out once each, come back after a hand-out times out (at least once,
up to 10 hand-outs), and a client that runs one through the replication steps ends up with the
replica where the task asked for it."""
import pytest

from mooncake_redis import ErrorCode, MasterError, ReplicateConfig
from mooncake_redis.fsck import fsck

from helpers import WATERMARKS, shard_keys

MASTER_CONFIG = WATERMARKS
KIB = 1024
TIMEOUT = 300_000  # the task timeouts (ms)


def setup(new_master):
    m = new_master(evict_on_put=False)
    m.mount_segment("seg-a", 64 * KIB * m.shards, "owner-a", base=0)
    m.mount_segment("seg-b", 64 * KIB * m.shards, "owner-b", base=1 << 30)
    m.mount_segment("seg-c", 64 * KIB * m.shards, "owner-b", base=2 << 30)
    return m


def put(m, key, seg="seg-a"):
    m.put_start("owner-a", key, KIB, ReplicateConfig(preferred_segments=(seg,)))
    m.put_end("owner-a", key)


def code_of(fn, *args):
    with pytest.raises(MasterError) as e:
        fn(*args)
    return e.value.code


def run(m, client, task):
    """What Mooncake's client does with a task: the replication's three steps, then completion."""
    if task.type == "copy":
        m.replica_copy_start(client, task.key, task.source, task.targets, task.tenant)
    else:
        m.replica_move_start(client, task.key, task.source, task.targets[0], task.tenant)
    m.replica_end(client, task.key, task.type, task.tenant)
    m.complete_task(client, task.id, True, "done")


def test_a_copy_task_reaches_the_source_owner_and_runs(new_master):
    m = setup(new_master)
    put(m, "k")
    task_id = m.create_copy_task("k", ["seg-b"])
    assert m.query_task(task_id).status == "pending" and m.query_task(task_id).client == "owner-a"
    assert m.fetch_tasks("owner-b") == []  # not the source's owner
    [task] = m.fetch_tasks("owner-a")
    assert (task.id, task.type, task.key, task.source, task.targets, task.attempts) == \
        (task_id, "copy", b"k", "seg-a", ["seg-b"], 1)
    assert m.fetch_tasks("owner-a") == []  # handed out once
    assert m.query_task(task_id).status == "processing"
    run(m, "owner-a", task)
    info = m.query_task(task_id)
    assert (info.status, info.message) == ("success", "done")
    assert sorted(r.segment for r in m.get_replica_list("k").replicas) == ["seg-a", "seg-b"]
    assert fsck(m).ok


def test_a_move_task(new_master):
    m = setup(new_master)
    put(m, "k")
    task_id = m.create_move_task("k", "seg-a", "seg-c")
    [task] = m.fetch_tasks("owner-a")
    run(m, "owner-a", task)
    assert m.query_task(task_id).status == "success"
    assert [r.segment for r in m.get_replica_list("k").replicas] == ["seg-c"]


def test_create_refusals(new_master):
    m = setup(new_master)
    put(m, "k")
    assert code_of(m.create_copy_task, "nope", ["seg-b"]) == ErrorCode.OBJECT_NOT_FOUND
    assert code_of(m.create_copy_task, "k", ["seg-x"]) == ErrorCode.INVALID_PARAMS
    assert code_of(m.create_copy_task, "k", []) == ErrorCode.INVALID_PARAMS
    assert code_of(m.create_move_task, "k", "seg-a", "seg-a") == ErrorCode.INVALID_PARAMS
    assert code_of(m.create_move_task, "k", "seg-b", "seg-c") == ErrorCode.INVALID_PARAMS  # no replica there
    m.graceful_unmount_segment("seg-c", "owner-b", 60_000)
    assert code_of(m.create_copy_task, "k", ["seg-c"]) == ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS
    assert code_of(m.query_task, "0" * 32) == ErrorCode.TASK_NOT_FOUND
    assert code_of(m.query_task, "not-an-id") == ErrorCode.TASK_NOT_FOUND


def test_completion_is_the_assigned_clients_and_idempotent(new_master):
    m = setup(new_master)
    put(m, "k")
    task_id = m.create_copy_task("k", ["seg-b"])
    m.fetch_tasks("owner-a")
    assert code_of(m.complete_task, "owner-b", task_id, True) == ErrorCode.ILLEGAL_CLIENT
    m.complete_task("owner-a", task_id, False, "TRANSFER_FAIL")
    m.complete_task("owner-a", task_id, True)  # already finished: OK, unchanged
    info = m.query_task(task_id)
    assert (info.status, info.message) == ("failed", "TRANSFER_FAIL")


def test_a_task_not_completed_in_time_is_handed_out_again_then_fails(new_master):
    m = setup(new_master)
    put(m, "k")
    task_id = m.create_copy_task("k", ["seg-b"])
    for attempt in range(1, 11):
        [task] = m.fetch_tasks("owner-a")
        assert task.attempts == attempt
        m.advance_clock(TIMEOUT)
    assert m.fetch_tasks("owner-a") == []  # the 10th hand-out timed out: no more
    info = m.query_task(task_id)
    assert (info.status, info.message, info.attempts) == ("failed", "processing timeout", 10)


def test_a_task_never_fetched_fails_at_the_pending_timeout(new_master):
    m = setup(new_master)
    put(m, "k")
    task_id = m.create_copy_task("k", ["seg-b"])
    m.advance_clock(TIMEOUT)
    assert m.fetch_tasks("owner-a") == []
    assert (m.query_task(task_id).status, m.query_task(task_id).message) == ("failed", "pending timeout")



def test_fsck_checks_the_task_records_against_their_indexes_and_the_pending_count(new_master):
    """fsck finds a pending count that drifted (and repairs it), a task its indexes lost, and a
    queue member with no task behind it."""
    m = setup(new_master)
    for k in ("k1", "k2", "k3"):
        put(m, k)
    ids = [m.create_copy_task(k, ["seg-b"]) for k in ("k1", "k2", "k3")]
    [first, *_] = m.fetch_tasks("owner-a", 1)
    run(m, "owner-a", first)
    assert fsck(m).ok  # one finished, the others pending, each in its indexes
    task = next(i for i in ids if m.query_task(i).status == "pending")
    shard = int(task[-4:], 16)  # a task id's last 4 hex digits name its shard
    keys, r = shard_keys(m, shard), m.transport.node(shard)
    r.hincrby(keys.P, "tasks_pending", 2)
    assert [f.kind for f in fsck(m).findings] == ["shard_tasks_pending"]
    assert fsck(m, repair=True).repaired and fsck(m).ok
    r.zrem(keys.task_queue("owner-a"), task)  # never handed out now
    r.zadd(keys.task_queue("owner-a"), {"no-such-task": 1})
    kinds = sorted(f.kind for f in fsck(m).findings)
    assert kinds == ["task_queue_stale", "task_unindexed"], kinds
