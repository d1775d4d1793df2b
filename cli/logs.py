"""Logging of the long-running commands (serve, worker, metrics --port): one line per event on
stderr, with a level and, for work on a shard, the shard; `--log-format json` writes one JSON
object per line for log collectors."""
from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone

import click

# structured fields a record may carry (logging's `extra=`), copied into JSON lines
FIELDS = ("shard", "worker", "counts")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class JsonFormatter(logging.Formatter):
    """{"time", "level", "logger", "message"[, "shard", "worker", "counts"][, "exception"]}."""

    def format(self, record: logging.LogRecord) -> str:
        line = {"time": datetime.fromtimestamp(record.created, tz=timezone.utc).isoformat(timespec="milliseconds"),
                "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        line.update({f: getattr(record, f) for f in FIELDS if hasattr(record, f)})
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is when a record is emitted (not when it was created)."""

    def __init__(self):
        super().__init__()

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass


def setup_logging(log_format: str, level: str) -> None:
    """Log to stderr in `log_format` from `level` up; replaces the handler of an earlier call only."""
    handler = StderrHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, StderrHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


def log_options(command):
    """--log-format and --log-level, applied before the command runs."""
    def apply(ctx: click.Context, _param, value):
        ctx.meta.setdefault("log", {})[_param.name] = value
        settings = ctx.meta["log"]
        if len(settings) == 2:
            setup_logging(settings["log_format"], settings["log_level"])
        return value

    command = click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
                           show_default=True, expose_value=False, callback=apply,
                           help="Lowest level logged.")(command)
    return click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
                        expose_value=False, callback=apply,
                        help="Log lines on stderr: text, or one JSON object per line.")(command)
