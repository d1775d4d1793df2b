"""Library protocol and store schema versions, on a real Valkey: a process replaces the server's
library only when it is missing, of an older protocol, or another build of the same protocol;
a newer protocol, or a store of a newer schema, is refused (a rolling upgrade never downgrades)."""
from __future__ import annotations

import pytest
import redis
from click.testing import CliRunner

from helpers import raises_code
from mooncake_redis import ErrorCode, Master, MasterConfig, MasterError
from mooncake_redis.cli.main import cli
from mooncake_redis.library import (LIBRARY_PROTOCOL, SCHEMA_FIELD, SCHEMA_VERSION, library_source,
                                    server_library)
from mooncake_redis.keys import shard_key

CONFIG = f"{shard_key('mc', 0)}:config"


@pytest.fixture
def client(valkey):
    """A flushed server; afterwards this package's library again (others share the server)."""
    r = redis.Redis.from_url(valkey.url)
    r.flushall()
    yield r
    r.execute_command("FUNCTION", "LOAD", "REPLACE", library_source()[0])
    r.flushall()
    r.close()


def load_fake(r: redis.Redis, reply: str) -> None:
    """A library named `mooncake` whose only function, mc_version, replies the Lua `reply`."""
    r.execute_command("FUNCTION", "LOAD", "REPLACE", f"#!lua name=mooncake\n"
                      f"redis.register_function{{function_name='mc_version', flags={{'no-writes'}}, "
                      f"callback=function() return {reply} end}}")


def test_a_newer_protocol_is_refused_and_kept(client, valkey):
    load_fake(client, f"{{'future', {LIBRARY_PROTOCOL + 1}}}")
    with pytest.raises(MasterError) as info:
        Master.connect(valkey.url, MasterConfig(shards=1))
    assert info.value.code == ErrorCode.INTERNAL_ERROR
    assert (f"the server runs library protocol {LIBRARY_PROTOCOL + 1}, newer than this package's "
            f"{LIBRARY_PROTOCOL}: upgrade mooncake-redis") in info.value.message
    assert server_library(client) == ("future", LIBRARY_PROTOCOL + 1)


def test_a_running_master_does_not_downgrade_a_newer_library(client, valkey):
    """A call that finds its function missing reloads only under the same rule."""
    m = Master.connect(valkey.url, MasterConfig(shards=1))
    load_fake(client, f"{{'future', {LIBRARY_PROTOCOL + 1}}}")  # a newer build without mc_exist_key
    with raises_code(ErrorCode.INTERNAL_ERROR):
        m.exist_key("k")
    assert server_library(client) == ("future", LIBRARY_PROTOCOL + 1)
    m.close()


@pytest.mark.parametrize("reply, protocol", [
    (f"{{'older', {LIBRARY_PROTOCOL - 1}}}", LIBRARY_PROTOCOL - 1),  # an older protocol
    (f"{{'other-build', {LIBRARY_PROTOCOL}}}", LIBRARY_PROTOCOL),    # the same protocol, another build
    ("'0123456789abcdef'", 1),                                        # protocol 1: the bare version
], ids=["older", "same-protocol-other-build", "protocol-1-string"])
def test_an_older_protocol_or_another_build_is_replaced(client, valkey, reply, protocol):
    load_fake(client, reply)
    assert server_library(client)[1] == protocol
    m = Master.connect(valkey.url, MasterConfig(shards=1))
    assert server_library(client)[0] == library_source()[1]
    assert m.exist_key("k") is False
    m.close()


def test_the_same_build_is_not_reloaded(client, valkey):
    Master.connect(valkey.url, MasterConfig(shards=1)).close()
    client.execute_command("FUNCTION", "LOAD", "REPLACE",
                           library_source()[0].replace("#!lua name=mooncake\n", "#!lua name=mooncake\n-- marker\n"))
    Master.connect(valkey.url).close()
    code = client.execute_command("FUNCTION", "LIST", "LIBRARYNAME", "mooncake", "WITHCODE")
    assert "-- marker" in repr(code)


def test_connect_records_the_schema_version(client, valkey):
    m = Master.connect(valkey.url, MasterConfig(shards=2))
    for i in range(2):
        assert client.hget(f"{shard_key('mc', i)}:config", SCHEMA_FIELD) == str(SCHEMA_VERSION).encode()
    m.close()
    client.hdel(CONFIG, SCHEMA_FIELD)  # a store written before the field existed
    Master.connect(valkey.url).close()
    assert client.hget(CONFIG, SCHEMA_FIELD) == str(SCHEMA_VERSION).encode()


@pytest.mark.parametrize("value, words", [(str(SCHEMA_VERSION + 1), "newer than this package's"),
                                          ("two", "corrupt value")])
def test_a_store_of_a_newer_schema_is_refused(client, valkey, value, words):
    Master.connect(valkey.url, MasterConfig(shards=1)).close()
    client.hset(CONFIG, SCHEMA_FIELD, value)
    for config in (None, MasterConfig(shards=1)):
        with pytest.raises(MasterError) as info:
            Master.connect(valkey.url, config)
        assert info.value.code == ErrorCode.INTERNAL_ERROR and words in info.value.message
    assert client.hget(CONFIG, SCHEMA_FIELD) == value.encode()  # nothing rewritten
    r = CliRunner().invoke(cli, ["--redis", valkey.url, "status"])
    assert r.exit_code != 0 and words in r.output
