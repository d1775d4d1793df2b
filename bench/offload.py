"""`bench offload`: the SSD offload tier and the reference data plane, with baselines measured in
the same run.

* tasks/s through offload_object_heartbeat + notify_offload_success for 64 KiB objects with one
  agent: the master alone (no bytes copied), and the whole agent batch (copy from the segment
  file to the disk directory, fsync, notify: mooncake_redis.dataplane.offload_batch);
* LocalClient.put (put_start, write into the mapped segment file, put_end with a blake3
  checksum: two master round trips) and LocalClient.put_many (the same for 32 objects in two
  round trips) of 64 KiB and 1 MiB objects against three floors: a raw copy of the same bytes
  into the same mapped file, the copy plus the checksum (the data plane's byte work), and the
  master's share (batch_put_start + batch_put_end with no bytes).

Namespace "bench.offload" on the given server (its keys are deleted before and after); segment
files under /dev/shm when it exists, disk files in a temporary directory."""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from mooncake_redis import Master, MasterConfig
from mooncake_redis.dataplane import LocalClient, SegmentFiles, checksum_of, offload_batch

from .common import delete_namespace

NAMESPACE = "bench.offload"
CLIENT = "bench-agent"
KIB64, MIB = 64 * 1024, 1024 * 1024
BATCH = 32  # objects per LocalClient.put_many


def _remove(m: Master, keys: list[str]) -> None:
    for key in keys:
        m.remove(key, force=True)


def _shm_dir() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def _fresh(url: str) -> Master:
    """A new store under NAMESPACE (whatever a previous run left is deleted first)."""
    config = MasterConfig(namespace=NAMESPACE, offload_on_put=True, offload_queue_limit=1_000_000)
    m = Master.connect(url, config)
    delete_namespace(m.redis, NAMESPACE)
    m.close()
    return Master.connect(url, config)


def _tasks_per_s(url: str, seg_dir: str, disk_dir: Path, objects: int, copy: bool, out) -> float:
    m = _fresh(url)
    path = Path(seg_dir) / f"mooncake-bench-{os.getpid()}.seg"
    c = LocalClient(m, CLIENT, "bench-seg", path, objects * KIB64 + MIB, disk_dir=disk_dir)
    try:
        data = os.urandom(KIB64)
        for i in range(objects):
            c.put(f"o{i}", data)
        files = SegmentFiles(m)
        t0 = time.perf_counter()
        done = 0
        while done < objects:
            if copy:
                n = offload_batch(m, CLIENT, disk_dir, files, 256)
            else:
                tasks = m.offload_object_heartbeat(CLIENT, 256)
                m.notify_offload_success(CLIENT, [t.key for t in tasks], [f"/bench/{t.key.hex()}" for t in tasks])
                n = len(tasks)
            if n == 0:
                raise RuntimeError("the queue ran dry before every object was offloaded")
            done += n
        rate = done / (time.perf_counter() - t0)
        files.close()
        out(f"offload {'agent (copy + fsync + notify)' if copy else 'master (heartbeat + notify)'}: "
            f"{rate:,.0f} tasks/s ({objects} x 64 KiB)")
        return rate
    finally:
        c.files.close()
        path.unlink(missing_ok=True)
        delete_namespace(m.redis, NAMESPACE)
        m.close()


def _rate(count: int, body) -> float:
    """Objects/s of `body()`, which handles `count` objects."""
    t0 = time.perf_counter()
    body()
    return count / (time.perf_counter() - t0)


def _put_vs_copy(url: str, seg_dir: str, size: int, count: int, out) -> dict:
    """put and put_many against three same-run floors: the raw copy; the data plane's byte work
    (the copy and the blake3 checksum a put stores); the master's share of put_many
    (batch_put_start + batch_put_end of the same batches with no bytes written)."""
    m = _fresh(url)
    path = Path(seg_dir) / f"mooncake-bench-{os.getpid()}.put"
    c = LocalClient(m, CLIENT, "bench-put", path, count * size + MIB)
    try:
        data = os.urandom(size)
        mm = c.files.map("bench-put")
        rates = {"copy": 0.0, "bytes": 0.0, "master": 0.0, "put": 0.0, "put_many": 0.0}

        def copy(rep):
            for i in range(count):
                mm[i * size:(i + 1) * size] = data

        def copy_and_checksum(rep):
            for i in range(count):
                mm[i * size:(i + 1) * size] = data
                checksum_of(data)

        def batches(prefix):
            return [[f"{prefix}-{i}" for i in range(start, min(count, start + BATCH))]
                    for start in range(0, count, BATCH)]

        def master_only(rep):
            for keys in batches(f"m{rep}"):
                m.batch_put_start(CLIENT, keys, [size] * len(keys))
                m.batch_put_end(CLIENT, keys)

        def puts(rep):
            for i in range(count):
                c.put(f"p{rep}-{i}", data)

        def put_many(rep):
            for keys in batches(f"b{rep}"):
                c.put_many([(k, data) for k in keys])

        for rep in range(3):  # alternate the five, into the same mapped file
            for name, body, prefix in (("copy", copy, None), ("bytes", copy_and_checksum, None),
                                       ("master", master_only, "m"), ("put", puts, "p"), ("put_many", put_many, "b")):
                rates[name] = max(rates[name], _rate(count, lambda: body(rep)))
                if prefix:
                    _remove(m, [f"{prefix}{rep}-{i}" for i in range(count)])
        label = "64 KiB" if size == KIB64 else "1 MiB"
        bound = "the bytes" if rates["bytes"] < rates["master"] else "the master"
        out(f"put {label}: {rates['put']:,.0f} puts/s ({rates['put'] * size / MIB:,.0f} MiB/s, "
            f"{rates['put'] / rates['copy']:.2f}x of the copy); put_many x{BATCH}: {rates['put_many']:,.0f}/s "
            f"({rates['put_many'] * size / MIB:,.0f} MiB/s, {rates['put_many'] / rates['copy']:.2f}x of the copy, "
            f"{rates['put_many'] / min(rates['bytes'], rates['master']):.2f}x of the lower floor)")
        out(f"  floors: raw copy {rates['copy']:,.0f}/s ({rates['copy'] * size / MIB:,.0f} MiB/s); copy + blake3 "
            f"{rates['bytes']:,.0f}/s; master alone (put_start + put_end in batches of {BATCH}) "
            f"{rates['master']:,.0f}/s: put_many is bound by {bound}")
        return {"puts_per_s": rates["put"], "put_many_per_s": rates["put_many"], "copies_per_s": rates["copy"],
                "copy_checksum_per_s": rates["bytes"], "master_only_per_s": rates["master"],
                "ratio": rates["put"] / rates["copy"], "put_many_ratio": rates["put_many"] / rates["copy"],
                "bound_by": "bytes" if bound == "the bytes" else "master"}
    finally:
        c.files.close()
        path.unlink(missing_ok=True)
        delete_namespace(m.redis, NAMESPACE)
        m.close()


def main(url: str, objects: int = 2000, out=print) -> dict:
    seg_dir = _shm_dir() or tempfile.gettempdir()
    with tempfile.TemporaryDirectory(prefix="mooncake-offload-") as tmp:
        disk = Path(tmp)
        results = {
            "master_tasks_per_s": _tasks_per_s(url, seg_dir, disk / "m", objects, False, out),
            "agent_tasks_per_s": _tasks_per_s(url, seg_dir, disk / "a", objects, True, out),
            "put_64k": _put_vs_copy(url, seg_dir, KIB64, max(200, objects // 2), out),
            "put_1m": _put_vs_copy(url, seg_dir, MIB, max(50, objects // 20), out),
        }
    return results
