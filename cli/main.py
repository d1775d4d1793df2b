"""The `mooncake-redis` operator CLI.

    mooncake-redis [--redis URL] [--namespace NS] serve | status | inspect KEY | worker | evict
                   | fsck | metrics | bench ops|mooncake|instructions|evict|capacity|offload

--redis and --namespace may also follow the command's name (`serve --redis URL`), and then win.

status, inspect, retain, expire-guaranteed, evict, fsck, metrics, offload-gc, replay and bench take --json
(cli/output.py, fields in docs/json.md).

Exit codes: 0 success; 1 not found (an object, or no store under the namespace); 2 bad usage,
a master error (MasterError, printed as "error <NAME> (<code>): <detail>"), an unreachable Redis,
or a failed start of the private Valkey.

This module holds the group, its global options and its error handling, and registers the
commands, which live in one module per family: serve.py (serve, cluster-up), status.py,
inspect.py, retention.py (retain), maintenance.py (worker, evict, expire-guaranteed, fsck,
metrics), bench.py, gateway.py, offload.py and replay.py. What they share (Opts, the URL, opening
a store) is in context.py, which imports no command module.
"""
from __future__ import annotations

import os
from importlib import metadata

import click
import redis
from click.core import ParameterSource

from mooncake_redis import MasterError
from mooncake_redis.library import LIBRARY_NAME, LIBRARY_PROTOCOL, library_source
from mooncake_redis.server import PASSWORD_FILE, URL_FILE

from .bench import bench
from .context import (
    DATA_DIR_ENV,
    DEFAULT_DATA_DIR,
    NAMESPACE_HELP,
    REDIS_HELP,
    Opts,
    accept_store_options,
    checked_url,
    redact,
    safe_url,
    url_password,
)
from .events import events
from .gateway import gateway
from .inspect import inspect
from .maintenance import evict, expire_guaranteed, fsck_cmd, metrics_cmd, worker
from .offload import offload_agent, offload_gc
from .replay import replay
from .retention import retain
from .serve import cluster_up, serve
from .status import status

__all__ = ["cli", "Opts", "safe_url", "redact"]


class _Cli(click.Group):
    """Turns master and Redis errors raised by any command into a message and exit code 2."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (MasterError, redis.RedisError) as exc:
            message = _error_message(ctx.obj if isinstance(ctx.obj, Opts) else Opts(None, ""), exc)
        except click.ClickException as exc:
            # click's stub marks message Final; redacting it in place keeps the exception's own type
            exc.message = redact(exc.message, _url(ctx))  # type: ignore[misc]
            raise
        click.echo(redact(message, _url(ctx)), err=True)  # messages may quote the URL
        ctx.exit(2)


def _error_message(opts: Opts, exc: MasterError | redis.RedisError) -> str:
    if auth_refused(exc):
        return _password_message(opts)
    if isinstance(exc, MasterError):
        detail = f": {exc.message}" if exc.message else ""
        return f"error {exc.code.name} ({int(exc.code)}){detail}"
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        hint = f" (URL from {opts.url_file}: is `mooncake-redis serve` running?)" if opts.url_file else ""
        return f"error: cannot reach Redis at {safe_url(opts.url or '?')}{hint}: {exc}"
    return f"error from Redis: {exc}"


# what a server says when it wants a password, or another one (redis-py raises most of these as
# AuthenticationError; through a cluster client or a function call they arrive as text)
AUTH_REPLIES = ("NOAUTH", "WRONGPASS", "HELLO must be called with the client already authenticated",
                "invalid username-password pair", "Authentication required", "invalid password")


def auth_refused(exc: Exception) -> bool:
    """Whether `exc` is a server refusing the connection's (missing or wrong) credentials."""
    if isinstance(exc, redis.AuthenticationError):
        return True
    text = (exc.message if isinstance(exc, MasterError) else str(exc)) or ""
    return any(reply.lower() in text.lower() for reply in AUTH_REPLIES)


def _password_message(opts: Opts) -> str:
    data_dir = (os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR).rstrip("/")
    url_file = opts.url_file or f"{data_dir}/{URL_FILE}"
    where = f"see {data_dir}/{PASSWORD_FILE} or the url file {url_file}, which holds the whole URL"
    url = safe_url(opts.url or "?")
    if url_password(opts.url or ""):
        return f"error: Redis at {url}: this server refused the URL's password or user ({where})"
    return f"error: Redis at {url}: this server needs a password ({where})"


def _url(ctx: click.Context) -> str | None:
    return ctx.obj.url if isinstance(ctx.obj, Opts) else None


def package_version() -> str:
    """This package's version, from its installed metadata (pyproject's version)."""
    try:
        return metadata.version("mooncake-redis")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    click.echo(f"mooncake-redis {package_version()} (functions library {LIBRARY_NAME!r} version "
               f"{library_source()[1]}, protocol {LIBRARY_PROTOCOL})")
    ctx.exit(0)


@click.group(cls=_Cli)
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Print the package's version (and its functions library's) and exit.")
@click.option("--redis", "redis_url", envvar="MOONCAKE_REDIS_URL", default=None, metavar="URL",
              callback=checked_url, help=REDIS_HELP)
@click.option("--namespace", default="mc", show_default=True, help=NAMESPACE_HELP)
@click.pass_context
def cli(ctx: click.Context, redis_url: str | None, namespace: str) -> None:
    """mooncake-redis: a KV-cache metadata master whose whole state lives in Redis/Valkey."""
    from_env = ctx.get_parameter_source("redis_url") == ParameterSource.ENVIRONMENT
    ctx.obj = Opts(redis_url or None, namespace, url_from_env=bool(redis_url) and from_env)


# the commands on a store, which also take --redis and --namespace after their name
STORE_COMMANDS = (status, inspect, expire_guaranteed, retain, serve, worker, evict, fsck_cmd, metrics_cmd,
                  offload_agent, offload_gc, gateway, events)
for command in STORE_COMMANDS:
    cli.add_command(accept_store_options(command))
for command in bench.commands.values():  # the benches and replay make their own stores: --redis only
    accept_store_options(command, namespace=False)
cli.add_command(bench)
cli.add_command(accept_store_options(replay, namespace=False))
cli.add_command(cluster_up)

if __name__ == "__main__":
    cli(prog_name="mooncake-redis")
