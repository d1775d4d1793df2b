"""`mooncake-redis replay`: a Mooncake-format trace through real stores, one per policy and
capacity, beside reference caches of the same capacity (bench/replay.py; docs/replay.md)."""
from __future__ import annotations

import contextlib
import signal
import sys
import threading
from pathlib import Path
from typing import Iterator, Sequence

import click

from mooncake_redis.bench import replay as engine
from mooncake_redis.bench.replay_policies import POLICIES, knobs_of, make_policy
from mooncake_redis.server import abandon_throwaway_servers

from .output import emit_json, human, table

PLOT_HINT = "pip install 'mooncake-redis[plot]' (or pip install matplotlib)"


class ReplayError(click.ClickException):
    """Exit 2 with "error: <message>", as the other commands' failures."""

    exit_code = 2

    def show(self, file=None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


def _sweep(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        sizes = []
    if not sizes or any(n < 1 for n in sizes):
        raise click.BadParameter(f"expected comma-separated block counts >= 1, not {text!r}", param_hint="--sweep")
    return sorted(set(sizes))


def _knobs(args: tuple[str, ...]) -> dict[str, dict[str, int]]:
    """--knob POLICY.KNOB=VALUE options as {policy: {knob: value}}, checked against the policies."""
    out: dict[str, dict[str, int]] = {}
    for arg in args:
        name, dot, rest = arg.partition(".")
        knob, eq, value = rest.partition("=")
        if not dot or not eq or name not in POLICIES or knob not in knobs_of(name):
            known = ", ".join(f"{p}.{k}" for p in POLICIES for k in knobs_of(p))
            raise click.BadParameter(f"{arg!r}: expected POLICY.KNOB=VALUE, one of {known}", param_hint="--knob")
        try:
            out.setdefault(name, {})[knob] = int(value)
        except ValueError:
            raise click.BadParameter(f"{arg!r}: the value must be an integer", param_hint="--knob") from None
    for name, values in out.items():
        try:
            make_policy(name, out)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--knob") from None
    return out


def _policies(_ctx, _param, names: tuple[str, ...]) -> tuple[str, ...]:
    for name in names:
        try:
            make_policy(name)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
    return names


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def _table(header: list[str], rows: Sequence[Sequence[object]]) -> list[str]:
    return ["  " + line for line in table(header, rows)]


def _policy_row(name: str, f: dict) -> list[object]:
    refused = ", ".join(f"{k} {v:,}" for k, v in f["puts_refused"].items()) or "0"
    return [name, _pct(f["block_hit_rate"]), _pct(f["token_hit_rate"]), _pct(f["request_hit_rate"]),
            f"{f['evictions']:,}", f"{f['orphan_evictions']:,}", refused, human(f["guaranteed_peak_bytes"]),
            f"{f['requests_per_s']:,.0f}" if f["requests_per_s"] else "-"]


def _ideal_row(name: str, f: dict) -> list[object]:
    return [name, _pct(f["block_hit_rate"]), _pct(f["token_hit_rate"]), _pct(f["request_hit_rate"]),
            f"{f['evictions']:,}", f"{f['orphan_evictions']:,}", "-", "-", "-"]


HEADER = ["policy", "block hit", "token hit", "requests hit", "evictions", "orphan-making",
          "puts refused", "guaranteed peak", "requests/s"]


def print_report(res: dict, out=click.echo) -> None:
    out(f"trace    {res['trace']}: {res['requests']:,} requests, {res['blocks']:,} block lookups "
        f"({res['distinct_blocks']:,} distinct), {res['tokens']:,} prompt tokens, "
        f"{res['trace_seconds']:,.0f} s of trace time")
    inf = res["infinite_cache"]
    out(f"         an infinite cache: block hit {_pct(inf['block_hit_rate'])}, token hit "
        f"{_pct(inf['token_hit_rate'])}")
    out(f"store    {res['server']}, shards {res['shards']}, blocks of {res['block_tokens']} tokens and "
        f"{res['block_bytes']:,} B, " + ("Worker.run_once after every request" if res["worker"] else
                                        "no worker (evict-on-put only)") +
        ", store clock frozen at the trace's timestamps")
    for name, setting in res["policy_settings"].items():
        out(f"policy   {name}: {setting['summary']}")
    for run in res["runs"]:
        n = run["capacity_blocks"]
        out("")
        out(f"capacity {n:,} blocks ({n * res['block_tokens']:,} tokens, {n * res['block_bytes'] / 2**20:,.1f} MiB)")
        rows = [_policy_row(name, f) for name, f in run["policies"].items()]
        rows += [_ideal_row(f"ideal {name}", f) for name, f in run["ideal"].items()]
        for line in _table(HEADER, rows):
            out(line)
        for name, c in run.get("check", {}).items():
            store = run["policies"][name]
            out(f"  check {name}: store {_pct(store['block_hit_rate'])}, model {_pct(c['model']['block_hit_rate'])} "
                f"(difference {100 * c['block_hit_rate_difference']:+.3f} points: "
                + ("agrees" if c["agrees"] else "DISAGREES") + f" within {100 * engine.CHECK_TOLERANCE:.1f}); "
                f"model evictions {c['model']['evictions']:,}, orphan-making {c['model']['orphan_evictions']:,}")
    if len(res["runs"]) > 1:
        out("")
        out("block hit rate by capacity")
        names = list(res["runs"][0]["policies"]) + [f"ideal {n}" for n in res["runs"][0]["ideal"]]
        by_capacity = [[f"{run['capacity_blocks']:,}"]
                + [_pct(f["block_hit_rate"]) for f in run["policies"].values()]
                + [_pct(f["block_hit_rate"]) for f in run["ideal"].values()] for run in res["runs"]]
        for line in _table(["capacity"] + names, by_capacity):
            out(line)


def plot(res: dict, path: Path) -> None:
    """Hit rate against capacity, one line per policy (reference caches dashed), as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    caps = [run["capacity_blocks"] for run in res["runs"]]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, metric, title in ((axes[0], "block_hit_rate", "block hit rate"),
                              (axes[1], "token_hit_rate", "token hit rate (prefill tokens saved)")):
        for name in res["runs"][0]["policies"]:
            ax.plot(caps, [100 * run["policies"][name][metric] for run in res["runs"]], marker="o", label=name)
        for name in res["runs"][0]["ideal"]:
            ax.plot(caps, [100 * run["ideal"][name][metric] for run in res["runs"]], linestyle="--",
                    marker=".", label=f"ideal {name}")
        ax.axhline(100 * res["infinite_cache"][metric], color="grey", linewidth=0.8, linestyle=":",
                   label="infinite cache")
        ax.set_xlabel("capacity (blocks)")
        ax.set_ylabel("%")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{Path(res['trace']).name}: {res['requests']:,} requests", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


class _Terminated(BaseException):
    """SIGTERM or SIGHUP during a replay: unwinds like Ctrl-C."""


@contextlib.contextmanager
def _stop_on_signals(received: list[int]) -> Iterator[None]:
    """SIGTERM and SIGHUP stop the replay: the handler ends the private Valkey and removes its
    temporary directory at once, then raises _Terminated to unwind the run. (Python ignores an
    exception raised at some points, e.g. in its at-fork hooks while a server starts: the
    directory is gone all the same, and the run then fails on the stopped server.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_signal(signum, _frame):
        if not received:
            received.append(signum)
            abandon_throwaway_servers()
        raise _Terminated()

    def unraisable(info) -> None:  # the exception Python ignored: no traceback for it
        if not isinstance(info.exc_value, _Terminated):
            previous_hook(info)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
    previous_hook, sys.unraisablehook = sys.unraisablehook, unraisable
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        sys.unraisablehook = previous_hook


@click.command()
@click.argument("trace", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--capacity-blocks", type=click.IntRange(1), default=None,
              help=f"Store capacity in blocks (default {engine.CAPACITY_BLOCKS:,}).")
@click.option("--capacity-tokens", type=click.IntRange(1), default=None,
              help="Store capacity in tokens (blocks = tokens // --block-tokens).")
@click.option("--block-tokens", type=click.IntRange(1), default=engine.BLOCK_TOKENS, show_default=True,
              help="Tokens per block (the trace's: 512 for Mooncake's).")
@click.option("--block-bytes", type=click.IntRange(1), default=engine.BLOCK_BYTES, show_default=True,
              help="Bytes per block in the store.")
@click.option("--policy", "policies", multiple=True, callback=_policies, metavar="NAME",
              help=f"Policy to replay: {', '.join(POLICIES)}, or several joined by + "
                   "(e.g. guaranteed+retained). Repeatable; default: every one alone.")
@click.option("--knob", "knob_args", multiple=True, metavar="POLICY.KNOB=VALUE",
              help="Tune a policy's rule, e.g. guaranteed.requests=3 (repeatable; knobs in docs/replay.md).")
@click.option("--shards", type=click.IntRange(1, 16384), default=1, show_default=True,
              help="Shard count of each store.")
@click.option("--limit-requests", type=click.IntRange(1), default=None, help="Replay only the first K requests.")
@click.option("--sweep", default=None, metavar="N1,N2,...",
              help="Replay at each of these capacities (blocks) instead of one.")
@click.option("--worker/--no-worker", default=True, show_default=True,
              help="Run Worker.run_once after every request (watermark eviction), as a deployed store does.")
@click.option("--check", is_flag=True,
              help="Also run the plain-Python model of the store (bench/replay_model.py) for the policies "
                   f"that have one; exit 1 if a store's block hit rate is more than {engine.CHECK_TOLERANCE} "
                   "from its model's.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (fields: docs/replay.md) instead of text.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write a PNG of hit rate against capacity, one line per policy (needs matplotlib).")
@click.pass_context
def replay(ctx: click.Context, trace: Path, capacity_blocks: int | None, capacity_tokens: int | None,
           block_tokens: int, block_bytes: int, policies: tuple[str, ...], knob_args: tuple[str, ...], shards: int,
           limit_requests: int | None, sweep: str | None, worker: bool, check: bool, as_json: bool,
           plot_path: Path | None) -> None:
    """Replay a Mooncake-format JSONL trace (timestamp, input_length, hash_ids) through real
    stores, one per policy and capacity, and compare hit rates, evictions and speed.

    Without --redis on the command line the stores live on a private, throw-away Valkey (whose
    temporary directory goes with it, also on an error, Ctrl-C, SIGTERM or SIGHUP), whatever
    MOONCAKE_REDIS_URL says; with --redis they use the namespace `mcreplay` there (its keys are
    deleted before and after each run). The store clock follows the trace's timestamps (frozen
    and advanced, never slept)."""
    if capacity_blocks is not None and capacity_tokens is not None:
        raise click.UsageError("pass --capacity-blocks or --capacity-tokens, not both")
    sizes = _sweep(sweep)
    if sizes is not None and (capacity_blocks is not None or capacity_tokens is not None):
        raise click.UsageError("--sweep gives the capacities: "
                               "it cannot be used with --capacity-blocks/--capacity-tokens")
    if capacity_tokens is not None:
        capacity_blocks = capacity_tokens // block_tokens
        if capacity_blocks < 1:
            raise click.BadParameter(f"less than one block of {block_tokens} tokens", param_hint="--capacity-tokens")
    sizes = sizes or [capacity_blocks or engine.CAPACITY_BLOCKS]
    knobs = _knobs(knob_args)
    if plot_path is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ReplayError(f"--plot needs matplotlib: {PLOT_HINT}") from None
    try:
        requests = engine.load_trace(trace, limit_requests)
    except (ValueError, OSError) as exc:
        raise ReplayError(str(exc)) from None
    url = ctx.obj.throwaway_url("replay") if ctx.obj is not None else None
    received: list[int] = []
    try:
        with _stop_on_signals(received):
            res = engine.run(trace, requests, sizes, list(policies or POLICIES), url=url, block_bytes=block_bytes,
                             block_tokens=block_tokens, shards=shards, worker=worker, check=check,
                             knobs=knobs, progress=sys.stderr)
    except BaseException as exc:
        if received:  # whatever the stop ended in
            click.echo(f"replay stopped by {signal.Signals(received[0]).name}", err=True)
            ctx.exit(128 + received[0])
        if isinstance(exc, RuntimeError):  # the private Valkey did not start
            raise ReplayError(str(exc)) from None
        raise
    if as_json:
        emit_json("replay", res)
    else:
        print_report(res)
    if plot_path is not None:
        plot(res, plot_path)
        click.echo(f"plot written to {plot_path}", err=True)
    if any(not c["agrees"] for run in res["runs"] for c in run.get("check", {}).values()):
        click.echo(f"check failed: a store and its model differ by more than {engine.CHECK_TOLERANCE} "
                   f"of block hit rate", err=True)
        ctx.exit(1)
