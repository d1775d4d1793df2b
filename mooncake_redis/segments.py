"""Segments and clients: mount (one slice per shard), unmount and the dead-replica sweep that
follows it, client pings, and the list of mounted segments."""
from __future__ import annotations

from typing import Any, Callable

from . import wire
from .api import ApiBase
from .checks import _check_int, _check_name
from .errors import MasterError
from .figures import Figures, note
from .keys import segment_slice
from .steps import Steps
from .transport import CHUNK_OF

MAX_GRACE_MS = 10**15  # as the function's bound: now + it stays below 2^53
DRAIN_BATCH = 64  # gracefully unmounting segments finish_drains looks at per call


class SegmentsApi(ApiBase):
    def mount_segment(self, name: str, size: int, client_id: str, base: int = 0, path: str | None = None,
                      host: str | None = None) -> None:
        """Mount a segment (one slice per shard). `path`: where a reader on the same host finds
        its bytes (the reference data plane's memory-mapped file), recorded with the segment.
        `host`: the node it is on (Mooncake's host_id); puts with prefer_same_host and that host
        try its segments first. At most 64 segments per host (HOST_SEGMENTS_EXCEEDED)."""
        _check_name(name, "segment name", 1024)
        if path is not None:
            _check_name(path, "path", 4096)
        if host is not None:
            _check_name(host, "host")
        _check_name(client_id, "client_id")
        _check_int(size, "size", self.shards)
        _check_int(base, "base", 0)
        _check_int(base + size, "base + size", 1)
        t = self.transport
        slices = [segment_slice(base, size, shard, self.shards) for shard in range(self.shards)]
        t.run([t.command("mc_mount_segment", shard, *wire.options(name=name, client_id=client_id, base=lo, size=length,
                                                                     path=path, host=host))
               for shard, (lo, length) in enumerate(slices)])

    def unmount_segment(self, name: str, client_id: str,
                        progress: Callable[[int], None] | None = None, sweep: bool = True) -> int:
        """Unmount on every shard (replicas hide at once), then sweep the dead replicas out of
        the object hashes in bounded steps (sweep=False leaves that to the workers, which sweep
        a shard whose sweep marker is set). Returns how many objects were left with no replica
        and deleted."""
        _check_name(name, "segment name", 1024)
        _check_name(client_id, "client_id")
        argv = wire.options(name=name, client_id=client_id)
        results = self.transport.each("mc_unmount_segment", *argv, raise_on_error=False)
        errors = [r for r in results if isinstance(r, MasterError)]
        if len(errors) == len(results):
            raise errors[0]
        if not sweep:
            return 0
        return sum(self.sweep_shard(shard, progress) for shard in range(self.shards))

    def graceful_unmount_segment(self, name: str, client_id: str, grace_ms: int) -> None:
        """Stop allocating on the segment at once (every shard); its objects stay readable until
        the segment drains (every slice empty) or `grace_ms` passes, then the worker unmounts
        it (finish_drains). A second call keeps the earlier deadline. Errors as unmount_segment
        (SEGMENT_NOT_FOUND, ILLEGAL_CLIENT)."""
        _check_name(name, "segment name", 1024)
        _check_name(client_id, "client_id")
        _check_int(grace_ms, "grace_ms", 0, MAX_GRACE_MS)
        results = self.transport.each("mc_graceful_unmount_segment",
                                      *wire.options(name=name, client_id=client_id, grace_ms=grace_ms),
                                      raise_on_error=False)
        errors = [r for r in results if isinstance(r, MasterError)]
        if len(errors) == len(results):
            raise errors[0]

    def finish_drains(self, max_segments: int = DRAIN_BATCH) -> int:
        """Unmount every gracefully unmounting segment (up to `max_segments`, the earliest
        deadlines first) whose slices are all empty or past their deadline: on every shard,
        shard 0 last (the gateway's facts of a segment last as long as its slice on shard 0).
        Idempotent; a worker step. Returns the segments unmounted."""
        _check_int(max_segments, "max_segments", 1, 1024)
        t = self.transport
        listed = t.run([("ZRANGE", k.segments_draining, 0, max_segments - 1) for k in t.keys])
        names = list(dict.fromkeys(n for shard_names in listed for n in shard_names))[:max_segments]
        if not names:
            return 0
        order = [*range(1, t.count), 0]
        states = t.run([t.command("mc_finish_drain", shard, *wire.options(name=n)) for n in names for shard in order])
        finished = 0
        for i, name in enumerate(names):
            row = states[i * t.count:(i + 1) * t.count]
            if any(s == b"wait" for s in row):
                continue
            drop = wire.options(name=name, op="drop")
            dropped = t.run([t.command("mc_finish_drain", shard, *drop) for shard in order])
            finished += 1 if any(dropped) else 0
        return finished

    def segment_status(self, name: str) -> str | None:
        """"OK" (mounted), "GRACEFULLY_UNMOUNTING" (some slice is draining), or None (not mounted)."""
        _check_name(name, "segment name", 1024)
        rows = self.transport.run([("HMGET", k.segment(name), "size", "draining_until") for k in self.transport.keys])
        if all(size is None for size, _ in rows):
            return None
        return "GRACEFULLY_UNMOUNTING" if any(d is not None for _, d in rows) else "OK"

    def sweep_shard(self, shard: int, on_batch: Callable[[int], Any] | None = None) -> int:
        """Drop replicas on unmounted segments from every object of one shard (SCAN, then
        bounded mc_sweep_replicas calls), then clear the shard's sweep marker unless another
        unmount happened meanwhile. `on_batch(objects scanned)` returning False stops early and
        leaves the marker set, so a worker sweeps again later. Returns objects deleted."""
        _check_int(shard, "shard", 0, self.shards - 1)
        token = self.transport.run([("GET", self.transport.keys[shard].sweep_pending)])[0] or b""
        deleted = scanned = 0
        for tenant, keys in self.transport.scan_objects(shard):
            size = CHUNK_OF["mc_sweep_replicas"]
            for start in range(0, len(keys), size):
                deleted += self.transport.call("mc_sweep_replicas", shard, *wire.head(wire.KEY, tenant=tenant),
                                               *keys[start:start + size])
            scanned += len(keys)
            if on_batch and on_batch(scanned) is False:
                return deleted
        self.transport.call("mc_sweep_done", shard, token)
        return deleted

    def ping(self, client_id: str) -> str:
        """Record liveness; returns "OK", or "NEED_REMOUNT" when some shard does not know the
        client (never mounted, or expired by the client-TTL cleanup)."""
        return self.drive(self.ping_steps(client_id))

    def ping_steps(self, client_id: str) -> Steps[str]:
        _check_name(client_id, "client_id")
        t = self.transport
        known = yield [t.command("mc_ping", shard, *wire.options(client_id=client_id)) for shard in range(t.count)]
        return "OK" if all(known) else "NEED_REMOUNT"

    # ---- inspection ------------------------------------------------------------------
    def segment_path(self, name: str) -> str | None:
        """The path recorded when the segment was mounted, or None (no path, or not mounted)."""
        _check_name(name, "segment name", 1024)
        path = self.transport.run([("HGET", self.transport.keys[0].segment(name), "path")])[0]
        return path.decode() if path is not None else None


    def segments(self) -> list[dict[str, Any]]:
        """Mounted segments with per-shard slices summed: name, client, size, used."""
        names = self.transport.run([("ZRANGE", k.segments, 0, -1) for k in self.transport.keys])
        wanted = [(k, name) for k, shard_names in zip(self.transport.keys, names) for name in shard_names]
        rows = self.transport.run([("HGETALL", k.segment(name)) for k, name in wanted]) if wanted else []
        merged: dict[str, dict[str, Any]] = {}
        for (k, name), row in zip(wanted, rows):
            if not row:
                continue
            text = name.decode(errors="backslashreplace")  # names and ids are bytes on the wire
            client = row.get(b"client", b"").decode(errors="backslashreplace")
            seg = merged.setdefault(text, {"name": text, "client": client, "size": 0, "used": 0})
            f = Figures(f"P:seg:{text}.")  # a malformed figure reads as 0, with a warning
            seg["size"] += f.get("size", row.get(b"size"))
            seg["used"] += f.get("used", row.get(b"used"))
            note(self.malformed_seen, k.shard, [f"P:seg:{text}.size", f"P:seg:{text}.used"], f.malformed)
        return list(merged.values())

