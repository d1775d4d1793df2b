"""Commands on a running store: `worker` (the background loops), `evict` (eviction now),
`expire-guaranteed`, `fsck` (audit and repair) and `metrics` (Prometheus)."""
from __future__ import annotations

import signal
import threading

import click

from mooncake_redis.master import EVICT_STEP_UNITS
from mooncake_redis.worker import Worker, stop_on_signals

from .context import MetricsAddress, Opts, metrics_endpoint, metrics_options, open_existing, run_background, safe_url
from .logs import log_options
from .output import emit_json, human, json_option, progress_printer


@click.command()
@click.option("--interval", type=click.FloatRange(0.01), default=0.2, show_default=True,
              help="Seconds between passes.")
@click.option("--step-units", type=click.IntRange(1, 1024), default=EVICT_STEP_UNITS, show_default=True,
              help="Units evicted at most per eviction step (one atomic call).")
@metrics_options
@log_options
@click.pass_obj
def worker(opts: Opts, interval: float, step_units: int, metrics_port: int | None, metrics_addr: str) -> None:
    """Run the background loops against --redis until SIGINT/SIGTERM: eviction, discard and
    release of abandoned puts, client-TTL expiry, dead-replica sweeps, offload redelivery. Any number of workers
    may run; shards are claimed with short leases so work is not repeated."""
    stop = threading.Event()
    previous = stop_on_signals(stop)  # before connecting: a SIGTERM while it connects is a clean stop
    try:
        master = open_existing(opts)
    except BaseException:
        for s, handler in previous.items():
            signal.signal(s, handler)
        raise
    try:
        background = Worker(master, step_units=step_units)
        with metrics_endpoint(master, MetricsAddress(metrics_port, metrics_addr) if metrics_port else None, background):
            run_background(master, stop, background, interval)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        master.close()
    # the worker logs its own stop line ("worker <id> stopped after N pass(es)")


@click.command()
@click.option("--step-units", type=click.IntRange(1, 1024), default=EVICT_STEP_UNITS, show_default=True,
              help="Units evicted at most per eviction step (one atomic call; a group costs one unit "
                   "per member).")
@json_option
@click.pass_obj
def evict(opts: Opts, step_units: int, as_json: bool) -> None:
    """Run eviction now, in bounded steps, until every shard is at its target or has nothing
    evictable; print what was evicted and where each shard ended."""
    master = open_existing(opts)
    try:
        report = master.run_eviction(step_units)
    finally:
        master.close()
    if as_json:
        emit_json("evict", {
            "evicted_units": report.evicted_units, "evicted_objects": report.evicted_objects,
            "evicted_bytes": report.evicted_bytes, "steps": report.steps, "queued": report.queued_objects,
            "shards": [{"shard": s.shard, "state": s.state, "used_bytes": s.used_bytes,
                        "target_bytes": s.target_bytes} for s in report.final]})
        return
    click.echo(f"evicted {report.evicted_units} unit(s), {report.evicted_objects} object(s), "
               f"{human(report.evicted_bytes)} in {report.steps} step(s)"
               + (f"; {report.queued_objects} object(s) queued for offload first" if report.queued_objects else ""))
    for step in report.final:
        click.echo(f"  shard {step.shard}: {step.state}, used {human(step.used_bytes)}, "
                   f"target {human(step.target_bytes)}")


@click.command("expire-guaranteed")
@click.argument("prefixes", nargs=-1, required=True)
@click.option("--tenant", default="default", show_default=True, help="Tenant id of the objects.")
@json_option
@click.pass_obj
def expire_guaranteed(opts: Opts, prefixes: tuple[str, ...], tenant: str, as_json: bool) -> None:
    """End at once the guarantees of the tenant's objects whose key has one of these prefix
    hashes (a key without one is its own prefix); they become ordinary objects, which eviction
    may take. Prints, per prefix, how many active guarantees ended."""
    master = open_existing(opts)
    try:
        ended = master.expire_guaranteed(list(prefixes), tenant)
    finally:
        master.close()
    if as_json:
        emit_json("expire-guaranteed", {"tenant": tenant, "ended": sum(ended),
                                        "prefixes": [{"prefix": p, "ended": n} for p, n in zip(prefixes, ended)]})
        return
    for prefix, n in zip(prefixes, ended):
        click.echo(f"{prefix}  {n} guarantee(s) ended")



@click.command("fsck")
@click.option("--repair", is_flag=True, help="Fix what can be fixed (overlapping extents are only reported).")
@json_option
@click.pass_obj
def fsck_cmd(opts: Opts, repair: bool, as_json: bool) -> None:
    """Audit: recompute every derived structure (used bytes, free lists, candidate and deadline
    indexes, group membership) from the object hashes, in bounded batches on a live store.
    Progress goes to stderr (rewritten in place on a terminal, plain lines otherwise).
    Exit code 0 when clean (or everything found was repaired), 1 otherwise."""
    from mooncake_redis.fsck import fsck

    master = open_existing(opts)
    progress = progress_printer("objects checked")
    try:
        report = fsck(master, repair=repair, progress=progress)
    finally:
        progress.done()
        master.close()
    clean = not report.unrepaired and not report.unverified
    if as_json:
        emit_json("fsck", {
            "clean": clean, "repair": repair, "shards": report.shards, "objects_checked": report.objects_checked,
            "findings": [{"kind": f.kind, "shard": f.shard, "subject": f.subject, "expected": f.expected,
                          "found": f.found, "severity": f.severity, "repairable": f.repairable,
                          "repaired": f.repaired, "note": f.note} for f in report.findings],
            "unverified": [{"shard": s, "reason": why} for s, why in sorted(report.unverified.items())]})
    else:
        click.echo(report.summary())
    if not clean:
        raise click.exceptions.Exit(1)


# ---- metrics ---------------------------------------------------------------------------

@click.command("metrics")
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help="Serve the metrics on this port (GET /metrics) until SIGINT/SIGTERM, instead of "
                   "printing them once.")
@click.option("--addr", default="127.0.0.1", show_default=True,
              help="Address to listen on with --port (0.0.0.0: every interface).")
@json_option
@log_options
@click.pass_obj
def metrics_cmd(opts: Opts, port: int | None, addr: str, as_json: bool) -> None:
    """The store's Prometheus metrics (text exposition format): per shard capacity, used bytes,
    objects, puts in progress, held extents, clients, segments, eviction candidates per tier,
    and the workers' counters (evictions, discarded puts, expired clients, passes). Names and
    meanings: docs/operations.md. Read-only."""
    from mooncake_redis.metrics import exposition, metric_families

    if as_json and port is not None:
        raise click.UsageError("--json prints the metrics once: it cannot be used with --port")
    master = open_existing(opts)
    try:
        if as_json:
            emit_json("metrics", {"metrics": metric_families(master)})
            return
        if port is None:
            click.echo(exposition(master), nl=False)
            return
        stop = threading.Event()
        previous = stop_on_signals(stop)
        try:
            with metrics_endpoint(master, MetricsAddress(port, addr)):
                click.echo(f"metrics of {safe_url(opts.require_url())} namespace {master.ns} on "
                           f"http://{addr}:{port}/metrics; stop with Ctrl-C or SIGTERM")
                stop.wait()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
    finally:
        master.close()

