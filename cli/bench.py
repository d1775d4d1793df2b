"""`mooncake-redis bench ...`: the benchmarks of bench/ (shipped as mooncake_redis.bench), each
printing its figures (--json: one JSON object, docs/json.md). Method and results: docs/bench.md."""
from __future__ import annotations

import contextlib

import click

from mooncake_redis.server import private_valkey

from .context import Opts
from .output import CliError, emit_json


@click.group()
def bench() -> None:
    """Benchmarks: each prints its figures with ratios against baselines measured in the same
    run (--json: the figures as one JSON object). Method and results: docs/bench.md."""


def _bench_json(command):
    """--json for a bench: the figures the bench returns, as {"results": {...}} on stdout (its
    text lines go to stderr meanwhile). The figures are documented in docs/json.md."""
    return click.option("--json", "as_json", is_flag=True,
                        help="Print the figures as one JSON object (docs/json.md); the text goes to stderr.")(command)


def _bench_out(as_json: bool):
    return (lambda line: click.echo(line, err=True)) if as_json else click.echo


def _private_bench(opts: Opts, name: str, run, as_json: bool, unavailable: tuple = ()) -> None:
    """Run a bench that starts its own private servers: --redis is noted and not used; a server
    that does not start (RuntimeError) or a missing tool (`unavailable`) is an error of the CLI."""
    if opts.url:
        click.echo(f"note: bench {name} runs on its own private servers, not on --redis", err=True)
    try:
        results = run(_bench_out(as_json))
    except (RuntimeError, *unavailable) as exc:
        raise CliError(str(exc)) from None
    if as_json:
        emit_json(f"bench {name}", {"results": results})


@contextlib.contextmanager
def _bench_server(opts: Opts, name: str):
    """The URL a bench that may use --redis runs on: --redis (on the command line, not
    MOONCAKE_REDIS_URL's), else a private throw-away Valkey (no AOF) for the duration of the
    block; a server that does not start is an error of the CLI."""
    url = opts.throwaway_url(f"bench {name}")
    if url:
        yield url
        return
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(private_valkey())
        except RuntimeError as exc:
            raise CliError(str(exc)) from None
        yield server.url


@bench.command("ops")
@click.option("--n", "n", type=click.IntRange(1), default=20000, show_default=True, help="Operations per kind.")
@click.option("--shards", type=click.IntRange(1, 16384), default=1, show_default=True, help="Shard count.")
@click.option("--expire-sizes", default="10000,1000000", show_default=True, metavar="N,N",
              help="Store sizes (guaranteed objects) of the expire_guaranteed figure, smallest first.")
@_bench_json
@click.pass_obj
def bench_ops(opts: Opts, n: int, shards: int, expire_sizes: str, as_json: bool) -> None:
    """Per-operation latency and throughput (bench/ops.py).

    Without --redis it runs against a private, throw-away Valkey (no AOF). With --redis it
    runs against that server; see bench/ops.py for what it writes there."""
    from mooncake_redis.bench.ops import main as ops_main

    try:
        sizes = tuple(int(x) for x in expire_sizes.split(","))
    except ValueError:
        raise click.BadParameter(f"{expire_sizes!r} is not a list of integers", param_hint="--expire-sizes") from None
    if not sizes or min(sizes) < 64:
        raise click.BadParameter("sizes must be at least 64 (one prefix of 64 keys)", param_hint="--expire-sizes")
    out = _bench_out(as_json)
    with _bench_server(opts, "ops") as url:
        results = ops_main(url, n=n, shards=shards, out=out, expire_sizes=sizes)
    if as_json:
        emit_json("bench ops", {"results": results})


@bench.command("mooncake")
@click.option("--n", "n", type=click.IntRange(1), default=3000, show_default=True,
              help="Calls per operation and round.")
@_bench_json
@click.pass_obj
def bench_mooncake(opts: Opts, n: int, as_json: bool) -> None:
    """Our master against Mooncake's C++ master (mooncake_master), interleaved in the same run:
    one Python client each on loopback, medians of 3 rounds (bench/mooncake.py). Both run on
    private servers started here. Needs pip install 'mooncake-redis[mooncake]'."""
    from mooncake_redis.bench.mooncake import MooncakeUnavailable
    from mooncake_redis.bench.mooncake import main as mooncake_main

    _private_bench(opts, "mooncake", lambda out: mooncake_main(n=n, out=out), as_json, (MooncakeUnavailable,))


@bench.command("gateway")
@click.option("--n", "n", type=click.IntRange(100), default=2000, show_default=True,
              help="Calls per operation, client and round.")
@_bench_json
@click.pass_obj
def bench_gateway(opts: Opts, n: int, as_json: bool) -> None:
    """Mooncake's own client against mooncake_master and against the gateway, interleaved in the
    same run (one client; then 4 clients against one mooncake_master and against 2 gateways),
    ratios per operation (bench/gateway.py). Private servers started here. Needs pip install
    'mooncake-redis[mooncake]'."""
    from mooncake_redis.bench.gateway import main as gateway_main
    from mooncake_redis.bench.mooncake import MooncakeUnavailable

    _private_bench(opts, "gateway", lambda out: gateway_main(n=n, out=out), as_json, (MooncakeUnavailable,))


@bench.command("instructions")
@click.option("--n", "n", type=click.IntRange(1), default=400, show_default=True,
              help="Calls per figure (batches: n/8 calls of 100 keys); a multiple of 50 is steadiest.")
@click.option("--aof", is_flag=True, help="The server appends to an AOF (appendfsync everysec, as serve runs it).")
@_bench_json
@click.pass_obj
def bench_instructions(opts: Opts, n: int, aof: bool, as_json: bool) -> None:
    """Instructions the server executes per call of each operation, counted by valgrind's
    callgrind (exact, unlike wall-clock figures), beside a no-op FCALL, a plain HGETALL and
    each operation's floor: a function making the same Redis calls and nothing else
    (bench/instructions.py). Runs on a private Valkey under valgrind (apt-get install valgrind)."""
    from mooncake_redis.bench.instructions import CallgrindUnavailable
    from mooncake_redis.bench.instructions import main as instructions_main

    _private_bench(opts, "instructions", lambda out: instructions_main(n=n, out=out, aof=aof), as_json,
                   (CallgrindUnavailable,))


@bench.command("cluster")
@click.option("--processes", type=click.IntRange(1, 64), default=4, show_default=True, help="Client processes.")
@click.option("--seconds", type=click.FloatRange(0.1, 600), default=5.0, show_default=True,
              help="Seconds each process calls, per topology.")
@click.option("--keys", type=click.IntRange(1, 1_000_000), default=2000, show_default=True, help="Stored objects.")
@click.option("--batch", type=click.IntRange(1, 1024), default=1, show_default=True,
              help="Keys per batch_get_replica_list call (at most --keys).")
@_bench_json
@click.pass_obj
def bench_cluster(opts: Opts, processes: int, seconds: float, keys: int, batch: int, as_json: bool) -> None:
    """get_replica_list calls/s from several client processes against one private Valkey and a
    private 3-primary cluster, in the same run (bench/cluster.py)."""
    if batch > keys:
        raise click.BadParameter("must be at most --keys", param_hint="--batch")
    from mooncake_redis.bench.cluster import main as cluster_main

    _private_bench(opts, "cluster", lambda out: cluster_main(processes, seconds, keys, batch, out=out), as_json)


def _sizes(_ctx, _param, value: str) -> list[int]:
    """--sizes: comma-separated object counts, each at least 1000 (a usage error otherwise)."""
    try:
        sizes = [int(s) for s in value.split(",") if s.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected comma-separated integers, e.g. 10000,100000") from None
    if not sizes or min(sizes) < 1000:
        raise click.BadParameter(f"{value!r}: each size must be at least 1000 objects")
    return sizes


@bench.command("evict")
@click.option("--sizes", default="10000,100000,1000000", show_default=True, callback=_sizes,
              help="Comma-separated store sizes in objects (each at least 1000).")
@click.option("--put-mib", type=click.IntRange(1), default=256, show_default=True,
              help="Segment size of the 4x-over-capacity put test.")
@click.option("--radix-depth", type=click.IntRange(0, 1024), default=0, show_default=True,
              help="Radix index on, keys registered in parent chains of this depth (0: index off).")
@_bench_json
@click.pass_obj
def bench_evict(opts: Opts, sizes: list[int], put_mib: int, as_json: bool, radix_depth: int = 0) -> None:
    """Eviction step cost at several store sizes, longest call, eviction throughput, and the
    4x-over-capacity put test (bench/evict.py). Without --redis it runs on a private Valkey."""
    from mooncake_redis.bench.evict import main as evict_main

    try:
        results = evict_main(opts.throwaway_url("bench evict"), sizes=sizes, out=_bench_out(as_json),
                             put_bytes=put_mib * 2**20, radix_depth=radix_depth)
    except RuntimeError as exc:  # a private Valkey that did not start
        raise CliError(str(exc)) from None
    if as_json:
        emit_json("bench evict", {"results": results})


@bench.command("offload")
@click.option("--objects", type=click.IntRange(100), default=2000, show_default=True,
              help="64 KiB objects offloaded per figure.")
@_bench_json
@click.pass_obj
def bench_offload(opts: Opts, objects: int, as_json: bool) -> None:
    """Offload tasks/s (master alone, and the agent with copy + fsync) and LocalClient.put
    against a raw copy into the mapped file (bench/offload.py). Without --redis it runs on a
    private Valkey."""
    from mooncake_redis.bench.offload import main as offload_main

    out = _bench_out(as_json)
    with _bench_server(opts, "offload") as url:
        results = offload_main(url, objects=objects, out=out)
    if as_json:
        emit_json("bench offload", {"results": results})


@bench.command("capacity")
@click.option("--trace", type=click.Path(dir_okay=False), default=None,
              help="Mooncake-format JSONL trace (default: ../shared/traces/conversation_trace.jsonl "
                   "of the repository, when it exists).")
@click.option("--limit-requests", type=click.IntRange(1), default=None, help="Replay only the first K requests.")
@click.option("--capacity-blocks", type=click.IntRange(1), default=5859, show_default=True,
              help="Store (and ideal LRU) capacity in blocks.")
@click.option("--block-bytes", type=click.IntRange(1), default=64 * 1024, show_default=True,
              help="Bytes per block.")
@_bench_json
@click.pass_obj
def bench_capacity(opts: Opts, trace: str | None, limit_requests: int | None, capacity_blocks: int,
                   block_bytes: int, as_json: bool) -> None:
    """Block hit rate of a store replaying a trace, beside an ideal LRU of the same capacity,
    with and without the background worker (bench/capacity.py). Always on a private Valkey."""
    from mooncake_redis.bench.capacity import main as capacity_main

    if opts.url:
        click.echo("note: bench capacity runs on its own private Valkey, not on --redis", err=True)
    try:
        results = capacity_main(trace, limit_requests, capacity_blocks, block_bytes, out=_bench_out(as_json))
    except (ValueError, OSError, RuntimeError) as exc:  # a bad trace; a private Valkey that did not start
        raise CliError(str(exc)) from None
    if as_json:
        emit_json("bench capacity", {"results": results})

