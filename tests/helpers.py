"""Shared helpers for the behaviour tests (no fixtures here: see conftest.py)."""
from __future__ import annotations

import contextlib
import uuid
from typing import Any, Iterator

import pytest

from mooncake_redis import ErrorCode, Master, MasterConfig, MasterError, ReplicateConfig
from mooncake_redis.transport.cluster import primary_clients
from mooncake_redis.keys import ShardKeys, segment_slice, shard_of
from mooncake_redis.layout import StoredReplica, decode_reps, encode_reps

T0 = 1_700_000_000_000  # the frozen store clock every test starts at

OWNER = "owner"    # the client that mounts segments
WRITER = "writer"  # the client that writes objects
# The eviction geometry the eviction tests are written in: a step starts above 90% of capacity
# and evicts down to 85% (wider than the defaults, so a handful of objects crosses both lines).
WATERMARKS = {"eviction_high_watermark_ratio": 0.90, "eviction_ratio": 0.05}


def examples(full: int) -> int:
    """max_examples of a store-driven property test: `full` under the `ci` Hypothesis profile
    (the default, the full run), a third of it (at least 5) under `dev` (the quick tier)."""
    from hypothesis import settings

    return max(5, full // 3) if settings.get_current_profile_name() == "dev" else full


def flush(url: str) -> None:
    """Empty a test server (every primary of a cluster)."""
    from mooncake_redis.transport import client_from_url

    client = client_from_url(url)
    try:
        for server in primary_clients(client):
            server.flushall()
    finally:
        client.close()


def make_master(backend: str, valkey_server, **config) -> Master:
    """A Master on an emptied test server (`backend` valkey, redis or cluster) or on a new
    memory:// store (its clock not frozen: the fixtures do that)."""
    cfg = MasterConfig(**config)
    if backend in ("valkey", "redis", "cluster"):
        flush(valkey_server.url)
        return Master.connect(valkey_server.url, cfg)
    return Master.connect(f"memory://{uuid.uuid4().hex}", cfg)


def run_cli(*args: str, env: dict | None = None):
    """The CLI in-process (click's CliRunner), with no URL or data directory from the shell's
    environment unless `env` gives one: tests pass --redis or a directory themselves."""
    from click.testing import CliRunner

    from mooncake_redis.cli.main import cli

    return CliRunner().invoke(cli, list(args), env={"MOONCAKE_REDIS_URL": None, "MOONCAKE_DATA_DIR": None,
                                                     **(env or {})})


@contextlib.contextmanager
def raises_code(code: ErrorCode) -> Iterator[None]:
    """Expect a MasterError carrying exactly `code`."""
    with pytest.raises(MasterError) as info:
        yield
    assert info.value.code == code, f"expected {code.name}, got {info.value.code.name}: {info.value}"


def code_of(fn, *args: Any, **kwargs: Any) -> ErrorCode:
    """Run a call; ErrorCode.OK if it returned, else the MasterError's code."""
    try:
        fn(*args, **kwargs)
    except MasterError as exc:
        return exc.code
    return ErrorCode.OK


def mount(m: Master, name: str, per_shard: int, client: str = OWNER, base: int = 0) -> int:
    """Mount a segment whose slice on every shard is `per_shard` bytes; returns its size."""
    size = per_shard * m.shards
    m.mount_segment(name, size, client, base=base)
    return size


def put(m: Master, key: Any, size: int, client: str = WRITER, config: ReplicateConfig | None = None,
        tenant_id: str = "default"):
    """put_start + put_end; returns the replicas put_start handed out."""
    replicas = m.put_start(client, key, size, config, tenant_id=tenant_id)
    m.put_end(client, key, tenant_id=tenant_id)
    return replicas


def shard_of_key(m: Master, key: Any) -> int:
    return shard_of(key.encode() if isinstance(key, str) else key, m.shards)


def keys_on_shard(m: Master, shard: int, count: int, stem: str = "k") -> list[str]:
    """`count` distinct plain keys (no hash tag) that route to `shard`."""
    out, i = [], 0
    while len(out) < count:
        key = f"{stem}{i}"
        if shard_of_key(m, key) == shard:
            out.append(key)
        i += 1
    return out


def key_not_on_shard(m: Master, shard: int, stem: str = "other") -> str:
    i = 0
    while shard_of_key(m, f"{stem}{i}") == shard:
        i += 1
    return f"{stem}{i}"


def slice_of(m: Master, seg_size: int, shard: int, base: int = 0) -> tuple[int, int]:
    """(absolute start, length) of the part of a segment that `shard` allocates from."""
    return segment_slice(base, seg_size, shard, m.shards)


def shard_keys(m: Master, shard: int) -> ShardKeys:
    """The keys of one shard of `m`'s store."""
    return m.transport.keys[shard]


def all_shard_keys(m: Master) -> list[ShardKeys]:
    return m.transport.keys


def keys_of(m: Master, key: str | bytes) -> ShardKeys:
    """The keys of the shard that `key` routes to."""
    return shard_keys(m, shard_of(key.encode() if isinstance(key, str) else key, m.shards))


def free_extents(m: Master, shard: int, seg: str) -> list[tuple[int, int]]:
    """The free extents of one segment slice, as (offset, length), from the allocator's two
    sorted sets; asserts that the two agree."""
    off_key, size_key = shard_keys(m, shard).free(seg)
    by_off = m.redis.zrange(off_key, 0, -1, withscores=True)
    by_size = dict(m.redis.zrange(size_key, 0, -1, withscores=True))
    assert {member for member, _ in by_off} == set(by_size), "by_off and by_size disagree"
    out = []
    for member, score in by_off:
        assert int(member) == int(score), f"by_off member {member!r} has score {score}"
        out.append((int(member), int(by_size[member])))
    return sorted(out)


def assert_tiles(extents_free: list[tuple[int, int]], extents_used: list[tuple[int, int]],
                 lo: int, length: int) -> None:
    """Free + allocated extents cover [lo, lo+length) exactly, without overlap; no two free
    extents touch (freed space coalesces)."""
    tagged = sorted([(o, n, "free") for o, n in extents_free] + [(o, n, "used") for o, n in extents_used])
    pos = lo
    prev_kind = None
    for off, n, kind in tagged:
        assert n > 0, f"empty extent at {off}"
        assert off == pos, f"{'gap' if off > pos else 'overlap'} at {pos}: next extent {kind} starts at {off}"
        assert not (kind == "free" and prev_kind == "free"), f"adjacent free extents not merged at {off}"
        pos = off + n
        prev_kind = kind
    assert pos == lo + length, f"extents end at {pos}, slice ends at {lo + length}"


def assert_no_overlap(extents: list[tuple[int, int]]) -> None:
    ordered = sorted(extents)
    for (a_off, a_len), (b_off, _) in zip(ordered, ordered[1:]):
        assert a_off + a_len <= b_off, f"extents overlap: [{a_off}, {a_off + a_len}) and [{b_off}, ...)"


def store_snapshot(m: Master) -> dict[bytes, Any]:
    """Every key of the store with its full content (the test clock excluded)."""
    r = m.redis
    out: dict[bytes, Any] = {}
    for key in r.scan_iter(match=f"{m.ns}:*", count=1000):
        kind = r.type(key)
        if kind == b"hash":
            out[key] = r.hgetall(key)
            if key.endswith(b":config"):
                out[key].pop(b"clock", None)
        elif kind == b"zset":
            out[key] = r.zrange(key, 0, -1, withscores=True)
        elif kind == b"set":
            out[key] = r.smembers(key)
        elif kind == b"string":
            out[key] = r.get(key)
        elif kind == b"list":
            out[key] = r.lrange(key, 0, -1)
        else:
            out[key] = kind
    return out


def present(m: Master, keys: list[Any], tenant_id: str = "default") -> list[bool]:
    """Which objects exist, checked with describe() (an inspection: unlike a read, no lease)."""
    out = []
    for key in keys:
        code = code_of(m.describe, key, tenant_id=tenant_id)
        assert code in (ErrorCode.OK, ErrorCode.OBJECT_NOT_FOUND), code
        out.append(code == ErrorCode.OK)
    return out


def watched_silence(m: Master, ms: int, ping: tuple[str, ...] = ()) -> None:
    """Advance the store clock by `ms` as a running worker sees it: mc_expire_clients on every
    shard at the start and after every step of at most client_ttl // 2 (so no gap restarts the
    store's watch of client silence), pinging the `ping` clients before each step. Clients that
    reach client_ttl of silence only at the very end are left for the caller's worker pass."""
    step = max(1, m.config.client_ttl // 2)
    while True:
        for shard in range(m.shards):
            m.transport.call("mc_expire_clients", shard, 1024)
        if ms <= 0:
            return
        for client in ping:
            m.ping(client)
        d = min(step, ms)
        m.advance_clock(d)
        ms -= d
        if ms == 0:
            return


def replicas_in(h: dict) -> dict[str, tuple[int, str]]:
    """{segment: (offset, mount id)} of an object hash as text (its `reps` field)."""
    value = h.get("reps", h.get(b"reps", b""))
    got = decode_reps(value.encode() if isinstance(value, str) else value)
    assert got is not None, value
    return {r.segment.decode(): (r.offset, r.mount.decode()) for r in got}


def reps_value(replicas: dict[str, tuple[int, str]]) -> str:
    """The `reps` field of {segment: (offset, mount id)}."""
    return encode_reps([StoredReplica(s.encode(), off, mount.encode()) for s, (off, mount) in replicas.items()]).decode()
