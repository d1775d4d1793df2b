"""`bench gateway`: Mooncake's own client against Mooncake's C++ master and against our gateway,
in the same run, interleaved.

Each figure is one client process (bench/gateway_client.py, protocol tcp, P2PHANDSHAKE) timing
put (1 KiB), is_exist, batch_is_exist (100 keys; keys/s), get and remove over n calls; rounds
alternate between the two masters and the median of 3 rounds is reported with the ratio
gateway / Mooncake. Then the aggregate: 4 client processes at once against one mooncake_master,
and the same 4 against 2 gateway processes (2 clients each) on one store. The gateways are
`mooncake-redis gateway` processes on a private Valkey (no AOF), like the C++ master a process
of their own. Needs Mooncake's client (`pip install 'mooncake-redis[mooncake]'`).
"""
from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import IO, Any, Callable

import redis

from mooncake_redis import Master, MasterConfig
from mooncake_redis.server import free_port, private_valkey, stop_process

from .common import cpu_model, cpu_seconds
from .mooncake import MooncakeMaster, find_mooncake

OPERATIONS = ("put", "is_exist", "batch_is_exist", "get", "remove")
REPEATS = 3
NAMESPACE = "bench"
ENV = {**os.environ, "MC_TCP_BIND_ADDRESS": "127.0.0.1", "GLOG_minloglevel": "2"}


def _pipe(f: IO[str] | None) -> IO[str]:
    """A pipe of a Popen started with it (typed Optional)."""
    assert f is not None
    return f


def clients(master_addresses: list[str], n: int, tag: str) -> list[dict[str, float]]:
    """One client process per address, started together; their rates."""
    procs = [subprocess.Popen([sys.executable, "-m", "mooncake_redis.bench.gateway_client", addr, str(n), f"{tag}{i}"],
                              env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True) for i, addr in enumerate(master_addresses)]
    try:
        for p in procs:
            line = _pipe(p.stdout).readline()
            if line.strip() != "ready":
                raise RuntimeError(f"a client did not set up against {master_addresses}: {line.strip()}")
        for p in procs:
            _pipe(p.stdin).write("go\n")
            _pipe(p.stdin).flush()
        out = []
        for p in procs:
            rates = json.loads(_pipe(p.stdout).readline() or '{"error": "no output"}')
            if "error" in rates:
                raise RuntimeError(f"a client against {master_addresses} failed: {rates['error']}")
            out.append(rates)
        return out
    finally:
        for p in procs:
            with contextlib.suppress(OSError):
                _pipe(p.stdin).close()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


class GatewayProcess:
    def __init__(self, url: str):
        self.port, self.metrics_port = free_port(), free_port()
        self.proc = subprocess.Popen([sys.executable, "-m", "mooncake_redis.cli", "--redis", url, "--namespace",
                                      NAMESPACE, "gateway", "--rpc-port", str(self.port), "--metadata-port", "0",
                                      "--gateway-metrics-port", str(self.metrics_port)],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = _pipe(self.proc.stdout).readline()
        if not line.startswith("mooncake gateway:"):
            raise RuntimeError(f"the gateway did not start (exit {self.proc.wait()}): {line!r}")
        self.address = f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        stop_process(self.proc)

    def rpc_seconds(self) -> dict[str, tuple[float, float]]:
        """Per RPC: (sum of seconds from arrival to reply, count), from its metrics endpoint."""
        from prometheus_client.parser import text_string_to_metric_families

        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).read().decode()
        out: dict[str, list[float]] = {}
        for family in text_string_to_metric_families(text):
            if family.name == "mooncake_gateway_rpc_seconds":
                for sample in family.samples:
                    if sample.name.endswith(("_sum", "_count")):
                        out.setdefault(sample.labels["rpc"], [0.0, 0.0])[sample.name.endswith("_count")] = sample.value
        return {rpc: (total, count) for rpc, (total, count) in out.items()}


def fcall_usec(url: str) -> tuple[float, int]:
    """(usec, calls) of FCALL in the server's commandstats."""
    r = redis.Redis.from_url(url)
    try:
        stats = r.info("commandstats").get("cmdstat_fcall", {})
    finally:
        r.close()
    return float(stats.get("usec", 0)), int(stats.get("calls", 0))


def main(n: int = 2000, out: Callable[[str], None] = print) -> dict[str, Any]:
    _, exe = find_mooncake()
    res: dict[str, Any] = {"n": n, "repeats": REPEATS, "cores": os.cpu_count(), "cpu": cpu_model(),
                           "started_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           "load_average_at_start": os.getloadavg()}
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-gateway-"))
        mooncake = MooncakeMaster(exe, tmp).start()
        stack.callback(mooncake.stop)
        valkey = stack.enter_context(private_valkey())
        Master.connect(valkey.url, MasterConfig(namespace=NAMESPACE)).close()
        gateways = [GatewayProcess(valkey.url) for _ in range(2)]
        for g in gateways:
            stack.callback(g.stop)
        out(f"Mooncake's client (one process per figure) against mooncake_master {mooncake.address} and against "
            f"`mooncake-redis gateway` on a private Valkey; n={n:,}, median of {REPEATS} rounds, interleaved")
        out(f"machine {res['cores']} cores, {res['cpu']}, load average "
            f"{' '.join(f'{x:.2f}' for x in res['load_average_at_start'])}")
        single: dict[str, list[dict]] = {"mooncake": [], "gateway": []}
        spans: list[tuple] = []  # (before, after) of each one-client gateway round
        for rep in range(REPEATS):
            single["mooncake"] += clients([mooncake.address], n, f"m{rep}-")
            vpid = valkey.proc.pid if valkey.proc else 0
            before = (gateways[0].rpc_seconds(), fcall_usec(valkey.url), cpu_seconds(gateways[0].proc.pid),
                      cpu_seconds(vpid))
            single["gateway"] += clients([gateways[0].address], n, f"g{rep}-")
            after = (gateways[0].rpc_seconds(), fcall_usec(valkey.url), cpu_seconds(gateways[0].proc.pid),
                     cpu_seconds(vpid))
            spans.append((before, after))
        res["single"] = _table(single, out, "one client")
        res["where"] = _where(spans, single, out)
        many = {"mooncake": [_sum(clients([mooncake.address] * 4, n, f"M{rep}-")) for rep in range(REPEATS)]}
        many["gateway"] = [_sum(clients([g.address for g in gateways for _ in range(2)], n, f"G{rep}-"))
                           for rep in range(REPEATS)]
        res["aggregate"] = _table(many, out, "4 clients (aggregate; gateway: 2 processes)")
    res["load_average_at_end"] = os.getloadavg()
    return res


def _where(spans: list[tuple], single: dict[str, list[dict]], out) -> dict[str, Any]:
    """Where a gateway call's time goes (one client, the gateway's rounds only): as the client
    sees it (1/rate), from its arrival at the gateway to its reply, the functions' own server time
    (every FCALL, per call), the gateway's and Valkey's CPU time per RPC the gateway answered, and
    the client's own CPU time per call against each master."""
    rates = single["gateway"]
    seconds: dict[str, list[float]] = {}
    usec = calls = cpu = vcpu = 0.0
    for (gw0, (usec0, calls0), cpu0, v0), (gw1, (usec1, calls1), cpu1, v1) in spans:
        usec, calls, cpu, vcpu = usec + usec1 - usec0, calls + calls1 - calls0, cpu + cpu1 - cpu0, vcpu + v1 - v0
        for rpc, (total, count) in gw1.items():
            t0, c0 = gw0.get(rpc, (0.0, 0.0))
            seconds.setdefault(rpc, [0.0, 0.0])
            seconds[rpc][0] += total - t0
            seconds[rpc][1] += count - c0
    fcall_us = usec / max(1, calls)
    answered = sum(count for _, count in seconds.values())
    cpu_us = 1e6 * cpu / answered if answered else float("nan")
    valkey_cpu_us = 1e6 * vcpu / answered if answered else float("nan")
    rows = {}
    out(f"where the time goes (one client, gateway side){'':<14}{'client us/call':>16}{'gateway us/call':>17}")
    for op, rpc in (("is_exist", "ExistKey"), ("get", "GetReplicaList"), ("remove", "Remove")):
        total, count = seconds.get(rpc, [0.0, 0.0])
        client_us = 1e6 / statistics.median(r[op] for r in rates)
        gateway_us = 1e6 * total / count if count else float("nan")
        rows[op] = {"client_us": client_us, "gateway_us": gateway_us}
        out(f"  {op:<58}{client_us:>16.0f}{gateway_us:>17.0f}")
    out(f"  the functions' own server time: {fcall_us:.0f} us per FCALL (INFO commandstats, every call of the run)")
    out(f"  the gateway process's CPU time: {cpu_us:.0f} us per RPC answered ({answered:,.0f} RPCs); "
        f"Valkey's: {valkey_cpu_us:.0f} us")
    title = "the client process's own CPU time per call (all its threads)"
    out(f"{title:<66}{'vs mooncake_master':>20}{'vs gateway':>12}")
    client_cpu = {}
    for op in OPERATIONS:
        a, b = (statistics.median(r.get("cpu_us", {}).get(op, float("nan")) for r in single[m])
                for m in ("mooncake", "gateway"))
        client_cpu[op] = {"mooncake_us": a, "gateway_us": b}
        out(f"  {op:<58}{a:>20.0f}{b:>12.0f}")
    return {"operations": rows, "fcall_server_us": fcall_us, "gateway_cpu_us_per_rpc": cpu_us,
            "valkey_cpu_us_per_rpc": valkey_cpu_us, "client_cpu_us_per_call": client_cpu}


def _sum(rates: list[dict[str, float]]) -> dict[str, float]:
    return {op: sum(r[op] for r in rates) for op in OPERATIONS}


def _table(runs: dict[str, list[dict]], out, title: str) -> dict[str, dict]:
    out(f"{title:<44}{'mooncake_master':>18}{'gateway':>14}{'gateway/Mooncake':>18}")
    rows = {}
    for op in OPERATIONS:
        a = statistics.median(r[op] for r in runs["mooncake"])
        b = statistics.median(r[op] for r in runs["gateway"])
        unit = " keys/s" if op == "batch_is_exist" else "/s"
        rows[op] = {"mooncake_per_s": a, "gateway_per_s": b, "ratio": b / a}
        out(f"  {op:<42}{f'{a:,.0f}{unit}':>18}{f'{b:,.0f}{unit}':>14}{b / a:>18.2f}")
    return rows
