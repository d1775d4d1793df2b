"""Output helpers shared by the CLI's commands: times, durations, byte counts in human units,
aligned tables, the --json convention, progress lines."""
from __future__ import annotations

import json
import sys
from dataclasses import asdict, is_dataclass
from datetime import datetime, timezone
from enum import Enum
from typing import Callable, Sequence

import click


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


def table(header: list[str], rows: Sequence[Sequence[object]], left: int = 1) -> list[str]:
    """Plain aligned columns: the first `left` left-aligned, the rest right-aligned."""
    cells = [list(header)] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return ["  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in cells]


# ---- --json ------------------------------------------------------------------------------
# One JSON object on stdout per command run, its fields documented in docs/json.md. Every
# object starts with "command" and "format" (JSON_FORMAT: raised only when a field changes
# meaning or goes away; new fields may appear at any time). Byte counts are exact integers
# named *_bytes, times are store-clock milliseconds named *_ms; messages stay on stderr.

JSON_FORMAT = 1


def json_option(command):
    """The --json flag (parameter `as_json`) of a command with a documented JSON output."""
    return click.option("--json", "as_json", is_flag=True,
                        help="Print one JSON object (fields: docs/json.md) instead of text.")(command)


def emit_json(command: str, body: dict) -> None:
    click.echo(json.dumps({"command": command, "format": JSON_FORMAT, **body}, default=_plain))


def _plain(value):
    if isinstance(value, bytes):  # names and ids are bytes on the wire: any byte shows, as \xNN
        return value.decode(errors="backslashreplace")
    if is_dataclass(value):
        return asdict(value)
    if isinstance(value, Enum):
        return value.value
    raise TypeError(f"not JSON: {type(value).__name__}")


def text(value) -> str:
    """A name or id read from Redis as text (bytes that are not UTF-8 show as \\xNN)."""
    return value.decode(errors="backslashreplace") if isinstance(value, bytes) else str(value)


# ---- progress ----------------------------------------------------------------------------

PLAIN_PROGRESS_EVERY = 100_000  # off a terminal: one line per this many items


class Progress:
    """A progress callback (count so far); done() ends its output."""

    def __init__(self, show: Callable[[int], None], done: Callable[[], None]):
        self.show, self.done = show, done

    def __call__(self, n: int) -> None:
        self.show(n)


def progress_printer(label: str, every: int = PLAIN_PROGRESS_EVERY) -> Progress:
    """A progress callback (count so far) for stderr: one line rewritten in place on a terminal;
    elsewhere (a file, a pipe, a log collector) a plain line each time `every` more are done."""
    if sys.stderr.isatty():
        def show(n: int) -> None:
            click.echo(f"\r  {n} {label}", nl=False, err=True)
        return Progress(show, lambda: click.echo("", err=True))
    shown = [0]

    def plain(n: int) -> None:
        if n // every > shown[0] // every:
            click.echo(f"  {n} {label}", err=True)
        shown[0] = n
    return Progress(plain, lambda: None)


class CliError(click.ClickException):
    """A failure the operator must act on (exit 2), printed as "error: <message>"."""

    exit_code = 2

    def show(self, file=None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)
