"""Python-side hardening: configuration checks, input types, timeouts and unknown outcomes,
library reload on every call path, connect-time server checks, binary ids in displays."""
from __future__ import annotations

import dataclasses
import math
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from helpers import (OWNER, T0, WRITER, all_shard_keys, make_master, mount, put, raises_code, shard_keys,
                     store_snapshot)
from mooncake_redis import ErrorCode, Master, MasterConfig, MasterError, ReplicateConfig, preflight
from mooncake_redis.cli.main import cli
from mooncake_redis.fsck import fsck
from mooncake_redis.config import CHOICES, INT_RANGES
from mooncake_redis.library import library_source, lua_dir
from mooncake_redis.keys import ShardKeys
from mooncake_redis.server import EmbeddedValkey, free_port
from mooncake_redis.worker import Worker

MAX_INT = 2**53 - 1
MAX_TTL = 10**15


# ---- 1. configuration --------------------------------------------------------------------

@pytest.mark.parametrize("fields", [
    {"shards": 1.5}, {"shards": True}, {"shards": 0}, {"shards": 16385}, {"shards": "4"},
    {"default_kv_lease_ttl": math.inf}, {"default_kv_lease_ttl": math.nan}, {"default_kv_lease_ttl": 1.5},
    {"default_kv_lease_ttl": 10_000.0}, {"default_kv_lease_ttl": -1}, {"default_kv_lease_ttl": MAX_INT + 1},
    {"default_kv_lease_ttl": None}, {"default_kv_lease_ttl": True},
    {"max_kv_soft_pin_ttl": 0}, {"default_kv_soft_pin_ttl": 0},
    {"default_kv_soft_pin_ttl": 2_000, "max_kv_soft_pin_ttl": 1_000},
    {"put_start_discard_timeout": 0}, {"put_start_discard_timeout": math.inf},
    {"put_start_discard_timeout": 30_000, "put_start_release_timeout": 30_000},
    {"put_start_discard_timeout": 30_000, "put_start_release_timeout": 20_000},
    {"client_ttl": 0}, {"client_ttl": 0.5}, {"max_group_retention": -1}, {"offload_queue_limit": 1e3},
    {"max_retained_groups": -5}, {"max_key_length": 0}, {"max_key_length": 2**40},
    {"eviction_high_watermark_ratio": math.nan}, {"eviction_high_watermark_ratio": math.inf},
    {"eviction_high_watermark_ratio": 0}, {"eviction_high_watermark_ratio": 1.5},
    {"eviction_high_watermark_ratio": "0.9"}, {"eviction_high_watermark_ratio": True},
    {"eviction_ratio": math.nan}, {"eviction_ratio": -0.1}, {"eviction_ratio": 1.0},
    {"eviction_ratio": 0.5, "eviction_high_watermark_ratio": 0.4},
    {"allow_evict_soft_pinned_objects": 1}, {"allow_evict_soft_pinned_objects": "yes"},
    {"evict_on_put": None},
    {"namespace": "mc\n"}, {"namespace": 5}, {"namespace": ""}, {"namespace": "a:b"},
], ids=repr)
def test_bad_configuration_is_refused(fields):
    with raises_code(ErrorCode.INVALID_PARAMS):
        MasterConfig(**fields)


def test_configuration_edges_are_accepted():
    c = MasterConfig(default_kv_lease_ttl=0, eviction_high_watermark_ratio=1, eviction_ratio=0,
                     max_group_retention=0, offload_queue_limit=0, client_ttl=MAX_TTL, shards=16384,
                     put_start_discard_timeout=1, put_start_release_timeout=2)
    assert c.eviction_high_watermark_ratio == 1.0 and isinstance(c.eviction_high_watermark_ratio, float)
    assert c.eviction_ratio == 0.0 and isinstance(c.eviction_ratio, float)


def _lua_config_ranges() -> dict[str, tuple]:
    """CONFIG_RANGES of lua/lib/00_base.lua: name -> (lo, hi) or (lo, hi, 'ratio')."""
    source = (lua_dir() / "lib" / "00_base.lua").read_text()
    consts = {"MAX_TTL": 10**15, "MAX_INT": 2**53 - 1}
    ranges = {}
    for name, body in re.findall(r"^\s*(?:CONFIG_RANGES\.)?(\w+) = \{ ([^}]*) \}", source, re.M):
        parts = [p.strip() for p in body.split(",")]
        if len(parts) in (2, 3) and name != "K":
            lo, hi = (consts.get(p, None) if p in consts else int(p) for p in parts[:2])
            ranges[name] = (lo, hi, *[p.strip("'") for p in parts[2:]])
    return ranges


def test_the_functions_accept_exactly_the_configuration_python_accepts():
    """One range per field: a MasterConfig that Python accepts is one every function runs on, and
    a value the functions refuse (a hand edit) is one Python refuses when it reads it back."""
    lua = _lua_config_ranges()
    stored = MasterConfig().to_redis()
    assert "shards" in lua and "default_kv_lease_ttl" in lua  # the parse found the table
    for name, rng in lua.items():
        assert name in stored, f"the functions read {name}, which MasterConfig does not write"
        kind = next(f.type for f in dataclasses.fields(MasterConfig) if f.name == name)
        if kind == "bool":
            assert rng == (0, 1), name
        elif kind == "float":
            assert rng == (0, 1, "ratio"), name
        else:
            assert rng == INT_RANGES[name], name


def test_the_functions_accept_exactly_the_choices_python_accepts():
    """A 'choice' field ({'choice', name...} in CONFIG_RANGES) has the names of config.CHOICES,
    and its default (CONFIG_DEFAULTS, for a store written before it) is MasterConfig's."""
    source = (lua_dir() / "lib" / "00_base.lua").read_text()
    lua = {name: tuple(p.strip().strip("'") for p in body.split(","))
           for name, body in re.findall(r"^\s*(\w+) = \{ 'choice', ([^}]*) \}", source, re.M)}
    assert lua == CHOICES
    defaults = dict(re.findall(r"(\w+) = '(\w+)'", re.search(r"CONFIG_DEFAULTS = \{([^}]*)\}", source).group(1)))
    assert defaults == {name: getattr(MasterConfig(), name) for name in CHOICES}


def test_a_store_without_read_leases_serves_reads(backend, request):
    """default_kv_lease_ttl 0: reads answer, grant no lease, and the object stays removable."""
    server = {"valkey": "valkey", "redis": "redis7"}.get(backend)
    m = make_master(backend, request.getfixturevalue(server) if server else None, default_kv_lease_ttl=0)
    try:
        m.freeze_clock(T0)
        mount(m, "seg", 1 << 16)
        put(m, "k", 100)
        assert m.exist_key("k") is True
        assert m.get_replica_list("k").lease_ttl_ms == 0
        assert m.batch_exist_key(["k"]) == [True]
        m.remove("k")  # not OBJECT_HAS_LEASE
    finally:
        m.close()


def test_stored_floats_read_back_exactly():
    c = MasterConfig(eviction_high_watermark_ratio=0.1 + 0.2, eviction_ratio=1e-300)
    stored = c.to_redis()
    assert float(stored["eviction_high_watermark_ratio"]) == 0.1 + 0.2
    assert float(stored["eviction_ratio"]) == 1e-300
    assert MasterConfig.from_redis("mc", {k.encode(): v.encode() for k, v in stored.items()}) == c


@pytest.mark.parametrize("field,raw", [
    ("default_kv_lease_ttl", b"abc"), ("default_kv_lease_ttl", b"1.5"), ("default_kv_lease_ttl", b"inf"),
    ("default_kv_lease_ttl", b"-1"), ("default_kv_lease_ttl", b"10000\n"), ("shards", b"x"), ("shards", b"0"),
    ("eviction_ratio", b"nan"), ("eviction_high_watermark_ratio", b"inf"), ("evict_on_put", b"2"),
    ("max_key_length", b"\xff"), ("put_start_release_timeout", b"1"),
], ids=repr)
def test_corrupt_stored_configuration_is_a_clear_error(backend, request, field, raw):
    if backend == "memory":
        url = f"memory://corrupt-{field}-{raw.hex()}"
    else:
        url = request.getfixturevalue({"valkey": "valkey", "redis": "redis7"}[backend]).url
        redis.Redis.from_url(url).flushall()
    Master.connect(url, MasterConfig(shards=2)).redis.hset(ShardKeys("mc", 0).config, field, raw)
    for config in (None, MasterConfig(shards=2)):  # the stored one, or a new one to write
        with pytest.raises(MasterError) as info:
            Master.connect(url, config)
        assert info.value.code == ErrorCode.INTERNAL_ERROR and field in info.value.message, info.value


def test_names_with_a_trailing_newline_are_refused(master):
    with raises_code(ErrorCode.INVALID_PARAMS):
        master.remove_all(tenant_id="default\n")  # scans in Python: never reaches a function's check
    with raises_code(ErrorCode.INVALID_PARAMS):
        master.exist_key("k", tenant_id="default\n")


# ---- 2. Python input gaps ----------------------------------------------------------------

@pytest.fixture
def m(master):
    mount(master, "seg", 1 << 16)
    return master


def test_booleans_must_be_bools(m):
    put(m, "leased", 10)
    m.get_replica_list("leased")
    before = store_snapshot(m)
    for call in (lambda: m.remove("leased", force="no"),
                 lambda: m.remove_all(force="no"),
                 lambda: m.remove_by_regex("leased", force=1),
                 lambda: m.put_start(WRITER, "k", 10, ReplicateConfig(with_hard_pin="no")),
                 lambda: m.put_start(WRITER, "k", 10, ReplicateConfig(with_hard_pin=0))):
        with raises_code(ErrorCode.INVALID_PARAMS):
            call()
    assert store_snapshot(m) == before


@pytest.mark.parametrize("prefs", ["seg", b"seg", ["seg", 5], {"seg"}, None], ids=repr)
def test_preferred_segments_must_be_a_list_of_names(m, prefs):
    with raises_code(ErrorCode.INVALID_PARAMS):
        m.put_start(WRITER, "k", 10, ReplicateConfig(preferred_segments=prefs))
    assert not m.exist_key("k")


def test_preferred_segments_as_list_or_tuple(m):
    assert m.put_start(WRITER, "a", 10, ReplicateConfig(preferred_segments=["seg"]))[0].segment == "seg"
    assert m.put_start(WRITER, "b", 10, ReplicateConfig(preferred_segments=("seg",)))[0].segment == "seg"


def test_empty_group_id_means_ungrouped(m):
    put(m, "k", 10, config=ReplicateConfig(group_id=""))
    assert m.describe("k").group_id is None
    assert m.batch_put_start(WRITER, ["x", "y"], [1, 1], ReplicateConfig(group_id="")) != [
        ErrorCode.INVALID_PARAMS] * 2


@pytest.mark.parametrize("args", [(-1,), ("SHARDS",), (0.0,), (None,), (True,), (0, 0), (0, 1025), (0, 2.0),
                                  (0, None), (0, "16")], ids=repr)
def test_evict_step_arguments_are_checked(m, args):
    args = tuple(m.shards if a == "SHARDS" else a for a in args)
    with raises_code(ErrorCode.INVALID_PARAMS):
        m.evict_step(*args)
    if len(args) == 2:
        with raises_code(ErrorCode.INVALID_PARAMS):
            m.run_eviction(args[1])


def test_evict_step_accepts_every_shard(m):
    for shard in range(m.shards):
        assert m.evict_step(shard, 1024).shard == shard


LONE = "k\udcff"  # a lone surrogate: a str that is not encodable text


def test_lone_surrogates_are_invalid_params(m):
    put(m, "k", 10)
    before = store_snapshot(m)
    for call in (lambda: m.put_start(WRITER, LONE, 10),
                 lambda: m.batch_put_start(WRITER, ["ok", LONE], [10, 10]),
                 lambda: m.put_end(WRITER, LONE),
                 lambda: m.get_replica_list(LONE),
                 lambda: m.batch_exist_key(["k", LONE]),
                 lambda: m.remove(LONE),
                 lambda: m.describe(LONE),
                 lambda: m.add_task_ref(LONE),
                 lambda: m.put_start("w\udcff", "k2", 10),
                 lambda: m.put_start(WRITER, "k2", 10, ReplicateConfig(group_id="g\udcff")),
                 lambda: m.put_start(WRITER, "k2", 10, ReplicateConfig(preferred_segments=["s\udcff"])),
                 lambda: m.mount_segment("seg\udcff", 1 << 16, "owner"),
                 lambda: m.ping("c\udcff")):
        with raises_code(ErrorCode.INVALID_PARAMS):
            call()
    assert store_snapshot(m) == before


# ---- 3. timeouts: a call without a reply has an unknown outcome -------------------------------

def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")


@pytest.fixture
def private_valkey():
    server = EmbeddedValkey(appendonly=False).start()
    yield server
    if server.proc.poll() is None:
        os.kill(server.proc.pid, signal.SIGCONT)
    server.stop()


def test_a_stalled_server_is_outcome_unknown_and_the_count_tells_what_happened(private_valkey):
    pid = private_valkey.proc.pid
    m = Master.connect(private_valkey.url, MasterConfig(shards=1), socket_timeout=0.5)
    m.freeze_clock(T0)
    mount(m, "seg", 1 << 16)
    put(m, "k", 10)
    os.kill(pid, signal.SIGSTOP)
    while not _stopped(pid):  # waiting for the process to stop, not for a deadline
        time.sleep(0.01)
    started = time.monotonic()
    with pytest.raises(MasterError) as info:
        m.add_task_ref("k")  # sent, but no reply within the read timeout
    assert info.value.code == ErrorCode.OUTCOME_UNKNOWN and "may or may not" in info.value.message
    assert time.monotonic() - started < 5
    os.kill(pid, signal.SIGCONT)
    # The documented way to find out: task references are counts, so read the count and
    # reconcile instead of retrying blindly. Here the stalled call did run once Valkey resumed.
    assert m.task_refs("k") == 1
    assert m.release_task_ref("k") == 0
    assert m.task_refs("k") == 0


def test_a_lost_server_is_outcome_unknown(private_valkey):
    m = Master.connect(private_valkey.url, MasterConfig(shards=2), connect_timeout=1, socket_timeout=1)
    private_valkey.stop()
    for call in (lambda: m.exist_key("k"), lambda: m.batch_exist_key(["a", "b", "c"]), m.usage, m.segments,
                 lambda: m.ping("c"), lambda: m.mount_segment("s", 100, "c"), lambda: m.sweep_shard(0)):
        with raises_code(ErrorCode.OUTCOME_UNKNOWN):
            call()
    with raises_code(ErrorCode.OUTCOME_UNKNOWN):
        Master.connect(private_valkey.url, connect_timeout=1)


@pytest.mark.parametrize("timeouts", [{"socket_timeout": 0}, {"socket_timeout": -1}, {"connect_timeout": math.nan},
                                      {"socket_timeout": "5"}, {"connect_timeout": True}], ids=repr)
def test_timeouts_are_checked(timeouts):
    with raises_code(ErrorCode.INVALID_PARAMS):
        Master.connect("memory://timeouts", **timeouts)


def test_task_refs(master):
    mount(master, "seg", 1 << 16)
    put(master, "k", 10)
    assert master.task_refs("k") == 0
    master.add_task_ref("k")
    master.add_task_ref("k")
    assert master.task_refs("k") == 2
    with raises_code(ErrorCode.OBJECT_NOT_FOUND):
        master.task_refs("missing")


def test_worker_loop_survives_master_errors(master, monkeypatch):
    stop = threading.Event()
    calls = []

    def failing_pass():
        calls.append(1)
        if len(calls) == 2:
            stop.set()
        raise MasterError(ErrorCode.OUTCOME_UNKNOWN, "no reply")

    worker = Worker(master)
    monkeypatch.setattr(worker, "run_once", failing_pass)
    assert worker.run(stop, interval_s=0) == 2


# ---- 4. the library is reloaded on every call path ------------------------------------------

def _flush_functions(m: Master) -> None:
    m.redis.execute_command("FUNCTION", "FLUSH")


def test_every_call_path_reloads_a_flushed_library(valkey):
    redis.Redis.from_url(valkey.url).flushall()
    m = Master.connect(valkey.url, MasterConfig(shards=4))
    m.freeze_clock(T0)
    mount(m, "seg", 1 << 16)
    keys = [f"k{i}" for i in range(16)]
    assert len({m.transport.shard_of(k.encode()) for k in keys}) > 1
    _flush_functions(m)
    assert m.batch_put_start(WRITER, keys, [10] * 16) and m.batch_put_end(WRITER, keys) == [ErrorCode.OK] * 16
    _flush_functions(m)
    assert m.ping(OWNER) == "OK"
    _flush_functions(m)
    m.mount_segment("seg2", 1 << 16, OWNER)
    _flush_functions(m)
    assert Worker(m).run_once().shards_claimed == 4
    _flush_functions(m)
    m.unmount_segment("seg2", OWNER)
    m.redis.hincrby(shard_keys(m, 0).P, "objects", 5)  # a drift for fsck to repair through a function
    _flush_functions(m)
    report = fsck(m, repair=True)
    assert report.findings and all(f.repaired for f in report.findings)
    m.close()


def test_a_library_that_will_not_load_is_an_error_not_a_recursion(valkey, monkeypatch):
    redis.Redis.from_url(valkey.url).flushall()
    m = Master.connect(valkey.url, MasterConfig(shards=1))
    import mooncake_redis.library
    import mooncake_redis.master

    monkeypatch.setattr(mooncake_redis.library, "ensure_loaded", lambda *a, **k: "x")
    monkeypatch.setattr(mooncake_redis.master, "ensure_loaded", lambda *a, **k: "x", raising=False)
    _flush_functions(m)
    with raises_code(ErrorCode.INTERNAL_ERROR):
        m.exist_key("k")
    with raises_code(ErrorCode.INTERNAL_ERROR):
        m.ping("c")
    m.close()


# ---- 5. connect-time checks of a real server ------------------------------------------------

def test_evicting_maxmemory_policy_is_refused(private_valkey):
    admin = redis.Redis.from_url(private_valkey.url)
    admin.config_set("maxmemory-policy", "allkeys-lru")
    with pytest.raises(MasterError) as info:
        Master.connect(private_valkey.url, MasterConfig())
    assert info.value.code == ErrorCode.INTERNAL_ERROR and "allkeys-lru" in info.value.message
    assert not admin.keys("mc:*")  # refused before writing anything
    Master.connect(private_valkey.url, MasterConfig(), require_noeviction=False).close()  # the opt-out
    admin.config_set("maxmemory-policy", "noeviction")
    Master.connect(private_valkey.url, MasterConfig()).close()


def _acl_user(admin: redis.Redis, name: str, pattern: str, commands: set[str], extra: tuple = ()) -> str:
    admin.execute_command("ACL", "SETUSER", name, "reset", "on", ">pw", pattern, "-@all",
                          *[f"+{c.lower()}" for c in sorted(commands)], *extra)
    return name


def test_acl_user_limited_to_its_namespace(private_valkey, caplog):
    admin = redis.Redis.from_url(private_valkey.url)
    for ns in ("ns1", "ns2"):
        Master.connect(private_valkey.url, MasterConfig(namespace=ns, shards=2)).close()  # the admin sets up
    url = f"redis://tenant1:pw@127.0.0.1:{private_valkey.port}/0"
    _acl_user(admin, "tenant1", "~ns1:*", preflight.needed_commands(), ("+acl|whoami", "+acl|dryrun"))
    m = Master.connect(url, MasterConfig(namespace="ns1", shards=2))
    assert "maxmemory-policy" in caplog.text  # no CONFIG GET for this user: a warning, not a refusal
    m.freeze_clock(T0)
    mount(m, "seg", 1 << 16)
    put(m, "k", 10)
    assert m.get_replica_list("k").replicas and m.add_task_ref("k") == 1 and m.release_task_ref("k") == 0
    m.remove("k", force=True)
    assert Worker(m).run_once().shards_claimed == 2
    assert fsck(m).findings == []
    m.unmount_segment("seg", OWNER)
    m.close()
    with pytest.raises(MasterError) as info:  # the other tenant's namespace
        Master.connect(url, MasterConfig(namespace="ns2", shards=2))
    assert info.value.code == ErrorCode.INTERNAL_ERROR and "'ns2:{ns2:0}'" in info.value.message, info.value
    # a user missing one command the functions run is refused at connect, the command named
    _acl_user(admin, "tenant1", "~ns1:*", preflight.needed_commands() - {"ZREVRANGEBYSCORE"},
              ("+acl|whoami", "+acl|dryrun"))
    with pytest.raises(MasterError) as info:
        Master.connect(url, MasterConfig(namespace="ns1", shards=2))
    assert "'zrevrangebyscore'" in info.value.message, info.value


def test_acl_user_that_may_not_check_itself_gets_a_warning(private_valkey, caplog):
    admin = redis.Redis.from_url(private_valkey.url)
    Master.connect(private_valkey.url, MasterConfig(namespace="ns1")).close()
    _acl_user(admin, "tenant1", "~ns1:*", preflight.needed_commands())
    Master.connect(f"redis://tenant1:pw@127.0.0.1:{private_valkey.port}/0", MasterConfig(namespace="ns1")).close()
    assert "cannot check" in caplog.text


def test_acl_check_covers_every_command_of_the_functions():
    source = library_source()[0]
    used = set(re.findall(r"redis\.p?call\(\s*['\"]([A-Za-z]+)['\"]", source))
    assert used and {c.upper() for c in used} <= set(preflight.DRYRUN_ARGS)


def test_documented_acl_line_lists_every_needed_command():
    doc = (Path(__file__).resolve().parent.parent / "docs" / "operations.md").read_text()
    line = next(x for x in doc.splitlines() if "ACL SETUSER mc-master" in x)
    granted = {w[1:].upper() for w in line.split() if w.startswith("+")}
    assert granted - {"ACL|WHOAMI", "ACL|DRYRUN"} == preflight.needed_commands()


# ---- 6. binary ids in displays, passwords in CLI messages ----------------------------------

BIN_CLIENT = b"\xff\xfeclient"


def test_segments_and_status_show_binary_ids(valkey):
    redis.Redis.from_url(valkey.url).flushall()
    m = Master.connect(valkey.url, MasterConfig(shards=2))
    m.freeze_clock(T0)
    for p in all_shard_keys(m):  # wire-legal: any bytes
        m.redis.execute_command("FCALL", "mc_mount_segment", 1, p.P, 4, "name", b"seg\xff", "client_id", BIN_CLIENT, "base", 0, "size", 1000)
        m.redis.execute_command("FCALL", "mc_claim", 1, p.P, b"\xffworker", 5000)
        m.redis.hset(p.metrics, mapping={"last_pass_ms": T0, "last_worker": b"\xffworker"})
    assert m.segments() == [{"name": "seg\\xff", "client": "\\xff\\xfeclient", "size": 2000, "used": 0}]
    r = CliRunner().invoke(cli, ["--redis", valkey.url, "status"], env={"MOONCAKE_REDIS_URL": None})
    assert r.exit_code == 0, r.output
    assert "\\xff\\xfeclient" in r.stdout and "\\xffworker" in r.stdout
    m.close()


def test_stray_keys_with_a_binary_tenant_are_skipped(master):
    master.redis.hset(shard_keys(master, 0).object(b"\xff", b"k"), "size", 1)
    assert master.remove_all() == 0
    for shard in range(master.shards):
        master.sweep_shard(shard)


@pytest.mark.parametrize("url", [
    "redis://127.0.0.1:{port}/0?password=s3cr3t",
    "redis://user:s3cr3t@127.0.0.1:{port}/0",
    "redis://user:s3cr3t@127.0.0.1:notaport/0",
    "redis://user:s3@cr3t@127.0.0.1:{port}/0",
    "unix:///nonexistent/redis.sock?password=s3cr3t",
])
@pytest.mark.parametrize("command", [["status"], ["inspect", "k"], ["serve"], ["worker"], ["fsck"]])
def test_passwords_are_never_printed(url, command):
    url = url.format(port=free_port())
    r = CliRunner().invoke(cli, ["--redis", url, *command], env={"MOONCAKE_REDIS_URL": None})
    assert r.exit_code == 2, r.output
    assert "cr3t" not in r.output, r.output


def test_a_loading_server_is_unavailable_not_an_internal_error():
    """LOADING (and BUSY, MASTERDOWN, ...) mean the call did not run: a retryable code."""
    from mooncake_redis.transport import error_of

    assert error_of(redis.BusyLoadingError("Valkey is loading the dataset in memory")).code == ErrorCode.UNAVAILABLE
    assert error_of(redis.ResponseError("BUSY Valkey is busy running a script.")).code == ErrorCode.UNAVAILABLE
    assert error_of(redis.ResponseError("NOPERM no permissions")).code == ErrorCode.INTERNAL_ERROR
    assert error_of(redis.ResponseError("INVALID_PARAMS -600 bad")).code == ErrorCode.INVALID_PARAMS
