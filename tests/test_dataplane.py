"""The reference data plane: real bytes through memory-mapped segment files and disk files,
blake3 checksums verified on every read, and the offload agent (in process, and as the CLI
command SIGKILLed mid-batch)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mooncake_redis import ErrorCode, MasterError
from mooncake_redis.dataplane import (ChecksumMismatch, LocalClient, SegmentFiles, checksum_of, collect_garbage,
                                     offload_batch, remove_batch)
from mooncake_redis.fsck import fsck

CLIENT = "engine-a"


@pytest.fixture
def client(new_master, tmp_path):
    m = new_master(offload_on_put=True)
    c = LocalClient(m, CLIENT, "seg-a", tmp_path / "seg-a.mem", (1 << 20) * m.shards, disk_dir=tmp_path / "disk")
    yield c
    c.files.close()


def test_byte_exact_round_trips_through_memory(client):
    blobs = {f"k{i}": os.urandom(1000 + 37 * i) for i in range(20)}
    for key, data in blobs.items():
        client.put(key, data)
    for key, data in blobs.items():
        assert client.get(key) == data
    assert client.master.get_replica_list("k0").checksum is not None


def test_offload_then_eviction_reads_from_disk(client, tmp_path):
    m = client.master
    blobs = {f"k{i}": os.urandom(5000) for i in range(10)}
    for key, data in blobs.items():
        client.put(key, data)
    files = SegmentFiles(m)
    assert offload_batch(m, CLIENT, tmp_path / "disk", files) == 10
    files.close()
    for key in blobs:
        assert [r.kind for r in m.get_replica_list(key).replicas] == ["memory", "disk"]
    # every object's memory goes: disk replicas keep them readable, byte for byte
    m.advance_clock(60_000)
    for shard in range(m.shards):
        m.redis.hset(m.transport.keys[shard].P, "put_failed", 1)
        while m.evict_step(shard, 64).state == "more":
            pass
    assert m.usage().used_bytes < 10 * 5000
    disk_only = [k for k in blobs if [r.kind for r in m.get_replica_list(k).replicas] == ["disk"]]
    assert disk_only
    for key, data in blobs.items():
        assert client.get(key) == data
    assert fsck(m).ok


def test_a_checksum_mismatch_is_an_error_never_wrong_bytes(client, tmp_path):
    m = client.master
    client.put("k", b"x" * 4096)
    (replica,) = m.get_replica_list("k").replicas
    client.files.map(replica.segment)[replica.offset] = ord("y")  # corrupt the memory copy
    with pytest.raises(ChecksumMismatch):
        client.get("k")
    # with a good disk copy the read falls through to it
    disk = tmp_path / "good"
    disk.write_bytes(b"x" * 4096)
    m.offload_object_heartbeat(CLIENT)
    m.notify_offload_success(CLIENT, ["k"], [str(disk)])
    assert client.get("k") == b"x" * 4096


def test_close_unmounts(client):
    m = client.master
    client.put("k", b"abc")
    client.close()
    with pytest.raises(MasterError) as info:
        m.get_replica_list("k")
    assert info.value.code == ErrorCode.OBJECT_NOT_FOUND
    assert m.offload_clients() == []


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["valkey"])
def test_agent_sigkilled_mid_batch_redelivers_without_duplicates(new_master, tmp_path, valkey):
    m = new_master(offload_on_put=True, offload_task_timeout=10_000)
    c = LocalClient(m, CLIENT, "seg-a", tmp_path / "seg-a.mem", (64 << 20) * m.shards, disk_dir=tmp_path / "disk")
    blobs = {f"k{i}": os.urandom(64 * 1024) for i in range(300)}
    for key, data in blobs.items():
        c.put(key, data)
    env = {**os.environ, "MOONCAKE_REDIS_URL": valkey.url}
    agent = subprocess.Popen([sys.executable, "-m", "mooncake_redis.cli.main", "offload-agent", "--client", CLIENT,
                              "--disk-dir", str(tmp_path / "disk"), "--max-tasks", "64"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while m.offload_counters()["done"] == 0 or m.offload_clients()[0].inflight == 0:
            assert time.monotonic() < deadline and agent.poll() is None, "the agent did not start a batch"
            time.sleep(0.005)
        agent.send_signal(signal.SIGKILL)
        agent.wait(10)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait(10)
    assert m.offload_counters()["done"] < len(blobs)  # killed before the end
    m.advance_clock(10_000)
    m.redeliver_offload_tasks()
    files = SegmentFiles(m)
    while offload_batch(m, CLIENT, tmp_path / "disk", files, 128):
        pass
    files.close()
    for key, data in blobs.items():
        disks = [r for r in m.get_replica_list(key).replicas if r.kind == "disk"]
        assert len(disks) == 1, key
        with open(disks[0].location, "rb") as f:
            assert f.read() == data
        assert m.task_refs(key) == 0
    assert fsck(m).ok
    c.files.close()


def test_put_many_round_trips_and_checksums(client):
    items = [(f"m{i}", os.urandom(3000 + i)) for i in range(40)]
    assert client.put_many(items) == [ErrorCode.OK] * 40
    for key, data in items:
        assert client.get(key) == data
    again = client.put_many(items[:2] + [("fresh", b"z" * 10)])
    assert again == [ErrorCode.OBJECT_ALREADY_EXISTS] * 2 + [ErrorCode.OK]
    assert client.get("fresh") == b"z" * 10
    assert client.master.batch_put_end(CLIENT, ["fresh"], checksums=[checksum_of(b"z" * 10)]) == [ErrorCode.OK]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["valkey"])
def test_agent_stops_on_sigterm_after_its_batch(new_master, tmp_path, valkey):
    m = new_master(offload_on_put=True)
    c = LocalClient(m, CLIENT, "seg-a", tmp_path / "seg-a.mem", (4 << 20) * m.shards, disk_dir=tmp_path / "disk")
    for i in range(20):
        c.put(f"k{i}", os.urandom(4096))
    env = {**os.environ, "MOONCAKE_REDIS_URL": valkey.url}
    agent = subprocess.Popen([sys.executable, "-m", "mooncake_redis.cli.main", "offload-agent", "--client", CLIENT,
                              "--disk-dir", str(tmp_path / "disk")], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + 60
    while m.offload_counters()["done"] < 20:
        assert time.monotonic() < deadline and agent.poll() is None
        time.sleep(0.01)
    # removed objects: the running agent removes their files and acknowledges
    assert len(_disk_files(tmp_path / "disk")) == 20
    m.advance_clock(60_000)
    for i in range(5):
        m.remove(f"k{i}")
    while len(_disk_files(tmp_path / "disk")) > 15 or m.offload_clients()[0].removals:
        assert time.monotonic() < deadline and agent.poll() is None
        time.sleep(0.01)
    for i in range(5, 20):
        assert c.get(f"k{i}")
    agent.send_signal(signal.SIGTERM)
    out, _ = agent.communicate(timeout=30)
    assert agent.returncode == 0 and f"offload agent {CLIENT} stopped after 20 task(s)" in out
    assert m.offload_clients()[0].inflight == 0
    c.files.close()


# ---- offloaded files: removal and garbage collection ------------------------------------

def _disk_files(disk_dir):
    return sorted(str(p) for p in disk_dir.rglob("*") if p.is_file())


def test_removed_objects_lose_their_files_and_referenced_files_stay(client, tmp_path):
    m, disk = client.master, tmp_path / "disk"
    for i in range(6):
        client.put(f"k{i}", os.urandom(3000))
    files = SegmentFiles(m)
    assert offload_batch(m, CLIENT, disk, files) == 6
    before = _disk_files(disk)
    assert len(before) == 6 and len(set(before)) == 6
    m.advance_clock(60_000)
    m.remove("k0")
    m.remove("k1")
    assert remove_batch(m, CLIENT, disk) == 2
    after = _disk_files(disk)
    assert len(after) == 4
    for i in range(2, 6):  # every live replica's file is still there, byte for byte
        (d,) = [r for r in m.get_replica_list(f"k{i}").replicas if r.kind == "disk"]
        assert d.location in after
    assert remove_batch(m, CLIENT, disk) == 0  # acknowledged: not handed out again
    # a key offloaded again gets a new file; the old one goes, the new one stays
    client.put("k0", b"again")
    assert offload_batch(m, CLIENT, disk, files) == 1
    (d,) = [r for r in m.get_replica_list("k0").replicas if r.kind == "disk"]
    assert d.location not in before and client.get("k0") == b"again"
    files.close()
    assert fsck(m).ok


def test_a_success_the_master_refuses_removes_its_file(client, tmp_path):
    m, disk = client.master, tmp_path / "disk"
    client.put("k", b"x" * 100)
    files = SegmentFiles(m)
    tasks = m.offload_object_heartbeat(CLIENT)
    m.advance_clock(60_000)
    m.remove("k", force=True)  # gone while its copy is being written
    m.offload_object_heartbeat = lambda *a: tasks  # the batch runs with the task in hand
    try:
        offload_batch(m, CLIENT, disk, files)
    finally:
        del m.offload_object_heartbeat
    files.close()
    assert _disk_files(disk) == []


def test_garbage_collection_removes_only_unreferenced_old_files(client, tmp_path):
    m, disk = client.master, tmp_path / "disk"
    for i in range(4):
        client.put(f"k{i}", os.urandom(2000))
    files = SegmentFiles(m)
    offload_batch(m, CLIENT, disk, files)
    files.close()
    live = _disk_files(disk)
    # orphans: a stray copy of a live key, a copy of a key that never existed, a crashed .tmp;
    # left alone: a file not named by the agent, a young orphan
    stray = disk / "default" / (b"k0".hex() + ".0123456789ab")
    ghost = disk / "default" / (b"ghost".hex() + ".ba9876543210")
    tmp = disk / "default" / (b"k1".hex() + ".aaaaaaaaaaaa.tmp")
    foreign = disk / "default" / "notes.txt"
    foreign_tmp = disk / "default" / "notes.tmp"
    young = disk / "default" / (b"young".hex() + ".cccccccccccc")
    for p in (stray, ghost, tmp, foreign, foreign_tmp, young):
        p.write_bytes(b"junk")
    old = time.time() - 3600
    for p in [*map(Path, live), stray, ghost, tmp, foreign, foreign_tmp]:
        os.utime(p, (old, old))
    dry = collect_garbage(m, CLIENT, disk, min_age_s=600, dry_run=True)
    assert (dry.removed, dry.kept) == (3, 4) and len(_disk_files(disk)) == 10
    report = collect_garbage(m, CLIENT, disk, min_age_s=600)
    assert (report.removed, report.kept, report.skipped) == (3, 4, 3)
    assert _disk_files(disk) == sorted(live + [str(foreign), str(foreign_tmp), str(young)])
    # files of replicas lost with an unmount are orphans once the disk is mounted again
    m.unmount_local_disk_segment(CLIENT)
    m.mount_local_disk_segment(CLIENT)
    assert collect_garbage(m, CLIENT, disk, min_age_s=600).removed == 4
    for i in range(4):
        assert [r.kind for r in m.get_replica_list(f"k{i}").replicas] == ["memory"]


@pytest.mark.parametrize("backend", ["valkey"])
def test_offload_gc_command(new_master, tmp_path, valkey):
    from click.testing import CliRunner

    from mooncake_redis.cli.main import cli

    m = new_master(offload_on_put=True)
    c = LocalClient(m, CLIENT, "seg-a", tmp_path / "seg-a.mem", (1 << 20) * m.shards, disk_dir=tmp_path / "disk")
    c.put("k", b"abc")
    files = SegmentFiles(m)
    offload_batch(m, CLIENT, tmp_path / "disk", files)
    files.close()
    orphan = tmp_path / "disk" / "default" / (b"gone".hex() + ".0123456789ab")
    orphan.write_bytes(b"junk")
    env = {"MOONCAKE_REDIS_URL": valkey.url}
    args = ["offload-gc", "--client", CLIENT, "--disk-dir", str(tmp_path / "disk"), "--min-age", "0"]
    r = CliRunner().invoke(cli, args + ["--dry-run", "--json"], env=env)
    assert r.exit_code == 0, r.output
    body = json.loads(r.stdout)
    assert (body["command"], body["removed"], body["kept"], body["dry_run"]) == ("offload-gc", 1, 1, True)
    assert orphan.exists()
    r = CliRunner().invoke(cli, args, env=env)
    assert r.exit_code == 0 and "removed 1 file(s)" in r.stdout and "kept 1 referenced" in r.stdout
    assert not orphan.exists() and c.get("k") == b"abc"
    r = CliRunner().invoke(cli, ["offload-gc", "--client", CLIENT, "--disk-dir", str(tmp_path / "nowhere")], env=env)
    assert r.exit_code == 2 and "Traceback" not in r.output
    c.files.close()
