"""Fixtures: every API test runs on a real Valkey (started here, free loopback port), on a real
Redis 7 (Debian's redis-server, when installed: .ci/run installs it) and on memory:// (fakeredis),
each with shards=1 and shards=4. Time is the store clock, frozen."""
from __future__ import annotations

import shutil
import uuid

import pytest

from mooncake_redis import Master, MasterConfig
from mooncake_redis.server import EmbeddedValkey

T0 = 1_700_000_000_000  # the frozen store clock every test starts at


REDIS_SERVER = shutil.which("redis-server")  # Redis differs from Valkey in small ways (e.g. "-0")


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


def make_master(backend: str, valkey_server, **config) -> Master:
    cfg = MasterConfig(**config)
    if backend in ("valkey", "redis"):
        import redis

        redis.Redis.from_url(valkey_server.url).flushall()
        return Master.connect(valkey_server.url, cfg)
    return Master.connect(f"memory://{uuid.uuid4().hex}", cfg)


@pytest.fixture(params=["valkey", "redis", "memory"])
def backend(request):
    return request.param


@pytest.fixture(params=[1, 4], ids=["shards1", "shards4"])
def shards(request):
    return request.param


@pytest.fixture
def new_master(backend, shards, request):
    """Factory: new_master(**MasterConfig overrides) -> Master with a frozen clock at T0."""
    made = []

    def factory(**config):
        config.setdefault("shards", shards)
        server = {"valkey": "valkey", "redis": "redis7"}.get(backend)
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
