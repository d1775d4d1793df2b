"""`mooncake-redis offload-agent`: a client's offload loop for the reference data plane
(mooncake_redis.dataplane.run_offload_agent)."""
from __future__ import annotations

import signal
import threading
from pathlib import Path

import click

from mooncake_redis.dataplane import run_offload_agent
from mooncake_redis.worker import stop_on_signals

from .logs import log_options


@click.command("offload-agent")
@click.option("--client", "client_id", required=True, metavar="ID",
              help="The client whose memory replicas this agent offloads (the owner of their segments).")
@click.option("--disk-dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory for the offloaded bytes (<tenant>/<hex key>); created if missing.")
@click.option("--interval", type=click.FloatRange(0.01), default=0.2, show_default=True,
              help="Seconds between heartbeats while there is nothing to do.")
@click.option("--max-tasks", type=click.IntRange(1, 1024), default=256, show_default=True,
              help="Tasks asked for per heartbeat.")
@log_options
@click.pass_obj
def offload_agent(opts, client_id: str, disk_dir: Path, interval: float, max_tasks: int) -> None:
    """Mount the client's local disk and run its offload loop until SIGINT/SIGTERM: heartbeat,
    copy each task's bytes from its segment file to DISK_DIR, fsync, notify success. A stop
    finishes the batch in hand; a SIGKILL leaves its tasks to time out and be handed out again."""
    from .main import _open_existing

    master = _open_existing(opts)
    stop = threading.Event()
    previous = stop_on_signals(stop)
    try:
        handled = run_offload_agent(master, client_id, disk_dir, stop, interval, max_tasks)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        master.close()
    click.echo(f"offload agent {client_id} stopped after {handled} task(s)")
