"""`mooncake-redis gateway`: Mooncake's master protocol for the unchanged Mooncake client
(mooncake_redis/gateway), and the options `serve` shares to start one beside its master."""
from __future__ import annotations

import signal
import socket
import threading

import click
from click.core import ParameterSource

from mooncake_redis.gateway.server import GatewayThread, Listeners
from mooncake_redis.worker import stop_on_signals

from .context import Opts, open_existing
from .logs import log_options
from .output import CliError

DEFAULT_RPC_PORT = 50051       # mooncake_master's --rpc_port
DEFAULT_METADATA_PORT = 8080   # mooncake_master's --http_metadata_server_port


def gateway_options(command):
    """--host, --rpc-port, --metadata-port and --gateway-metrics-port (defaults as mooncake_master's)."""
    for decorator in reversed([
        click.option("--host", default="127.0.0.1", show_default=True,
                     help="Address the gateway listens on (0.0.0.0: every interface)."),
        click.option("--rpc-port", type=click.IntRange(1, 65535), default=DEFAULT_RPC_PORT, show_default=True,
                     help="Port of Mooncake's master protocol (coro_rpc): the engines' master address."),
        click.option("--metadata-port", type=click.IntRange(0, 65535), default=DEFAULT_METADATA_PORT,
                     show_default=True, help="Port of the transfer engine's HTTP metadata server (0: none)."),
        click.option("--gateway-metrics-port", type=click.IntRange(0, 65535), default=0,
                     help="Serve the gateway's Prometheus metrics (per RPC) on this port (0: none)."),
    ]):
        command = decorator(command)
    return command


def port_taken(host: str, port: int) -> bool:
    """Is something listening on host:port already? (bound as asyncio binds: SO_REUSEADDR)"""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def serve_listeners(ctx: click.Context, host: str, rpc_port: int, metadata_port: int, metrics_port: int,
                    note) -> Listeners | None:
    """`serve`'s gateway: a default port that is taken is left out with a note (serve runs on
    without that listener); a port given on the command line that is taken is an error."""
    ports = {"rpc_port": rpc_port, "metadata_port": metadata_port}
    for name, port in ports.items():
        if port and port_taken(host, port):
            option = "--" + name.replace("_", "-")
            if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE:
                raise CliError(f"{option} {port}: the port is taken on {host}")
            note(f"  gateway: port {port} on {host} is taken; "
                 f"no {name.split('_')[0]} listener ({option} to choose one)")
            ports[name] = 0
    if not any(ports.values()):
        return None
    return Listeners(host, ports["rpc_port"], ports["metadata_port"], metrics_port)


def start_gateway(master, listeners: Listeners) -> GatewayThread:
    """A gateway serving `master`, started; a port that is taken is a CliError."""
    thread = GatewayThread(master, listeners)
    try:
        thread.start()
    except OSError as exc:
        raise CliError(f"the gateway cannot listen on {listeners.host}: {exc}") from None
    return thread


@click.command()
@gateway_options
@log_options
@click.pass_obj
def gateway(opts: Opts, host: str, rpc_port: int, metadata_port: int, gateway_metrics_port: int) -> None:
    """Serve Mooncake's master protocol (release 0.3.13.post1 of the client) over the store, for
    SGLang, vLLM and LMCache through Mooncake's own client, until SIGINT/SIGTERM. Stateless: any
    number of gateways may serve one store. Run `serve` or `worker` beside it for the background
    loops (client expiry, eviction, sweeps)."""
    master = open_existing(opts)
    stop = threading.Event()
    previous = stop_on_signals(stop)
    try:
        thread = start_gateway(master, Listeners(host, rpc_port, metadata_port, gateway_metrics_port))
        click.echo(thread.gateway.banner())
        try:
            stop.wait()
        finally:
            thread.stop()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        master.close()
    click.echo("gateway stopped")
