"""What every command shares: the global options (Opts), URL handling (where the URL comes from,
masking its passwords in messages), opening an existing store, and the metrics endpoint and
background worker that `serve`, `worker` and `metrics` run. Imports no command module."""
from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import click
import redis
from click.core import ParameterSource

from mooncake_redis import Master, MasterConfig, MasterError
from mooncake_redis.functions import check_schema
from mooncake_redis.keys import ShardKeys
from mooncake_redis.master import client_from_url
from mooncake_redis.server import URL_FILE, valkey_binary
from mooncake_redis.transport import check_url
from mooncake_redis.worker import Worker

from .output import CliError

CONNECT_TIMEOUT_S = 5.0
DEFAULT_DATA_DIR = "./mooncake-data"
DATA_DIR_ENV = "MOONCAKE_DATA_DIR"


@dataclass
class Opts:
    url: str | None
    namespace: str
    url_file: Path | None = None  # where `url` was read, when it came from a serve data directory
    url_from_env: bool = False  # `url` is MOONCAKE_REDIS_URL's: no --redis on the command line

    def throwaway_url(self, command: str) -> str | None:
        """The URL for a command that otherwise makes a throw-away server of its own (replay,
        the benches): --redis from the command line only. A URL from MOONCAKE_REDIS_URL names
        the shell's server, not one to write (and empty) a scratch namespace on: it is noted and
        not used."""
        if self.url and self.url_from_env:
            click.echo(f"note: {command} runs on a private Valkey; MOONCAKE_REDIS_URL is not used "
                       f"(pass --redis to run it on a server)", err=True)
            return None
        return self.url

    def require_url(self) -> str:
        """--redis / MOONCAKE_REDIS_URL, else the URL that `serve` wrote in its data directory
        ($MOONCAKE_DATA_DIR, default ./mooncake-data)."""
        if self.url:
            return self.url
        path = Path(os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR) / URL_FILE
        try:
            self.url = path.read_text().strip() or None
        except (FileNotFoundError, NotADirectoryError):
            pass
        except OSError as exc:
            raise CliError(f"cannot read {path}: {exc}") from None
        if not self.url:
            raise click.UsageError(f"no Redis: pass --redis URL, set MOONCAKE_REDIS_URL, or run where "
                                   f"`mooncake-redis serve` keeps its data ({path} not found; "
                                   f"env {DATA_DIR_ENV} names another data directory)")
        self.url_file = path
        return self.url


# ---- --redis and --namespace -------------------------------------------------------------

REDIS_HELP = ("Redis/Valkey URL (redis://host:port/db, rediss://, unix://, "
              "redis+cluster://host:port[,host:port...] for a Redis Cluster). "
              "Env: MOONCAKE_REDIS_URL. `serve` without it starts a private Valkey; other "
              "commands without it use the URL of that Valkey (the `url` file of "
              "$MOONCAKE_DATA_DIR, default ./mooncake-data).")
NAMESPACE_HELP = "Key namespace of the store (keys start with <ns>:{<ns>:<shard>})."


def checked_url(_ctx: click.Context | None, _param: click.Parameter | None, value: str | None) -> str | None:
    """--redis's callback: a URL of a form no client can use is a usage error (exit 2), not a
    traceback at the first command."""
    if value:
        try:
            check_url(value)
        except MasterError as exc:
            source = (_ctx.get_parameter_source(_param.name) if _ctx is not None and _param is not None
                      and _param.name else None)
            where = "MOONCAKE_REDIS_URL: " if source == ParameterSource.ENVIRONMENT else ""
            raise click.BadParameter(where + redact(exc.message, value)) from None
    return value


def _opts(ctx: click.Context) -> Opts:
    opts = ctx.find_object(Opts)
    if opts is None:  # the command run on its own, without the group
        opts = ctx.obj = Opts(None, "mc")
    return opts


def _command_url(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if checked_url(ctx, param, value):
        opts = _opts(ctx)
        opts.url, opts.url_file, opts.url_from_env = value, None, False


def _command_namespace(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        _opts(ctx).namespace = value


def accept_store_options(command: click.Command, namespace: bool = True) -> click.Command:
    """Let `--redis` (and `--namespace`) also follow the command's name (`mooncake-redis serve
    --redis URL`); given there, they win over the same options before the name."""
    command.params.append(click.Option(["--redis", "redis_url"], metavar="URL", default=None, expose_value=False,
                                       callback=_command_url,
                                       help="As `mooncake-redis --redis URL COMMAND` (given here, this one counts)."))
    if namespace:
        command.params.append(click.Option(["--namespace"], default=None, expose_value=False,
                                           callback=_command_namespace,
                                           help="As `mooncake-redis --namespace NS COMMAND` (default mc)."))
    return command


# ---- URLs in messages ------------------------------------------------------------------

_QUERY_PASSWORD = re.compile(r"([?&;]password=)([^&;#]*)", re.IGNORECASE)


def _split_userinfo(url: str) -> tuple[str, str, str]:
    """(text up to the user name, "user:password" or "", the rest), splitting as urlsplit does:
    the netloc ends at the first / ? #, the user info at its last @."""
    head, sep, rest = url.partition("//")
    if not sep:
        return url, "", ""
    end = min([i for i in (rest.find(c) for c in "/?#") if i >= 0] or [len(rest)])
    userinfo, at, host = rest[:end].rpartition("@")
    if not at:
        return url, "", ""
    return head + sep, userinfo, "@" + host + rest[end:]


def safe_url(url: str) -> str:
    """The URL with its passwords (user info and ?password=) masked, for messages; works on
    URLs that do not parse, too."""
    head, userinfo, rest = _split_userinfo(url)
    if ":" in userinfo:
        url = head + userinfo.partition(":")[0] + ":***" + rest
    return _QUERY_PASSWORD.sub(r"\1***", url)


def url_password(url: str) -> str:
    """The password a URL carries (user info or ?password=), "" if none."""
    _, userinfo, _ = _split_userinfo(url)
    given = unquote(userinfo.partition(":")[2])
    query = _QUERY_PASSWORD.search(url)
    return given or (unquote(query.group(2)) if query else "")


def redact(text: str, url: str | None) -> str:
    """`text` without the passwords of `url` (error messages may quote the URL or parts of it)."""
    if not url:
        return text
    _, userinfo, _ = _split_userinfo(url)
    hidden = [userinfo.partition(":")[2]] if ":" in userinfo else []
    hidden += [m.group(2) for m in _QUERY_PASSWORD.finditer(url)]
    hidden += [unquote(x) for x in hidden]
    for secret in sorted({x for x in hidden if x}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


# ---- the store ---------------------------------------------------------------------------

def redis_client(url: str) -> redis.Redis:
    return client_from_url(url, connect_timeout=CONNECT_TIMEOUT_S)  # a bad URL is INVALID_PARAMS


def stored_config(client: redis.Redis, namespace: str) -> MasterConfig | None:
    """The store's configuration from `<ns>:{<ns>:0}:config`, or None for a new store."""
    stored = client.hgetall(ShardKeys(namespace, 0).config)
    check_schema(namespace, stored)
    return MasterConfig.from_redis(namespace, stored) if stored else None


def open_existing(opts: Opts) -> Master:
    """A Master on an existing store, with the store's own configuration. Unlike
    Master.connect it writes nothing: no configuration, and no function load up front (a
    function call loads the library only if the server has none)."""
    url = opts.require_url()
    MasterConfig(namespace=opts.namespace)  # validates the namespace (MasterError -> exit 2)
    client = redis_client(url)
    config = stored_config(client, opts.namespace)
    if config is None:
        client.close()
        click.echo(f"no store under namespace {opts.namespace!r} at {safe_url(url)} "
                   f"(no key {ShardKeys(opts.namespace, 0).config.decode()}); start one with `mooncake-redis serve`",
                   err=True)
        raise click.exceptions.Exit(1)
    return Master(client, config)


def valkey_cli_binary() -> str | None:
    """valkey-cli next to the valkey-server that `serve` starts, else one on PATH."""
    try:
        beside = Path(valkey_binary()).parent / "valkey-cli"
        if beside.exists():
            return str(beside)
    except RuntimeError:
        pass
    return shutil.which("valkey-cli") or shutil.which("redis-cli")


# ---- background work and metrics (serve, worker, metrics) --------------------------------

def run_background(master: Master, stop_event: threading.Event, worker: Worker | None = None,
                   interval_s: float = 0.2) -> int:
    """Run a worker (eviction, discard of abandoned puts, client-TTL expiry, dead-replica
    sweeps) until `stop_event` is set; the step in flight finishes first. Returns the number
    of passes."""
    return (worker or Worker(master)).run(stop_event, interval_s=interval_s)


@dataclass
class MetricsAddress:
    port: int
    addr: str


def metrics_options(command):
    """--metrics-port and --metrics-addr: serve Prometheus metrics (GET /metrics)."""
    command = click.option("--metrics-addr", default="127.0.0.1", show_default=True,
                           help="Address the metrics endpoint listens on (0.0.0.0: every interface).")(command)
    return click.option("--metrics-port", type=click.IntRange(1, 65535), default=None,
                        help="Serve the store's Prometheus metrics on this port (GET /metrics); "
                             "names in docs/operations.md.")(command)


@contextlib.contextmanager
def metrics_endpoint(master: Master, where: MetricsAddress | None, worker: Worker | None = None):
    """The store's metrics served on `where` (and the pass durations of `worker`) for the
    duration of the block; nothing when `where` is None."""
    if where is None:
        yield
        return
    from mooncake_redis.metrics import serve_metrics

    try:
        http = serve_metrics(master, where.port, where.addr, worker)
    except OSError as exc:
        raise CliError(f"cannot serve metrics on {where.addr}:{where.port}: {exc}") from None
    logging.getLogger("mooncake_redis.metrics").info("metrics on http://%s:%d/metrics", where.addr, where.port)
    try:
        yield
    finally:
        http.shutdown()
        http.server_close()
