"""Output helpers shared by the CLI's commands: times, durations, byte counts in human units,
aligned tables."""
from __future__ import annotations

from datetime import datetime, timezone


def iso(ms: int) -> str:
    """Absolute store-clock milliseconds as ISO 8601 UTC with milliseconds."""
    t = datetime.fromtimestamp(ms // 1000, tz=timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S") + f".{ms % 1000:03d}Z"


def span(ms: int) -> str:
    ms = abs(ms)
    if ms < 1000:
        return f"{ms} ms"
    if ms < 120_000:
        return f"{ms / 1000:.1f} s"
    if ms < 7_200_000:
        return f"{ms / 60_000:.1f} min"
    return f"{ms / 3_600_000:.1f} h"


def deadline(until_ms: int | None, now_ms: int) -> str:
    """"none", or the deadline with how far it is from the store clock."""
    if not until_ms:
        return "none"
    when = f"{iso(until_ms)} ({until_ms} ms)"
    if until_ms > now_ms:
        return f"{when}, active, {span(until_ms - now_ms)} left"
    return f"{when}, expired {span(now_ms - until_ms)} ago"


def human(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def pct(used: int, capacity: int) -> str:
    return f"{100.0 * used / capacity:.1f}%" if capacity else "-"


def table(header: list[str], rows: list[list[object]], left: int = 1) -> list[str]:
    """Plain aligned columns: the first `left` left-aligned, the rest right-aligned."""
    cells = [[str(c) for c in row] for row in [header, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return ["  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in cells]
