"""A small same-host reference data plane: real bytes for puts, reads and offload.

A `LocalClient` mounts a segment backed by a memory-mapped file (for example under /dev/shm)
and records the file's path with the segment, so any LocalClient on the host can read any
mounted segment. `put` writes the bytes at the offsets put_start hands out and ends the put with
the data's blake3 checksum (stored with the object); `get` reads a memory replica, or, when only
a disk replica is left, the disk file, and verifies the checksum (a mismatch raises
ChecksumMismatch: never wrong bytes).

`run_offload_agent` is the client's offload loop (`mooncake-redis offload-agent`): remove the
files whose disk replicas went (remove_object_heartbeat, then acknowledge), heartbeat, copy each
task's bytes from its segment file to the disk directory, fsync, notify success (a failed copy:
notify failure, the master redelivers; a success the master refuses: the file is removed at
once). A stop request finishes the current batch. Every file gets a name of its own
(`<tenant>/<hex key>.<random>`), so a key offloaded again never lands on a file whose removal
may be in flight. `collect_garbage` (`mooncake-redis offload-gc`, and the agent at start and
every `gc_interval_s`) removes the files of the directory that no live disk replica points at:
those of replicas lost with an unmounted or expired disk, removals the master could not queue
(its queue was full: counted as orphaned), copies a crash left behind.
"""
from __future__ import annotations

import logging
import mmap
import os
import re
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from blake3 import blake3

from .config import NAME_RE, ReplicateConfig
from .errors import ErrorCode, MasterError
from .models import DiskRemoval, OffloadTask, Replica

log = logging.getLogger(__name__)


class ChecksumMismatch(MasterError):
    """The bytes read do not match the object's stored checksum."""

    def __init__(self, message: str):
        super().__init__(ErrorCode.INVALID_READ, message)


def checksum_of(data: bytes | memoryview) -> str:
    return blake3(data).hexdigest()


class SegmentFiles:
    """Memory maps of mounted segments' files, opened on first use (any segment on the host)."""

    def __init__(self, master: Any):
        self.master = master
        self._maps: dict[str, tuple[Any, mmap.mmap]] = {}
        self._lock = threading.Lock()

    def map(self, segment: str) -> mmap.mmap:
        with self._lock:
            if segment not in self._maps:
                path = self.master.segment_path(segment)
                if path is None:
                    raise MasterError(ErrorCode.SEGMENT_NOT_FOUND, f"segment {segment!r} has no recorded path")
                f = open(path, "r+b")
                self._maps[segment] = (f, mmap.mmap(f.fileno(), 0))
            return self._maps[segment][1]

    def read(self, segment: str, offset: int, size: int) -> bytes:
        return self.map(segment)[offset:offset + size]

    def close(self) -> None:
        with self._lock:
            for f, mm in self._maps.values():
                mm.close()
                f.close()
            self._maps.clear()


class LocalClient:
    def __init__(self, master: Any, client_id: str, segment: str, path: str | os.PathLike, size: int,
                 disk_dir: str | os.PathLike | None = None):
        self.master = master
        self.client_id = client_id
        self.segment = segment
        self.path = str(path)
        self.size = size
        self.disk_dir = Path(disk_dir) if disk_dir is not None else None
        with open(self.path, "wb") as f:
            f.truncate(size)
        self.files = SegmentFiles(master)
        master.mount_segment(segment, size, client_id, path=self.path)
        if self.disk_dir is not None:
            self.disk_dir.mkdir(parents=True, exist_ok=True)
            master.mount_local_disk_segment(client_id)

    def put(self, key: Any, data: bytes, config: ReplicateConfig | None = None, tenant_id: str = "default") -> None:
        replicas = self.master.put_start(self.client_id, key, len(data), config, tenant_id=tenant_id)
        try:
            for r in replicas:
                self.files.map(r.segment)[r.offset:r.offset + len(data)] = data
        except BaseException:
            self.master.put_revoke(self.client_id, key, tenant_id=tenant_id)
            raise
        self.master.put_end(self.client_id, key, tenant_id=tenant_id, checksum=checksum_of(data))

    def put_many(self, items: Sequence[tuple[Any, bytes]], config: ReplicateConfig | None = None,
                 tenant_id: str = "default") -> list[ErrorCode]:
        """put of several objects in two master round trips (batch_put_start, then the writes,
        then batch_put_end with their checksums). Returns a code per item; a write that fails
        revokes every put of the call that is not ended yet."""
        keys = [k for k, _ in items]
        starts = self.master.batch_put_start(self.client_id, keys, [len(d) for _, d in items], config, tenant_id)
        codes: list[ErrorCode] = [r if isinstance(r, ErrorCode) else ErrorCode.OK for r in starts]
        started = [i for i, r in enumerate(starts) if not isinstance(r, ErrorCode)]
        try:
            for i in started:
                data = items[i][1]
                for r in starts[i]:
                    self.files.map(r.segment)[r.offset:r.offset + len(data)] = data
        except BaseException:
            self.master.batch_put_revoke(self.client_id, [keys[i] for i in started], tenant_id=tenant_id)
            raise
        ended = self.master.batch_put_end(self.client_id, [keys[i] for i in started], tenant_id=tenant_id,
                                          checksums=[checksum_of(items[i][1]) for i in started])
        for i, code in zip(started, ended):
            codes[i] = code
        return codes

    def get(self, key: Any, tenant_id: str = "default") -> bytes:
        result = self.master.get_replica_list(key, tenant_id)
        last: Exception | None = None
        for r in result.replicas:  # memory first, then disk
            try:
                data = self._read(r)
            except (OSError, MasterError) as exc:
                last = exc
                continue
            if result.checksum is not None and checksum_of(data) != result.checksum:
                last = ChecksumMismatch(
                    f"{key!r}: {r.kind} replica {r.segment or r.location} does not match its checksum")
                continue
            return data
        if last is not None:
            raise last
        raise MasterError(ErrorCode.OBJECT_NOT_FOUND, f"{key!r} has no replica")

    def _read(self, r: Replica) -> bytes:
        if r.kind == "disk":
            assert r.location is not None  # a disk replica has one
            with open(r.location, "rb") as f:
                return f.read()
        return self.files.read(r.segment, r.offset, r.size)

    def close(self) -> None:
        self.files.close()
        try:
            self.master.unmount_segment(self.segment, self.client_id)
        finally:
            if self.disk_dir is not None:
                try:
                    self.master.unmount_local_disk_segment(self.client_id)
                except MasterError:
                    pass

    def __enter__(self) -> "LocalClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def disk_path(disk_dir: Path, task: OffloadTask) -> Path:
    """Where a task's bytes go: <disk_dir>/<tenant>/<hex of the key>.<12 random hex digits>, a
    new name for every copy."""
    return disk_dir / task.tenant_id / f"{task.key.hex()}.{secrets.token_hex(6)}"


DISK_FILE_RE = re.compile(r"([0-9a-f]+)\.[0-9a-f]{12}")  # the names disk_path gives


def write_durably(path: Path, data: bytes) -> None:
    """Write to a temporary name, fsync, rename over, fsync the directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def offload_batch(master: Any, client_id: str, disk_dir: Path, files: SegmentFiles, max_tasks: int = 256) -> int:
    """One heartbeat and its tasks: copy, fsync, notify. Returns the tasks handled."""
    tasks = master.offload_object_heartbeat(client_id, max_tasks)
    done: dict[str, tuple[list[bytes], list[str]]] = {}
    failed: dict[str, list[bytes]] = {}
    for task in tasks:
        try:
            path = disk_path(disk_dir, task)
            write_durably(path, files.read(task.segment, task.offset, task.size))
            keys, locations = done.setdefault(task.tenant_id, ([], []))
            keys.append(task.key)
            locations.append(str(path))
        except (OSError, MasterError, ValueError):
            log.exception("offload of %r failed", task.key)
            failed.setdefault(task.tenant_id, []).append(task.key)
    for tenant, (keys, locations) in done.items():
        codes = master.notify_offload_success(client_id, keys, locations, tenant_id=tenant)
        for location, code in zip(locations, codes):
            if code != ErrorCode.OK:  # not recorded (the object went meanwhile): nobody's file
                Path(location).unlink(missing_ok=True)
    for tenant, keys in failed.items():
        master.notify_offload_failure(client_id, keys, tenant_id=tenant)
    return len(tasks)


def _inside(disk_dir: Path, location: str) -> Path | None:
    """The file at `location` if it lies under `disk_dir` (nothing else is ever removed)."""
    path = Path(location)
    try:
        path.resolve().relative_to(disk_dir.resolve())
    except (ValueError, OSError):
        return None
    return path


def remove_batch(master: Any, client_id: str, disk_dir: Path, max_items: int = 256) -> int:
    """One remove_object_heartbeat: remove each file, then acknowledge them all. A location
    outside `disk_dir` is acknowledged without touching it (logged). Returns the removals."""
    removals = master.remove_object_heartbeat(client_id, max_items)
    done: list[DiskRemoval] = []
    for r in removals:
        path = _inside(disk_dir, r.location)
        try:
            if path is None:
                log.warning("removal of %r outside the disk directory %s ignored", r.location, disk_dir)
            else:
                path.unlink(missing_ok=True)
            done.append(r)
        except OSError:
            log.exception("removal of %s failed (handed out again after the task timeout)", r.location)
    if done:
        master.ack_remove_object_heartbeat(client_id, done)
    return len(removals)


@dataclass
class GarbageReport:
    """What collect_garbage saw: files kept (a live disk replica points at them), removed, and
    skipped (too young, or not named as the agent names its files)."""
    kept: int = 0
    removed: int = 0
    skipped: int = 0
    removed_bytes: int = 0


def collect_garbage(master: Any, client_id: str, disk_dir: str | os.PathLike, min_age_s: float = 600.0,
                    dry_run: bool = False, batch: int = 256) -> GarbageReport:
    """Remove the files under `disk_dir` (named `<tenant>/<hex key>.<random>`) that no live disk
    replica of `client_id` points at and that are older than `min_age_s` (a copy is written before
    its success is reported: the age must exceed that gap; leftover `.tmp` files of that age go
    too). Other files are left alone."""
    disk = Path(disk_dir)
    report = GarbageReport()
    cutoff = time.time() - min_age_s
    candidates: list[tuple[DiskRemoval, Path, int]] = []

    def check() -> None:
        referenced = master.disk_referenced(client_id, [c[0] for c in candidates])
        for (_, path, size), ref in zip(candidates, referenced):
            if ref:
                report.kept += 1
                continue
            if not dry_run:
                path.unlink(missing_ok=True)
            report.removed += 1
            report.removed_bytes += size
        candidates.clear()

    if not disk.is_dir():
        return report
    for tenant_dir in sorted(p for p in disk.iterdir() if p.is_dir()):
        for path in sorted(tenant_dir.iterdir()):
            try:
                st = path.stat()
            except OSError:
                continue
            tmp = path.name.endswith(".tmp")
            m = DISK_FILE_RE.fullmatch(path.name[:-4] if tmp else path.name)
            if not path.is_file() or st.st_mtime > cutoff or not m or not NAME_RE.fullmatch(tenant_dir.name):
                report.skipped += 1
                continue
            if tmp:  # a copy that never finished
                if not dry_run:
                    path.unlink(missing_ok=True)
                report.removed += 1
                report.removed_bytes += st.st_size
                continue
            candidates.append((DiskRemoval(bytes.fromhex(m.group(1)), tenant_dir.name, str(path)), path, st.st_size))
            if len(candidates) >= batch:
                check()
    if candidates:
        check()
    return report


def run_offload_agent(master: Any, client_id: str, disk_dir: str | os.PathLike, stop: threading.Event,
                      interval_s: float = 0.2, max_tasks: int = 256, capacity_bytes: int | None = None,
                      gc_interval_s: float | None = 600.0, gc_min_age_s: float = 600.0) -> int:
    """The client's offload loop until `stop` is set (the batch in hand is finished first):
    file removals, then offload tasks; a garbage collection at start and every `gc_interval_s`
    (None: never). Returns the tasks handled."""
    disk = Path(disk_dir)
    disk.mkdir(parents=True, exist_ok=True)
    master.mount_local_disk_segment(client_id)
    if capacity_bytes is None:
        st = os.statvfs(disk)
        capacity_bytes = st.f_frsize * st.f_blocks
    master.report_ssd_capacity(client_id, capacity_bytes)
    files = SegmentFiles(master)
    handled = 0
    next_gc = time.monotonic()
    try:
        while not stop.is_set():
            if gc_interval_s is not None and time.monotonic() >= next_gc:
                collect_garbage(master, client_id, disk, gc_min_age_s)
                next_gc = time.monotonic() + gc_interval_s
            removed = remove_batch(master, client_id, disk, max_tasks)
            n = offload_batch(master, client_id, disk, files, max_tasks)
            handled += n
            if n == 0 and removed == 0:
                stop.wait(interval_s)
    finally:
        files.close()
    return handled
