"""`mooncake-redis offload-agent`: a client's offload loop for the reference data plane
(mooncake_redis.dataplane.run_offload_agent); `mooncake-redis offload-gc`: remove the files of a
client's disk directory that no live disk replica points at (dataplane.collect_garbage)."""
from __future__ import annotations

import signal
import threading
from pathlib import Path

import click

from mooncake_redis.dataplane import collect_garbage, run_offload_agent
from mooncake_redis.worker import stop_on_signals

from .context import Opts, open_existing
from .logs import log_options
from .output import emit_json, human, json_option


@click.command("offload-agent")
@click.option("--client", "client_id", required=True, metavar="ID",
              help="The client whose memory replicas this agent offloads (the owner of their segments).")
@click.option("--disk-dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory for the offloaded bytes (<tenant>/<hex key>); created if missing.")
@click.option("--interval", type=click.FloatRange(0.01), default=0.2, show_default=True,
              help="Seconds between heartbeats while there is nothing to do.")
@click.option("--max-tasks", type=click.IntRange(1, 1024), default=256, show_default=True,
              help="Tasks (and file removals) asked for per heartbeat.")
@click.option("--capacity", type=click.IntRange(0), default=None, metavar="BYTES",
              help="Disk capacity to report (default: the size of the file system of DISK_DIR).")
@click.option("--gc-interval", type=click.FloatRange(0), default=600.0, show_default=True,
              help="Seconds between garbage collections of DISK_DIR (also one at start); 0: never.")
@click.option("--gc-min-age", type=click.FloatRange(0), default=600.0, show_default=True,
              help="Garbage collection removes only files older than this (seconds).")
@log_options
@click.pass_obj
def offload_agent(opts: Opts, client_id: str, disk_dir: Path, interval: float, max_tasks: int, capacity: int | None,
                  gc_interval: float, gc_min_age: float) -> None:
    """Mount the client's local disk and run its offload loop until SIGINT/SIGTERM: remove the
    files whose disk replicas went and acknowledge them, heartbeat, copy each task's bytes from
    its segment file to DISK_DIR, fsync, notify success. A stop finishes the batch in hand; a
    SIGKILL leaves its tasks (and removals) to time out and be handed out again."""
    master = open_existing(opts)
    stop = threading.Event()
    previous = stop_on_signals(stop)
    try:
        handled = run_offload_agent(master, client_id, disk_dir, stop, interval, max_tasks, capacity,
                                    gc_interval or None, gc_min_age)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        master.close()
    click.echo(f"offload agent {client_id} stopped after {handled} task(s)")


@click.command("offload-gc")
@click.option("--client", "client_id", required=True, metavar="ID", help="The client whose disk directory this is.")
@click.option("--disk-dir", required=True, type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="The client's disk directory (as given to offload-agent).")
@click.option("--min-age", type=click.FloatRange(0), default=600.0, show_default=True,
              help="Remove only files older than this (seconds): longer than any copy takes to be reported.")
@click.option("--dry-run", is_flag=True, help="Count what would be removed; remove nothing.")
@json_option
@click.pass_obj
def offload_gc(opts: Opts, client_id: str, disk_dir: Path, min_age: float, dry_run: bool, as_json: bool) -> None:
    """Remove the files of DISK_DIR (<tenant>/<hex key>.<random>, as offload-agent names them)
    that no live disk replica of the client points at: files of replicas lost with an unmounted
    or expired disk, removals the master counted as orphaned, copies a crash left behind. Other
    files are left alone."""
    master = open_existing(opts)
    try:
        report = collect_garbage(master, client_id, disk_dir, min_age, dry_run)
    finally:
        master.close()
    if as_json:
        emit_json("offload-gc", {"client": client_id, "disk_dir": str(disk_dir), "dry_run": dry_run,
                                 "kept": report.kept, "removed": report.removed, "skipped": report.skipped,
                                 "removed_bytes": report.removed_bytes})
        return
    verb = "would remove" if dry_run else "removed"
    click.echo(f"offload-gc {client_id}: {verb} {report.removed} file(s) ({human(report.removed_bytes)}), "
               f"kept {report.kept} referenced, skipped {report.skipped} (younger than {min_age:g} s or not "
               f"named by offload-agent)")
