"""Fixtures: every API test runs on a real Valkey (started here, free loopback port) and on
memory:// (fakeredis), each with shards=1 and shards=4. Time is the store clock, frozen."""
from __future__ import annotations

import uuid

import pytest

from mooncake_redis import Master, MasterConfig
from mooncake_redis.server import EmbeddedValkey

T0 = 1_700_000_000_000  # the frozen store clock every test starts at


@pytest.fixture(scope="session")
def valkey():
    server = EmbeddedValkey(appendonly=False).start()
    yield server
    server.stop()


def make_master(backend: str, valkey_server, **config) -> Master:
    cfg = MasterConfig(**config)
    if backend == "valkey":
        import redis

        redis.Redis.from_url(valkey_server.url).flushall()
        return Master.connect(valkey_server.url, cfg)
    return Master.connect(f"memory://{uuid.uuid4().hex}", cfg)


@pytest.fixture(params=["valkey", "memory"])
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
        server = request.getfixturevalue("valkey") if backend == "valkey" else None
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
