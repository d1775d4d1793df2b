"""Instructions per call of the functions, counted by valgrind's callgrind: exact figures where
wall-clock ones are noisy.

A private valkey-server runs under `valgrind --tool=callgrind`. For each figure the counters are
zeroed (`callgrind_control -z`), n calls are made, the counts are dumped (`callgrind_control -d`)
and the dump's `summary:` (instructions the server executed in between) is divided by the calls
(or keys). Each window starts after a full Lua garbage collection and ends with one (FCALLs of
`mcb_gc`), so a figure pays for collecting the garbage its own calls made and for no other's. A
window with no call in it (the event loop's work between a zero and a dump, and the collection of
a heap without garbage) is counted too, and subtracted. The same figure comes back within about
0.5% on every run, on any load, because nothing here depends on time (docs/bench.md,
"Instructions per call").

Beside each operation of ours (through `Master`, on the lean transport, as `bench ops` drives
it) it measures in the same run:

* a no-op FCALL (`mcb_noop` of a small library of its own, `mcbench`) and a plain HGETALL from
  the client (no Lua);
* the **floor** of the operation: a function of `mcbench` that makes exactly the Redis calls ours
  makes on its success path, with the same reply, and nothing else (no argument parsing, no
  checks, no tables but the ones a call or the reply needs). ours - floor is what our Lua logic
  costs on top of the Redis calls. Whether the floor still makes the same calls as ours (the
  library changes) is checked on every run from INFO commandstats, and a difference is printed;
* the cost of one redis.call from Lua, first and further in a function, for TIME, HGET, HSET,
  HGETALL and ZADD (`mcb_<cmd>1` and `mcb_<cmd>2`: one and two calls), split into the command
  itself and the bridge around it (the Lua <-> Redis conversion and call()'s bookkeeping).

Where the instructions go is read from the dump's call graph: inside redis.call (arcs into the
Lua C function behind redis.call) and, inside that, in the command procedures (arcs into
`<name>Command`).

    python -m mooncake_redis.bench.instructions [--n N] [--store N]

Needs valgrind (Debian/Ubuntu: apt-get install valgrind). Everything it starts and writes (the
server, valgrind's dumps and pipes) lives in one temporary directory, removed at the end.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import redis

from mooncake_redis import Master, MasterConfig
from mooncake_redis.functions import server_library
from mooncake_redis.keys import K, ShardKeys, shard_key
from mooncake_redis.server import EmbeddedValkey, valkey_binary

from .common import cpu_model

INSTALL = "apt-get install valgrind"
NAMESPACE = "bench"
P = shard_key(NAMESPACE, 0)          # the one shard's key
KEYS = ShardKeys(NAMESPACE, 0)
CLIENT = "bench-client"
SEGMENT = "bench-seg"
SEGMENT_SIZE = 1 << 44               # 16 TiB: never the limit here
OBJECT_SIZE = 1 << 16                # 64 KiB per object, 1 replica
STORE = 2000                         # stored objects the reads go over (default)
BATCH = 100                          # keys per batch call
PENDING = 200                        # puts left in progress: P:processing stays a skiplist (> 128)
WARMUP = 3                           # untimed calls of each case first (the library's memos fill)
START_TIMEOUT_S = 120.0              # valkey-server under valgrind starts slowly on a busy machine
CONTROL_TIMEOUT_S = 120.0            # one callgrind_control call
EMPTY_WINDOWS = 3
# the Lua C functions behind redis.call and redis.pcall (script_lua.c)
REDIS_CALL_FNS = ("luaRedisCallCommand", "luaRedisPCallCommand")
CLIENT_COMMANDS = {"fcall", "fcall_ro", "info"}  # commandstats rows that are not redis.calls
TINY = ("TIME", "HGET", "HSET", "HGETALL", "ZADD")
PUT_START_FIELDS = "'shards', 'put_start_discard_timeout', 'put_start_release_timeout', " \
               "'default_kv_soft_pin_ttl', 'max_kv_soft_pin_ttl', 'max_key_length', 'evict_on_put', " \
               "'allow_evict_soft_pinned_objects', 'guaranteed_capacity_ratio', 'guaranteed_tenant_ratio', " \
               "'max_guaranteed_ttl', 'allow_evict_retained_groups', 'enable_radix_tree'"

LUA_K = ", ".join(f"{name} = '{K[name]}'" for name in (
    "config", "object", "segment", "segments", "free", "free_by_off", "free_by_size", "held",
    "processing", "tier_ordinary"))

# The baselines. Every floor takes KEYS[1] = the shard key and builds the keys the way ours does
# (P .. K.<name>), passes numbers to redis.call as numbers (Redis formats them), and reads what it
# needs from a reply by position: the object hash holds `size` first and its replicas (`reps`)
# last (as put_start and put_end write it).
LIBRARY = f"""#!lua name=mcbench
local K = {{ {LUA_K} }}  -- the key suffixes, from mooncake_redis.keys.K
local function now_of(t) return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) end

-- a full garbage collection: before every measured window, and as its last call
redis.register_function('mcb_gc', function(k, a) collectgarbage('collect') return 1 end)

-- no-op and one or two calls of one command; every one takes 1 key and 4 arguments
redis.register_function('mcb_noop', function(k, a) return 1 end)
redis.register_function('mcb_time1', function(k, a) redis.call('TIME') return 1 end)
redis.register_function('mcb_time2', function(k, a) redis.call('TIME') redis.call('TIME') return 1 end)
redis.register_function('mcb_hget1', function(k, a) redis.call('HGET', k[1], 'mount') return 1 end)
redis.register_function('mcb_hget2', function(k, a)
  redis.call('HGET', k[1], 'mount') redis.call('HGET', k[1], 'mount') return 1 end)
redis.register_function('mcb_hgetall1', function(k, a) redis.call('HGETALL', k[1]) return 1 end)
redis.register_function('mcb_hgetall2', function(k, a)
  redis.call('HGETALL', k[1]) redis.call('HGETALL', k[1]) return 1 end)
redis.register_function('mcb_hset1', function(k, a) redis.call('HSET', k[1], 'lease_until', a[1]) return 1 end)
redis.register_function('mcb_hset2', function(k, a)
  redis.call('HSET', k[1], 'lease_until', a[1]) redis.call('HSET', k[1], 'lease_until', a[2]) return 1 end)
redis.register_function('mcb_zadd1', function(k, a) redis.call('ZADD', k[1], 'XX', a[1], a[3]) return 1 end)
redis.register_function('mcb_zadd2', function(k, a)
  redis.call('ZADD', k[1], 'XX', a[1], a[3]) redis.call('ZADD', k[1], 'XX', a[2], a[4]) return 1 end)

-- exist_key / get_replica_list of ARGV[2..] (ARGV[1]: their segment): config (with the clock and
-- the mount epoch), the clock, then per key the HMGET of the fields a read takes (the segment's
-- mount id is remembered between calls), one ZADD XX GT for all (the lease lives in the tier);
-- exist_key takes the fields but size and checksum
local READ_FIELDS = {{ 'size', 'status', 'reps', 'group', 'node', 'special', 'checksum' }}
local EXIST_READ_FIELDS = {{ 'reps', 'status', 'group', 'node', 'special' }}
local function read(P, args, fields, shape, read_fields)
  local cfg = redis.call('HMGET', P .. K.config, unpack(fields))
  local ttl = tonumber(cfg[2])
  local lease = now_of(redis.call('TIME')) + ttl
  local seg, zadd, reply = args[1], {{ 'XX', 'GT' }}, {{}}
  for i = 2, #args do
    local okey = P .. K.object .. 'default:' .. args[i]
    local o = redis.call('HMGET', okey, unpack(read_fields))
    zadd[2 * i - 1], zadd[2 * i] = lease, 'o:default:' .. args[i]
    reply[i - 1] = shape(o, ttl, seg)
  end
  redis.call('ZADD', P .. K.tier_ordinary, unpack(zadd))
  return reply
end
local EXIST_FIELDS = {{ 'shards', 'default_kv_lease_ttl', 'kv_lease_slack', 'clock', 'mounts' }}
local GET_FIELDS = {{ 'shards', 'default_kv_lease_ttl', 'kv_lease_slack', 'max_guaranteed_ttl', 'clock', 'mounts' }}
local function exist_shape() return 1 end
local function get_shape(o, ttl, seg)  -- with_disk=1: ttl, size, checksum, memory replicas, seg, offset
  return {{ ttl, tonumber(o[1]), '', 1, seg, tonumber(string.match(o[3], '^%d+')) }}
end
redis.register_function('mcb_floor_exist', function(k, a)
  return read(k[1], a, EXIST_FIELDS, exist_shape, EXIST_READ_FIELDS) end)
redis.register_function('mcb_floor_get', function(k, a) return read(k[1], a, GET_FIELDS, get_shape, READ_FIELDS) end)

-- put_start of ARGV[2] (ARGV[3] bytes, client ARGV[1]): the fullest segments (nothing held is
-- due: the config's held_due says so), the object, best fit from the free lists, accounting, the
-- object hash, processing
redis.register_function('mcb_floor_put_start', function(k, a)
  local P, client, key, size = k[1], a[1], a[2], tonumber(a[3])
  redis.call('HMGET', P .. K.config, {PUT_START_FIELDS}, 'clock', 'mounts', 'held_due')
  local now = now_of(redis.call('TIME'))
  local seg = redis.call('ZREVRANGE', P .. K.segments, 0, 16)[1]
  local okey = P .. K.object .. 'default:' .. key
  redis.call('HGETALL', okey)
  local mount = '1' -- the segment's mount id is remembered between calls
  local by_off, by_size = P .. K.free .. seg .. K.free_by_off, P .. K.free .. seg .. K.free_by_size
  local hit = redis.call('ZRANGEBYSCORE', by_size, size, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  local off, len = tonumber(hit[1]), tonumber(hit[2])
  redis.call('ZREM', by_off, hit[1])
  redis.call('ZREM', by_size, hit[1])
  redis.call('ZADD', by_off, off + size, off + size)
  redis.call('ZADD', by_size, len - size, off + size)
  redis.call('HINCRBY', P .. K.segment .. seg, 'used', size)
  redis.call('ZINCRBY', P .. K.segments, -size, seg)
  redis.call('HINCRBY', P, 'used_bytes', size)
  redis.call('HSET', okey, 'size', size, 'status', 'processing', 'writer', client,
    'reps', off .. ' ' .. mount .. ' ' .. #seg .. ' ' .. seg)
  redis.call('ZADD', P .. K.processing, now, 'default:' .. key)
  redis.call('HINCRBY', P, 'objects', 1)
  return {{ {{ seg, off }} }}
end)

-- put_end of ARGV[2]: the object complete, out of processing, into the ordinary tier
redis.register_function('mcb_floor_put_end', function(k, a)
  local P, key = k[1], a[2]
  redis.call('HMGET', P .. K.config, 'shards', 'offload_on_put', 'offload_queue_limit', 'clock', 'mounts')
  local now = now_of(redis.call('TIME'))
  local okey = P .. K.object .. 'default:' .. key
  redis.call('HGETALL', okey)
  redis.call('HDEL', okey, 'status')
  redis.call('ZREM', P .. K.processing, 'default:' .. key)
  redis.call('ZADD', P .. K.tier_ordinary, now, 'o:default:' .. key)
  return {{ 0 }}
end)

-- remove of ARGV[2] (on segment ARGV[1]) whose extent ends where the free tail starts: the
-- neighbour lookups, accounting, the merged extent, the object and its tier entry
redis.register_function('mcb_floor_remove', function(k, a)
  local P, seg, key = k[1], a[1], a[2]
  redis.call('HMGET', P .. K.config, 'shards', 'clock', 'mounts')
  redis.call('TIME')
  local okey = P .. K.object .. 'default:' .. key
  local o = redis.call('HGETALL', okey)
  local size, off = tonumber(o[2]), tonumber(string.match(o[#o], '^%d+'))
  redis.call('ZSCORE', P .. K.tier_ordinary, 'o:default:' .. key) -- the lease in the tier
  local by_off, by_size = P .. K.free .. seg .. K.free_by_off, P .. K.free .. seg .. K.free_by_size
  redis.call('ZREVRANGEBYSCORE', by_off, '(' .. off, '-inf', 'LIMIT', 0, 1)
  local nxt = redis.call('ZRANGEBYSCORE', by_off, off, off + size, 'LIMIT', 0, 1)[1]
  local nlen = tonumber(redis.call('ZSCORE', by_size, nxt))
  redis.call('HINCRBY', P .. K.segment .. seg, 'used', -size)
  redis.call('ZINCRBY', P .. K.segments, size, seg)
  redis.call('HINCRBY', P, 'used_bytes', -size)
  redis.call('ZREM', by_off, nxt)
  redis.call('ZREM', by_size, nxt)
  redis.call('ZADD', by_off, off, off)
  redis.call('ZADD', by_size, size + nlen, off)
  redis.call('DEL', okey)
  redis.call('HINCRBY', P, 'objects', -1)
  redis.call('ZREM', P .. K.tier_ordinary, 'o:default:' .. key)
  return {{ 0 }}
end)
"""


class CallgrindUnavailable(RuntimeError):
    """valgrind or callgrind_control is missing; the message says what to install."""


def find_valgrind() -> tuple[str, str]:
    """(valgrind, callgrind_control) executables, or CallgrindUnavailable."""
    found = [shutil.which(name) for name in ("valgrind", "callgrind_control")]
    missing = [name for name, path in zip(("valgrind", "callgrind_control"), found) if not path]
    if missing:
        raise CallgrindUnavailable(f"{' and '.join(missing)} not found: bench instructions runs the server "
                                   f"under valgrind's callgrind ({INSTALL})")
    valgrind, control = found
    assert valgrind is not None and control is not None  # none missing
    return valgrind, control


def valgrind_version(valgrind: str) -> str:
    try:
        return subprocess.run([valgrind, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "valgrind (version unknown)"


# ---- callgrind dumps ---------------------------------------------------------------------

_NAME = re.compile(r"\((\d+)\)(?: (.*))?")


def parse_dump(path: str) -> tuple[int, dict[str, list[int]]]:
    """(summary instructions, {callee: [calls, inclusive instructions]}) of one callgrind dump:
    every call arc into a function, summed over its callers (`calls=` lines, each followed by
    the inclusive cost of that arc). Function names may be compressed as "(id) name", then
    "(id)"; a recursion level shows as name'2."""
    names: dict[str, str] = {}
    arcs: dict[str, list[int]] = {}
    summary = None
    callee, pending_calls = None, None

    def name_of(text: str) -> str:
        m = _NAME.fullmatch(text)
        if not m:
            return text
        if m.group(2) is not None:
            names[m.group(1)] = m.group(2)
        return names.get(m.group(1), text)

    with open(path) as f:
        for line in f:
            if pending_calls is not None:
                cost = line.split()
                assert callee is not None  # a calls= line follows its cfn= line
                arc = arcs.setdefault(callee, [0, 0])
                arc[0] += pending_calls
                arc[1] += int(cost[1]) if len(cost) > 1 else 0
                pending_calls = None
            elif line.startswith("cfn="):
                callee = name_of(line[4:].rstrip("\n"))
            elif line.startswith("fn="):
                name_of(line[3:].rstrip("\n"))  # defines the id; arcs are keyed by callee only
            elif line.startswith("calls="):
                pending_calls = int(line[6:].split()[0])
            elif line.startswith("summary:"):
                summary = int(line.split()[1])
    if summary is None:
        raise RuntimeError(f"no summary line in the callgrind dump {path}")
    return summary, arcs


@dataclass
class Window:
    """What the server did in one measured window."""
    instructions: int                 # summary minus an empty window's
    commands: dict[str, int]          # redis.calls by command (INFO commandstats delta, lower case)
    arcs: dict[str, list[int]] = field(repr=False)

    def inclusive(self, *fns: str) -> int:
        return sum(self.arcs.get(fn, (0, 0))[1] for fn in fns)

    @property
    def in_redis_call(self) -> int:
        """Instructions inside redis.call (from Lua's call into it until it returns)."""
        return self.inclusive(*REDIS_CALL_FNS)

    @property
    def in_commands(self) -> int | None:
        """Instructions in the procedures of the commands run from Lua, or None when one of
        them is not in the call graph under its usual name."""
        procs = [f"{name}Command" for name in self.commands]
        if any(p not in self.arcs for p in procs):
            return None
        return self.inclusive(*procs)


class CallgrindValkey:
    """valkey-server (the one mooncake_redis.server finds) under callgrind, in `tmp`: the wrapper
    script, the server's directory, callgrind's dumps and valgrind's vgdb pipes all live there."""

    def __init__(self, tmp: str, valgrind: str, control: str, aof: bool = False):
        self.tmp, self.valgrind, self.control = tmp, valgrind, control
        self.out_dir = os.path.join(tmp, "callgrind")
        os.makedirs(self.out_dir)
        self.vgdb_prefix = os.path.join(tmp, "vgdb")
        wrapper = os.path.join(tmp, "valkey-under-callgrind")
        with open(wrapper, "w") as f:
            f.write("#!/bin/sh\nexec " + " ".join(shlex.quote(a) for a in (
                valgrind, "--tool=callgrind", "-q", f"--callgrind-out-file={self.out_dir}/out.%p",
                f"--vgdb-prefix={self.vgdb_prefix}", valkey_binary())) + ' "$@"\n')
        os.chmod(wrapper, 0o700)
        # hz 1: the server's timer work (not a per-call cost) reaches fewer windows
        self.server = EmbeddedValkey(data_dir=os.path.join(tmp, "valkey"), appendonly=aof, binary=wrapper,
                                     extra_args=("--hz", "1"))
        self.pid: int | None = None
        self.empty = 0  # an empty window's instructions, subtracted from every window

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> "CallgrindValkey":
        self.server.start(timeout_s=START_TIMEOUT_S)
        assert self.server.proc is not None  # started
        self.pid = self.server.proc.pid  # the wrapper execs valgrind, which runs valkey-server in place
        return self

    def stop(self) -> None:
        self.server.stop()

    def _control(self, *args: str) -> None:
        try:
            subprocess.run([self.control, f"--vgdb-prefix={self.vgdb_prefix}", *args, str(self.pid)],
                           check=True, capture_output=True, text=True, timeout=CONTROL_TIMEOUT_S)
        except subprocess.CalledProcessError as exc:
            why = (exc.stderr or exc.stdout).strip()
            raise RuntimeError(f"callgrind_control {' '.join(args)} failed: {why}") from None

    def _dumps(self) -> list[str]:
        prefix = f"out.{self.pid}."
        return [os.path.join(self.out_dir, f) for f in os.listdir(self.out_dir) if f.startswith(prefix)]

    def _dump(self) -> str:
        """Dump the counts; the path of the complete dump file."""
        for old in self._dumps():
            os.remove(old)
        self._control("--dump")
        deadline = time.monotonic() + CONTROL_TIMEOUT_S
        while True:
            got = self._dumps()
            if got and _complete(got[0]):
                return got[0]
            if time.monotonic() > deadline:
                raise RuntimeError(f"callgrind wrote no complete dump into {self.out_dir}")
            time.sleep(0.02)  # waiting for valgrind to finish writing, not for a deadline

    def window(self, r: redis.Redis, run: Callable[[], Any]) -> Window:
        """Collect Lua's garbage, zero the counters, run, collect the garbage again, dump: the
        window's counts, the collection of the garbage its calls made included (INFO is read
        outside the window)."""
        before = _commandstats(r)
        r.fcall("mcb_gc", 0)
        self._control("--zero")
        run()
        r.fcall("mcb_gc", 0)
        path = self._dump()
        after = _commandstats(r)
        summary, arcs = parse_dump(path)
        os.remove(path)
        commands = {name: after[name] - before.get(name, 0) for name in after
                    if name not in CLIENT_COMMANDS and after[name] != before.get(name, 0)}
        return Window(summary - self.empty, commands, arcs)

    def calibrate(self, r: redis.Redis) -> int:
        """Count windows with nothing in them (but the collection of a heap without garbage);
        their median is subtracted from every window."""
        self.empty = 0
        self.empty = int(statistics.median(self.window(r, lambda: None).instructions for _ in range(EMPTY_WINDOWS)))
        return self.empty


def _complete(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 200))
            return b"\ntotals:" in f.read()
    except OSError:
        return False


def _changes(r: redis.Redis) -> int:
    """Changes to the data so far (what the AOF and the replicas get): a ZADD XX GT that moves no
    score is a call but no change."""
    return int(r.info("persistence")["rdb_changes_since_last_save"])


def _commandstats(r: redis.Redis) -> dict[str, int]:
    return {name.removeprefix("cmdstat_").lower(): int(row["calls"]) for name, row in r.info("commandstats").items()}


# ---- the run -----------------------------------------------------------------------------

def main(n: int = 400, out=print, store: int | None = None, aof: bool = False) -> dict:
    """Run the benchmark on a private valkey-server under callgrind; print its tables through
    `out`; return every figure. `store`: stored objects the reads go over (default STORE).
    `aof`: the server appends to an AOF (appendfsync everysec, as `serve` runs it), so every
    write a call makes is also fed to the AOF. Raises CallgrindUnavailable (before starting
    anything) when valgrind is missing."""
    store = STORE if store is None else store
    if n < 1 or store < 2 * BATCH:
        raise ValueError(f"n must be >= 1 and store >= {2 * BATCH}")
    with contextlib.ExitStack() as stack:
        server, r, master = callgrind_master(stack, MasterConfig(namespace=NAMESPACE, shards=1), "callgrind", aof)
        return _run(server, master, r, n, store, valgrind_version(server.valgrind), aof, out)


def put_complete(master: Master, keys: list[str], chunk: int = 1000) -> None:
    """Put `keys` as complete objects of OBJECT_SIZE (batch_put_start + batch_put_end, `chunk`
    keys a call); any refusal raises."""
    for i in range(0, len(keys), chunk):
        part = keys[i:i + chunk]
        if any(not isinstance(x, list) for x in master.batch_put_start(CLIENT, part, [OBJECT_SIZE] * len(part))):
            raise RuntimeError("batch_put_start failed")
        if any(c != 0 for c in master.batch_put_end(CLIENT, part)):
            raise RuntimeError("batch_put_end failed")


def callgrind_master(stack: contextlib.ExitStack, config: MasterConfig, name: str,
                     aof: bool = False) -> tuple["CallgrindValkey", redis.Redis, Master]:
    """A private valkey-server under callgrind (in a temporary directory
    mooncake-bench-<name>-*), a client of it and a Master on it with `config`, all closed by
    `stack` (this bench, bench/reads.py, bench/writes.py)."""
    valgrind, control = find_valgrind()
    tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix=f"mooncake-bench-{name}-"))
    server = CallgrindValkey(tmp, valgrind, control, aof=aof)
    stack.callback(server.stop)
    server.start()
    r = redis.Redis.from_url(server.url)
    stack.callback(r.close)
    master = Master.connect(server.url, config)
    stack.callback(master.close)
    return server, r, master


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:,.0f}"


def _each(fn: Callable[[Any], object], keys: Iterable[Any]) -> None:
    for k in keys:
        fn(k)


def _per(w: Window, units: int) -> dict[str, Any]:
    commands = w.in_commands
    return {"instructions": w.instructions / units, "in_redis_call": w.in_redis_call / units,
            "in_commands": None if commands is None else commands / units,
            "redis_calls": sum(w.commands.values()) / units, "commands": w.commands}


def _run(server: CallgrindValkey, master: Master, r: redis.Redis, n: int, store: int, valgrind: str, aof: bool,
         out) -> dict:
    batch_calls = max(1, n // 8)  # 50 at n=400
    res: dict[str, Any] = {"n": n, "batch_calls": batch_calls, "batch_keys": BATCH, "store_objects": store,
                           "pending_puts": PENDING, "aof": aof}
    info = r.info("server")
    res["server"] = f"{info.get('server_name', 'redis')} {info.get('valkey_version') or info.get('redis_version')}"
    res["valgrind"] = valgrind
    res["library_version"] = (server_library(master.redis) or ("not loaded",))[0]
    out(f"server   {res['server']} under {valgrind} --tool=callgrind (private, appendonly "
        f"{'yes, appendfsync everysec' if aof else 'no'}); "
        f"library {res['library_version']}")
    out(f"machine  {os.cpu_count()} cores, {cpu_model()}; Python {platform.python_version()}")
    out(f"run      n={n:,} calls per figure, batches {batch_calls:,} calls of {BATCH} keys; reads over "
        f"{store:,} stored objects of {OBJECT_SIZE >> 10} KiB (1 replica, 1 shard, {PENDING} puts in "
        f"progress); instructions the server executed, minus an empty window's")

    master.mount_segment(SEGMENT, SEGMENT_SIZE, CLIENT)
    keys = [f"obj-{i:06d}" for i in range(store)]
    put_complete(master, keys)
    # puts in progress, as a live store has: P:processing is a skiplist from the start, so the
    # puts measured first (ours) and second (the floor's) add to the same kind of sorted set
    pending = [f"pending-{i:06d}" for i in range(PENDING)]
    if any(not isinstance(x, list) for x in master.batch_put_start(CLIENT, pending, [OBJECT_SIZE] * PENDING)):
        raise RuntimeError("batch_put_start of the pending puts failed")
    r.function_load(LIBRARY, replace=True)
    res["empty_window_instructions"] = server.calibrate(r)

    def key_at(j: int) -> str:
        return keys[(j * 7919) % store]  # spread over the store

    def window_of(j0: int) -> list[str]:
        s = (j0 * BATCH) % (store - BATCH + 1)
        return keys[s:s + BATCH]

    # ---- the floors answer as ours do ----
    k0 = key_at(0)
    ours_get = r.fcall("mc_get_replica_list", 1, P, 2, "tenant", "default", "with_disk", "1", 1, "key", k0)
    floor_get = r.fcall("mcb_floor_get", 1, P, SEGMENT, k0)
    res["floor_reply_matches"] = ours_get == floor_get
    if ours_get != floor_get:
        out(f"note     mcb_floor_get replies {floor_get!r}, mc_get_replica_list {ours_get!r}: the object "
            f"layout changed, the floor reads the wrong fields")

    # ---- baselines ----
    okeys = [KEYS.object("default", k.encode()) for k in keys]
    noop_args = (1, P, "a", "b", "c", "d")

    def noop() -> None:
        f = r.fcall
        for _ in range(n):
            f("mcb_noop", *noop_args)

    def hgetall() -> None:
        ex = r.execute_command
        for j in range(n):
            ex("HGETALL", okeys[(j * 7919) % store])

    for _ in range(WARMUP):
        r.fcall("mcb_noop", *noop_args)
        r.execute_command("HGETALL", okeys[0])
    base_noop = server.window(r, noop).instructions / n
    plain = server.window(r, hgetall)
    hgetall_body = plain.inclusive("hgetallCommand") / n
    res["baselines"] = {"noop_fcall_instructions": base_noop, "hgetall_plain_instructions": plain.instructions / n,
                        "hgetall_plain_command_instructions": hgetall_body}
    out("baselines (instructions per call)")
    out(f"  {'no-op FCALL (mcb_noop, 1 key, 4 arguments)':<46}{_fmt(base_noop):>10}")
    out(f"  {'HGETALL from the client, no Lua':<46}{_fmt(plain.instructions / n):>10}   "
        f"of which the command itself {_fmt(hgetall_body)}")

    # ---- the operations and their floors ----
    ops = _operations(server, master, r, n, batch_calls, key_at, window_of)
    res["operations"] = {}
    labels = {name: name + (f" x{BATCH}, per key" if unit == "key" else "") for name, (unit, *_) in ops.items()}
    width = max(len(x) for x in labels.values()) + 4
    out("operations (instructions per call, per key for the batches; floor: the same redis.calls, nothing else)")
    out(f"  {'':<{width}}{'ours':>10}{'floor':>10}{'ours/floor':>12}{'ours-floor':>12}{'redis.calls':>13}")
    notes = []
    for name, (unit, units, ours, floor) in ops.items():
        o, f = _per(ours, units), _per(floor, units)
        same = ours.commands == floor.commands
        row = {"unit": unit, "ours_instructions": o["instructions"], "floor_instructions": f["instructions"],
               "ratio": o["instructions"] / f["instructions"],
               "logic_instructions": o["instructions"] - f["instructions"],
               "redis_calls": o["redis_calls"], "floor_redis_calls": f["redis_calls"], "floor_same_calls": same,
               "ours_in_redis_call_instructions": o["in_redis_call"], "ours_in_commands_instructions": o["in_commands"],
               "floor_in_redis_call_instructions": f["in_redis_call"],
               "floor_in_commands_instructions": f["in_commands"],
               "commands": {c: v / units for c, v in sorted(ours.commands.items())}}
        res["operations"][name] = row
        out(f"  {labels[name]:<{width}}{_fmt(o['instructions']):>10}{_fmt(f['instructions']):>10}{row['ratio']:>12.2f}"
            f"{_fmt(row['logic_instructions']):>12}{o['redis_calls']:>13.2f}")
        if not same:
            diff = [f"{c} {ours.commands.get(c, 0) / units:g} vs {floor.commands.get(c, 0) / units:g}"
                    for c in sorted(set(ours.commands) | set(floor.commands))
                    if ours.commands.get(c, 0) != floor.commands.get(c, 0)]
            notes.append(f"  note: {name}: the floor's redis.calls differ from ours (the library changed?): "
                         + ", ".join(diff))
    for note in notes:
        out(note)
    out("where they go: outside redis.call (the FCALL and the Lua code), inside it around the command")
    out("(the bridge: arguments to Redis, call(), the reply to Lua) and in the command procedures")
    out(f"  {'':<{width}}{'ours:':<6}{'outside':>9}{'bridge':>9}{'commands':>10}   {'floor:':<7}{'outside':>9}"
        f"{'bridge':>9}{'commands':>10}")
    for name, row in res["operations"].items():
        parts = []
        for who in ("ours", "floor"):
            total, inside = row[f"{who}_instructions"], row[f"{who}_in_redis_call_instructions"]
            commands = row[f"{who}_in_commands_instructions"]
            parts.append(f"{_fmt(total - inside):>9}{_fmt(None if commands is None else inside - commands):>9}"
                         f"{_fmt(commands):>10}")
        out(f"  {labels[name]:<{width}}{'':<6}{parts[0]}   {'':<7}{parts[1]}")

    # ---- reads within the lease slack ----
    res["within_slack"] = _within_slack(server, master, r, n, batch_calls, key_at, window_of, res["operations"], out)

    # ---- one redis.call, first and further ----
    res["redis_call"] = _redis_calls(server, r, n, keys, base_noop, out)
    return res


def _operations(server: CallgrindValkey, master: Master, r: redis.Redis, n: int, batch_calls: int,
                key_at, window_of) -> dict[str, tuple[str, int, Window, Window]]:
    """name -> (unit, units, ours, floor), each a measured window."""
    got: dict[str, tuple[str, int, Window, Window]] = {}
    f = r.fcall

    def reads(name: str, ours_one, floor_fn: str) -> None:
        for j in range(WARMUP):
            ours_one(key_at(j))
            f(floor_fn, 1, P, SEGMENT, key_at(j))
        ours = server.window(r, lambda: [ours_one(key_at(j)) for j in range(n)])
        floor = server.window(r, lambda: [f(floor_fn, 1, P, SEGMENT, key_at(j)) for j in range(n)])
        got[name] = ("call", n, ours, floor)

    def batch(name: str, ours_many, floor_fn: str) -> None:
        for j in range(WARMUP):
            ours_many(window_of(j))
            f(floor_fn, 1, P, SEGMENT, *window_of(j))
        ours = server.window(r, lambda: [ours_many(window_of(j)) for j in range(batch_calls)])
        floor = server.window(r, lambda: [f(floor_fn, 1, P, SEGMENT, *window_of(j)) for j in range(batch_calls)])
        got[name] = ("key", batch_calls * BATCH, ours, floor)

    reads("exist_key", master.exist_key, "mcb_floor_exist")
    reads("get_replica_list", master.get_replica_list, "mcb_floor_get")

    # Writes, in a cycle that leaves the free list as it found it: every put takes the front of
    # the free tail, and the removes go in reverse order (floor's keys, allocated last, first),
    # so each one merges its extent back into the tail: the same path for every call of both.
    def cycle(tag: str, count: int, measure: bool) -> None:
        ours_keys = [f"{tag}-ours-{i:06d}" for i in range(count)]
        floor_keys = [f"{tag}-floor-{i:06d}" for i in range(count)]

        def step(name: str, ours_run, floor_run, floor_first: bool = False) -> None:
            if not measure:
                for run in ((floor_run, ours_run) if floor_first else (ours_run, floor_run)):
                    run()
                return
            if floor_first:
                floor = server.window(r, floor_run)
                ours = server.window(r, ours_run)
            else:
                ours = server.window(r, ours_run)
                floor = server.window(r, floor_run)
            got[name] = ("call", count, ours, floor)

        step("put_start", lambda: [master.put_start(CLIENT, k, OBJECT_SIZE) for k in ours_keys],
             lambda: [f("mcb_floor_put_start", 1, P, CLIENT, k, OBJECT_SIZE) for k in floor_keys])
        step("put_end", lambda: _each(lambda k: master.put_end(CLIENT, k), ours_keys),
             lambda: [f("mcb_floor_put_end", 1, P, CLIENT, k) for k in floor_keys])
        step("remove", lambda: _each(master.remove, reversed(ours_keys)),
             lambda: [f("mcb_floor_remove", 1, P, SEGMENT, k) for k in reversed(floor_keys)], floor_first=True)

    cycle("warm", WARMUP, measure=False)
    cycle("new", n, measure=True)

    batch("batch_exist_key", master.batch_exist_key, "mcb_floor_exist")
    batch("batch_get_replica_list", master.batch_get_replica_list, "mcb_floor_get")
    order = ("exist_key", "get_replica_list", "put_start", "put_end", "remove", "batch_exist_key",
             "batch_get_replica_list")
    return {name: got[name] for name in order}


SLACK_MS = 3_600_000  # kv_lease_slack while re-reads are measured: every lease outlasts the run


def _within_slack(server: CallgrindValkey, master: Master, r: redis.Redis, n: int, batch_calls: int, key_at,
                  window_of, operations: dict, out) -> dict:
    """The reads again, each key read a second time within kv_lease_slack (docs/configuration.md, "Reads
    that write nothing"): a pass that renews every lease to now + ttl + SLACK_MS, then the measured
    pass over the same keys, which writes nothing. Beside the renewing reads measured above."""
    reads = {"exist_key": (lambda: [master.exist_key(key_at(j)) for j in range(n)], n),
             "get_replica_list": (lambda: [master.get_replica_list(key_at(j)) for j in range(n)], n),
             "batch_exist_key": (lambda: [master.batch_exist_key(window_of(j)) for j in range(batch_calls)],
                                 batch_calls * BATCH),
             "batch_get_replica_list": (lambda: [master.batch_get_replica_list(window_of(j))
                                                 for j in range(batch_calls)], batch_calls * BATCH)}
    figures: dict[str, dict] = {}
    labels = {name: name + (f" x{BATCH}, per key" if units != n else "") for name, (_, units) in reads.items()}
    width = max(len(x) for x in labels.values()) + 4
    r.hset(KEYS.config, "kv_lease_slack", SLACK_MS)
    try:
        out(f"reads within the lease slack (kv_lease_slack {SLACK_MS:,} ms; each key read a second time: no write)")
        out(f"  {'':<{width}}{'renewing':>10}{'within':>10}{'within/renewing':>17}{'redis.calls':>13}")
        for name, (run, units) in reads.items():
            run()  # renews every lease past the measured pass
            dirty = _changes(r)
            w = server.window(r, run)
            dirty = _changes(r) - dirty
            within, renewing = w.instructions / units, operations[name]["ours_instructions"]
            calls = sum(w.commands.values()) / units
            figures[name] = {"instructions": within, "renewing_instructions": renewing, "ratio": within / renewing,
                             "redis_calls": calls, "writes": dirty}
            out(f"  {labels[name]:<{width}}{_fmt(renewing):>10}{_fmt(within):>10}"
                f"{within / renewing:>17.2f}{calls:>13.2f}")
    finally:
        r.hset(KEYS.config, "kv_lease_slack", 0)
    return figures


def _redis_calls(server: CallgrindValkey, r: redis.Redis, n: int, keys: list[str], noop: float, out) -> dict:
    """first = one call - the no-op; further = two calls - one call; the command = its procedure's
    inclusive instructions in the two-call window, per call; the bridge = further - command."""
    now = int(r.time()[0]) * 1000
    store = len(keys)
    seg_key, tier = KEYS.segment(SEGMENT), KEYS.tier_ordinary
    okeys = [KEYS.object("default", k.encode()) for k in keys]
    members = [f"o:default:{k}" for k in keys]

    def args(cmd: str, j: int) -> tuple:
        lease = now + 20_000 + 2 * j  # scores above every lease so far: each ZADD moves a member to the end
        if cmd == "TIME":
            return (P, "a", "b", "c", "d")
        if cmd == "HGET":
            return (seg_key, "a", "b", "c", "d")
        if cmd in ("HGETALL", "HSET"):
            return (okeys[(j * 7919) % store], lease, lease + 1, "c", "d")
        return (tier, lease, lease + 1, members[(j * 7919) % store], members[(j * 7919 + store // 2) % store])

    figures: dict[str, dict] = {}
    out("one redis.call (instructions; first = 1 call - the no-op, further = 2 calls - 1 call;")
    out("  the command = its procedure, the bridge = the rest of a further call)")
    out(f"  {'':<10}{'first':>10}{'further':>10}{'command':>10}{'bridge':>10}")
    for cmd in TINY:
        one, two = f"mcb_{cmd.lower()}1", f"mcb_{cmd.lower()}2"
        for j in range(WARMUP):
            r.fcall(one, 1, *args(cmd, j))
            r.fcall(two, 1, *args(cmd, j))
        w1 = server.window(r, lambda: [r.fcall(one, 1, *args(cmd, j)) for j in range(n)])
        w2 = server.window(r, lambda: [r.fcall(two, 1, *args(cmd, j)) for j in range(n)])
        first = w1.instructions / n - noop
        further = (w2.instructions - w1.instructions) / n
        body = w2.inclusive(f"{cmd.lower()}Command") / (2 * n)
        figures[cmd] = {"first_instructions": first, "further_instructions": further,
                        "command_instructions": body, "bridge_instructions": further - body}
        out(f"  {cmd:<10}{_fmt(first):>10}{_fmt(further):>10}{_fmt(body):>10}{_fmt(further - body):>10}")
    return figures


def _cli() -> None:
    p = argparse.ArgumentParser(prog="python -m mooncake_redis.bench.instructions",
                                description="Instructions per call, counted by callgrind (docs/bench.md).")
    p.add_argument("--n", type=int, default=400, help="calls per figure (default 400)")
    p.add_argument("--store", type=int, default=STORE, help=f"stored objects the reads go over (default {STORE})")
    p.add_argument("--aof", action="store_true", help="the server appends to an AOF (appendfsync everysec)")
    a = p.parse_args()
    if a.n < 1 or a.store < 2 * BATCH:
        p.error(f"--n must be >= 1 and --store >= {2 * BATCH}")
    try:
        main(n=a.n, store=a.store, aof=a.aof)
    except CallgrindUnavailable as exc:
        sys.exit(f"error: {exc}")


if __name__ == "__main__":
    _cli()
