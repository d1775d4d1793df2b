"""`mooncake-redis events`: the store's KV events (mooncake_redis.events), printed once or
followed, as text or JSON lines."""
from __future__ import annotations

import json
import signal
import threading

import click

from mooncake_redis.events import KVEvent, Position
from mooncake_redis.worker import stop_on_signals

from .context import Opts, open_existing
from .output import JSON_FORMAT, iso


def _line(ev: KVEvent) -> str:
    where = ""
    if ev.event in ("stored", "updated"):
        where = f"  {ev.size} B  memory {','.join(ev.memory) or '-'}  disk {','.join(ev.disk) or '-'}"
    key = ev.key.decode(errors="backslashreplace")
    return f"{iso(ev.ts)}  shard {ev.shard} #{ev.id.partition('-')[2]}  {ev.event:<8} {ev.tenant}/{key}{where}"


def _print(ev: KVEvent, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"command": "events", "format": JSON_FORMAT, **ev.as_dict()}))
    else:
        click.echo(_line(ev))


def _publish(master, address: str, topic: str, from_start: bool) -> None:
    try:
        import msgpack  # noqa: F401
        import zmq
    except ImportError:
        raise click.ClickException("--zmq needs pyzmq and msgpack: pip install 'mooncake-redis[events]'") from None
    from mooncake_redis.events_zmq import publish

    stop = threading.Event()
    previous = stop_on_signals(stop)
    try:
        click.echo(f"publishing KV events on {address} (topic {topic!r}, Mooncake's format); stop with Ctrl-C")
        sent = publish(master, address, stop, topic, Position() if from_start else None)
    except zmq.ZMQError as exc:
        raise click.ClickException(f"cannot publish on {address}: {exc}") from None
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    click.echo(f"stopped after {sent} batch(es)")


def _warn_lost(position: Position, told: set[int]) -> None:
    for shard in sorted(set(position.lost) - told):
        click.echo(f"warning: shard {shard}'s stream was trimmed past events not yet read "
                   f"(kv_events_maxlen bounds it)", err=True)
        told.add(shard)


@click.command("events")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events until Ctrl-C or SIGTERM.")
@click.option("--from-start", is_flag=True,
              help="With --follow: begin with the events the streams still hold (default: new ones only).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per event and line (docs/json.md).")
@click.option("--zmq", "zmq_address", default=None, metavar="ADDRESS",
              help="Publish them instead, in Mooncake's KV event format, on a ZMQ PUB socket bound at "
                   "ADDRESS (e.g. tcp://127.0.0.1:5557), until Ctrl-C or SIGTERM; needs the events extra.")
@click.option("--topic", default="mooncake", show_default=True, help="With --zmq: the topic of every message.")
@click.pass_obj
def events(opts: Opts, follow: bool, from_start: bool, as_json: bool, zmq_address: str | None, topic: str) -> None:
    """The KV events of the store (kv_events_maxlen > 0): every object stored, removed,
    evicted or updated (replicas added or gone), one line each, shard by shard. Without
    --follow: the events the streams hold, then exit. With --zmq: a publisher for KV-aware
    routers (docs/events.md)."""
    master = open_existing(opts)
    try:
        if zmq_address:
            _publish(master, zmq_address, topic, from_start)
            return
        if master.config.kv_events_maxlen == 0:
            click.echo("note: KV events are off in this store (kv_events_maxlen 0; `serve --kv-events N` "
                       "or MasterConfig(kv_events_maxlen=N) turns them on)", err=True)
        told: set[int] = set()
        if not follow:
            position = Position()
            while batch := master.events(position, count=1000):
                for ev in batch:
                    _print(ev, as_json)
            _warn_lost(position, told)
            return
        stop = threading.Event()
        previous = stop_on_signals(stop)
        try:
            position = Position() if from_start else master.events_position_now()
            for ev in master.follow(position, stop):
                _print(ev, as_json)
                _warn_lost(position, told)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
    finally:
        master.close()
