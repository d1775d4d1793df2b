"""The gateway's Prometheus metrics. The per-RPC figures are kept in plain counters under one
lock and turned into metric families only when scraped: prometheus_client's own Counter and
Histogram cost several microseconds an update, paid on every request."""
from __future__ import annotations

import bisect
import threading
import time
from typing import Any, Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from .codec import Err

LATENCY_BUCKETS = (50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 50e-3, 0.25, 1.0)


class _Rpc:
    __slots__ = ("calls", "buckets", "seconds")

    def __init__(self) -> None:
        self.calls = 0
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)  # the last: above every bound
        self.seconds = 0.0


class GatewayMetrics(Collector):
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.http = Counter("mooncake_gateway_http_requests", "Metadata server requests, by path and status",
                            ["path", "status"], registry=self.registry)
        self.connections = Counter("mooncake_gateway_rpc_connections", "RPC connections accepted",
                                   registry=self.registry)
        self._lock = threading.Lock()  # answered() runs on the event loop and on the thread pool
        self._rpcs: dict[str, _Rpc] = {}
        self._errors: dict[tuple[str, str], int] = {}
        self.registry.register(self)

    def called(self, rpc: str) -> None:
        """An RPC answered without a latency figure (one the gateway does not serve)."""
        with self._lock:
            self._rpc(rpc).calls += 1

    def error(self, rpc: str, code: Any) -> None:
        with self._lock:
            key = (rpc, str(code))
            self._errors[key] = self._errors.get(key, 0) + 1

    def answered(self, rpc: str, value: Any, started: float) -> None:
        seconds = time.perf_counter() - started
        with self._lock:
            r = self._rpcs.get(rpc) or self._rpc(rpc)
            r.calls += 1
            r.seconds += seconds
            r.buckets[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        if isinstance(value, Err):
            self.error(rpc, value.code)
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, Err):
                    self.error(rpc, item.code)

    def _rpc(self, rpc: str) -> _Rpc:
        return self._rpcs.setdefault(rpc, _Rpc())

    def collect(self) -> Iterator[Any]:
        with self._lock:
            rpcs = {name: (r.calls, list(r.buckets), r.seconds) for name, r in self._rpcs.items()}
            errors = dict(self._errors)
        calls = CounterMetricFamily("mooncake_gateway_rpc_calls", "RPCs answered, by name", labels=["rpc"])
        latency = HistogramMetricFamily("mooncake_gateway_rpc_seconds", "Time from a request's arrival to its reply",
                                        labels=["rpc"])
        for name, (count, buckets, seconds) in sorted(rpcs.items()):
            calls.add_metric([name], count)
            timed, cumulative = sum(buckets), []
            if timed:
                running = 0
                for bound, n in zip((*map(str, LATENCY_BUCKETS), "+Inf"), buckets):
                    running += n
                    cumulative.append((bound, running))
                latency.add_metric([name], cumulative, seconds)
        failed = CounterMetricFamily("mooncake_gateway_rpc_errors",
                                     "RPCs answered with an error, by name and Mooncake code", labels=["rpc", "code"])
        for (name, code), n in sorted(errors.items()):
            failed.add_metric([name, code], n)
        yield calls
        yield failed
        yield latency
