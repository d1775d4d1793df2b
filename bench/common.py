"""Helpers shared by the benchmarks."""
from __future__ import annotations

import contextlib
import os
import platform
from typing import Any, Iterator

from mooncake_redis.server import EmbeddedValkey, private_valkey

# The eviction geometry of the eviction step benchmarks (not the store's defaults, 0.99 / 0.01):
# a step starts above 90% and evicts down to 85%, room enough for many steps to take a median of.
WIDE_WATERMARKS: dict[str, Any] = {"eviction_high_watermark_ratio": 0.90, "eviction_ratio": 0.05}


def cpu_model() -> str:
    """The CPU's model name, for the header of a benchmark's output."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def delete_keys(client, *patterns: str) -> int:
    """SCAN + DEL every key matching one of `patterns`; returns how many were deleted."""
    deleted, doomed = 0, []
    for key in (k for match in patterns for k in client.scan_iter(match=match, count=1000)):
        doomed.append(key)
        if len(doomed) >= 1000:
            deleted += client.delete(*doomed)
            doomed = []
    if doomed:
        deleted += client.delete(*doomed)
    return deleted


def delete_namespace(client, namespace: str) -> int:
    """SCAN + DEL every `<namespace>:*` key; returns how many were deleted."""
    return delete_keys(client, f"{namespace}:*")


@contextlib.contextmanager
def url_or_private_valkey(url: str | None) -> Iterator[tuple[str, EmbeddedValkey | None]]:
    """(url, None) for a bench given a server; without one, (its URL, the server) of a private
    throw-away Valkey (no AOF) for the duration of the block (mooncake_redis.server.private_valkey)."""
    if url is not None:
        yield url, None
        return
    with private_valkey() as server:
        yield server.url, server


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (Linux /proc; 0.0 elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
