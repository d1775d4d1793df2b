"""Fixtures: every API test runs on a real Valkey (started here, free loopback port), on a real
Redis 7 (Debian's redis-server, when installed: .ci/run installs it) and on memory:// (fakeredis),
each with shards=1 and shards=4. Tests of the modules marked `cluster` (lifecycle, eviction,
workers, fsck) run also on a local Redis Cluster of 3 primaries (started here from the same
Valkey binary) with shards=16. Time is the store clock, frozen.

Switches (docs/testing.md): MOONCAKE_BACKENDS (e.g. `valkey` or `valkey,memory`) keeps only the
tests on those backends; HYPOTHESIS_PROFILE picks the property tests' size (`ci`, the default, or
`dev`); tests marked `slow` are left out by `-m "not slow"`."""
from __future__ import annotations

import os
import shutil

import pytest
from hypothesis import HealthCheck, settings

from helpers import T0, flush, make_master  # noqa: F401  (T0, flush: also imported from here)
from mooncake_redis.bench.mooncake import MooncakeMaster, MooncakeUnavailable, find_mooncake
from mooncake_redis.server import EmbeddedCluster, EmbeddedValkey

REDIS_SERVER = shutil.which("redis-server")  # Redis differs from Valkey in small ways (e.g. "-0")
BACKENDS = ["valkey", "redis", "memory"]
ALL_BACKENDS = BACKENDS + ["cluster"]
SHARD_COUNTS = [1, 4]
CLUSTER_SHARDS = 16  # shards of a store on the test cluster: every node holds several

# ---- property tests: profiles ------------------------------------------------------------------
# The store-driven property tests size themselves with helpers.examples(n): n under `ci`, a third
# under `dev`; the cheap pure-function ones keep their own counts under both.
_PROPERTY = dict(deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
settings.register_profile("ci", **_PROPERTY)
settings.register_profile("dev", **_PROPERTY)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def enabled_backends() -> list[str]:
    """The backends MOONCAKE_BACKENDS names (all of them when it is unset or empty)."""
    raw = os.environ.get("MOONCAKE_BACKENDS", "").strip()
    if not raw:
        return list(ALL_BACKENDS)
    names = [{"redis7": "redis", "fakeredis": "memory"}.get(n.strip(), n.strip())
             for n in raw.split(",") if n.strip()]
    unknown = sorted(set(names) - set(ALL_BACKENDS))
    if unknown:
        raise pytest.UsageError(f"MOONCAKE_BACKENDS: unknown backend(s) {', '.join(unknown)} "
                                f"(known: {', '.join(ALL_BACKENDS)})")
    return names


def pytest_configure(config):
    config.addinivalue_line("markers", "cluster: also run the API tests of this module on a 3-primary Redis Cluster")
    config.addinivalue_line("markers", "not_on_cluster(reason): leave this test of a `cluster` module off the cluster")
    config.addinivalue_line("markers", "slow: takes seconds (processes, restarts, valgrind, extra seeds); "
                                       "the full run keeps it, the quick tier (-m 'not slow') leaves it out")
    enabled_backends()  # a misspelt MOONCAKE_BACKENDS stops the run before any test


def pytest_xdist_auto_num_workers(config):
    """Workers for `-n auto` (pyproject's addopts): PYTEST_XDIST_AUTO_NUM_WORKERS if set; none
    (this process) with -s or --pdb, so that prints and the debugger reach the terminal; else 2
    (at most the CPUs): each worker starts its own servers, and more did not pay on 2 cores."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    if config.getoption("capture") == "no" or config.getoption("usepdb", False):
        return 0
    return max(1, min(2, os.cpu_count() or 1))


def pytest_report_header(config):
    raw = os.environ.get("MOONCAKE_BACKENDS", "")
    return (f"mooncake backends: {', '.join(enabled_backends())}"
            f"{'' if raw else ' (all: MOONCAKE_BACKENDS unset)'}; "
            f"hypothesis profile: {settings.get_current_profile_name()}")


def pytest_generate_tests(metafunc):
    """Parametrize `backend` and `shards` (every backend with every shard count; with the
    `cluster` mark, also ("cluster", 16)), unless the test parametrizes them itself."""
    explicit = set()
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0]
        explicit.update(n.strip() for n in (names.split(",") if isinstance(names, str) else names))
    want_backend = "backend" in metafunc.fixturenames and "backend" not in explicit
    want_shards = "shards" in metafunc.fixturenames and "shards" not in explicit
    on_cluster = (metafunc.definition.get_closest_marker("cluster") is not None
                  and metafunc.definition.get_closest_marker("not_on_cluster") is None)
    if want_backend and want_shards:
        cases = [(b, s) for b in BACKENDS for s in SHARD_COUNTS] + ([("cluster", CLUSTER_SHARDS)] if on_cluster else [])
        metafunc.parametrize("backend,shards", cases, ids=[f"{b}-shards{s}" for b, s in cases], indirect=True)
    elif want_backend:
        metafunc.parametrize("backend", BACKENDS + (["cluster"] if on_cluster else []), indirect=True)
    elif want_shards:
        metafunc.parametrize("shards", SHARD_COUNTS, ids=[f"shards{s}" for s in SHARD_COUNTS], indirect=True)


# The parameters that name a backend (the generated `backend`, and the modules' own `server`
# and `url` fixtures), and the session servers a test may use without one.
_BACKEND_PARAMS = ("backend", "server", "url")
_SERVER_FIXTURES = {"valkey_cluster": "cluster", "redis7": "redis", "valkey": "valkey"}


def backend_of(item) -> str | None:
    """The backend a collected test runs on: its backend parameter, else the session server it
    asks for; None for a test on no shared server (pure, or one starting its own processes)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    for name in _BACKEND_PARAMS:
        if params.get(name) in ALL_BACKENDS:
            return params[name]
    for fixture, backend in _SERVER_FIXTURES.items():
        if fixture in getattr(item, "fixturenames", ()):
            return backend
    return None


def pytest_collection_modifyitems(config, items):
    """MOONCAKE_BACKENDS: deselect the tests on the other backends."""
    enabled = set(enabled_backends())
    if enabled == set(ALL_BACKENDS):
        return
    keep, drop = [], []
    for item in items:
        (drop if backend_of(item) not in enabled | {None} else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="module")
def mooncake_master(tmp_path_factory):
    """Mooncake's own master (its HTTP metadata server on), the reference the gateway's answers
    are compared with; the test skips, saying why, where the wheel is missing."""
    try:
        _, binary = find_mooncake()
    except MooncakeUnavailable as exc:
        pytest.skip(str(exc))
    master = MooncakeMaster(binary, str(tmp_path_factory.mktemp("mooncake")), http_metadata=True).start()
    yield master
    master.stop()


@pytest.fixture(scope="session")
def valkey():
    server = EmbeddedValkey(appendonly=False).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis7():
    if not REDIS_SERVER:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    server = EmbeddedValkey(appendonly=False, binary=REDIS_SERVER).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def valkey_cluster():
    """3 primaries, no replicas (the failover test starts its own cluster with replicas)."""
    cluster = EmbeddedCluster(primaries=3).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def backend(request):
    return request.param


@pytest.fixture
def shards(request):
    return request.param


@pytest.fixture
def new_master(backend, shards, request):
    """Factory: new_master(**MasterConfig overrides) -> Master with a frozen clock at T0. A test
    module's MASTER_CONFIG (a dict, optional) gives its own defaults for the overrides."""
    made = []

    def factory(**config):
        config = {**getattr(request.module, "MASTER_CONFIG", {}), **config}
        config.setdefault("shards", shards)
        server = {"valkey": "valkey", "redis": "redis7", "cluster": "valkey_cluster"}.get(backend)
        server = request.getfixturevalue(server) if server else None
        m = make_master(backend, server, **config)
        m.freeze_clock(T0)
        made.append(m)
        return m

    yield factory
    for m in made:
        m.close()


@pytest.fixture
def master(new_master):
    return new_master()


@pytest.fixture
def valkey_master(valkey):
    """Factory for the tests that run on the session Valkey only (the CLI's, metrics, chaos):
    valkey_master(**MasterConfig fields) -> Master on the emptied server, clock frozen at T0,
    closed after the test."""
    made = []

    def factory(**config):
        m = make_master("valkey", valkey, **config)
        m.freeze_clock(T0)
        made.append(m)
        return m

    yield factory
    for m in made:
        m.close()
