"""Fixtures: every API test runs on a real Valkey (started here, free loopback port), on a real
Redis 7 (Debian's redis-server, when installed: .ci/run installs it) and on memory:// (fakeredis),
each with shards=1 and shards=4. Tests of the modules marked `cluster` (lifecycle, eviction,
workers, fsck) run also on a local Redis Cluster of 3 primaries (started here from the same
Valkey binary) with shards=16. Time is the store clock, frozen."""
from __future__ import annotations

import shutil
import uuid

import pytest

from mooncake_redis import Master, MasterConfig
from mooncake_redis.cluster import primary_clients
from mooncake_redis.server import EmbeddedCluster, EmbeddedValkey

T0 = 1_700_000_000_000  # the frozen store clock every test starts at


REDIS_SERVER = shutil.which("redis-server")  # Redis differs from Valkey in small ways (e.g. "-0")
BACKENDS = ["valkey", "redis", "memory"]
SHARD_COUNTS = [1, 4]
CLUSTER_SHARDS = 16  # shards of a store on the test cluster: every node holds several


def pytest_configure(config):
    config.addinivalue_line("markers", "cluster: also run the API tests of this module on a 3-primary Redis Cluster")
    config.addinivalue_line("markers", "not_on_cluster(reason): leave this test of a `cluster` module off the cluster")


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


def flush(url: str) -> None:
    """Empty a test server (every primary of a cluster)."""
    from mooncake_redis.master import _redis_from_url

    client = _redis_from_url(url)
    try:
        for server in primary_clients(client):
            server.flushall()
    finally:
        client.close()


def make_master(backend: str, valkey_server, **config) -> Master:
    cfg = MasterConfig(**config)
    if backend in ("valkey", "redis", "cluster"):
        flush(valkey_server.url)
        return Master.connect(valkey_server.url, cfg)
    return Master.connect(f"memory://{uuid.uuid4().hex}", cfg)


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
