"""Master: the typed client. Every state change is one FCALL of the `mooncake` library
(batches: one FCALL per shard, pipelined); Python keeps no state of its own."""
from __future__ import annotations

import math
import re
import threading
from collections import defaultdict
from typing import Any, Callable, Iterable, Sequence

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .config import NAME_RE, MasterConfig, ReplicateConfig, SoftPinAction
from .errors import ErrorCode, MasterError
from .functions import check_schema, load, run, stored_config
from .keys import segment_slice, shard_key, shard_of
from .models import (EvictionReport, EvictionStep, ObjectInfo, Replica, ReplicaListResult, ReplicaStatus,
                     ShardUsage, Usage)
from .preflight import check_server
from . import wire

# Keys per FCALL, by function: sized so one call stays well under a millisecond of server time
# (a put_start allocates, a read touches a few fields). Larger batches become several calls.
BATCH_CHUNK = 128
CHUNK_OF = {"mc_put_start": 32, "mc_put_revoke": 32, "mc_remove": 32, "mc_sweep_replicas": 32, "mc_put_end": 64}
EVICT_STEP_UNITS = 16  # units per eviction step (about 25-40 us of server time each)
SCAN_COUNT = 1000      # keys per SCAN step in remove_by_regex / remove_all / unmount sweeps
CONNECT_TIMEOUT_S = 5.0  # default: seconds to open a connection
SOCKET_TIMEOUT_S = 10.0  # default: seconds to wait for a reply (a function call takes well under 1 ms)

_memory_servers: dict[str, Any] = {}
_memory_lock = threading.Lock()

Result = Any  # a value, or an ErrorCode


def _redis_from_url(url: str, socket_timeout: float | None = SOCKET_TIMEOUT_S,
                    connect_timeout: float | None = CONNECT_TIMEOUT_S) -> redis.Redis:
    """A client for `url`; memory://<name> is an in-process fakeredis server. Timeouts are
    seconds (None: wait forever); redis-py never resends a command by itself, since a resent
    FCALL could run twice."""
    for value, what in ((socket_timeout, "socket_timeout"), (connect_timeout, "connect_timeout")):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not 0 < value < math.inf):
            raise MasterError(ErrorCode.INVALID_PARAMS, f"{what} must be a positive number of seconds or None")
    if not isinstance(url, str):
        raise MasterError(ErrorCode.INVALID_PARAMS, "url must be a str")
    if url.startswith("memory://"):
        try:
            import fakeredis
        except ImportError:
            raise MasterError(ErrorCode.INVALID_PARAMS, "memory:// URLs need fakeredis: "
                              "pip install 'mooncake-redis[memory]'") from None
        name = url[len("memory://"):] or "default"
        with _memory_lock:
            server = _memory_servers.setdefault(name, fakeredis.FakeServer())
        return fakeredis.FakeRedis(server=server)
    try:
        return redis.Redis.from_url(url, socket_timeout=socket_timeout, socket_connect_timeout=connect_timeout,
                                    retry=Retry(NoBackoff(), 0))
    except ValueError as exc:
        raise MasterError(ErrorCode.INVALID_PARAMS, f"bad Redis URL: {exc}") from None


def _utf8(value: str, what: str) -> bytes:
    try:
        return value.encode()
    except UnicodeEncodeError:  # a lone surrogate: not text, so not sendable as a str
        raise MasterError(ErrorCode.INVALID_PARAMS, f"{what} is not valid Unicode text (pass bytes)") from None


def _as_key(key: Any) -> bytes:
    if isinstance(key, str):
        return _utf8(key, "key")
    if isinstance(key, (bytes, bytearray)):
        return bytes(key)
    raise MasterError(ErrorCode.INVALID_PARAMS, f"key must be str or bytes, not {type(key).__name__}")


def _check_tenant(tenant_id: Any) -> str:
    if not isinstance(tenant_id, str) or not NAME_RE.fullmatch(tenant_id):
        raise MasterError(ErrorCode.INVALID_PARAMS, "tenant_id must match [A-Za-z0-9_.-]{1,64}")
    return tenant_id


def _check_name(value: Any, what: str, max_len: int = 256) -> str:
    if not isinstance(value, str) or not 1 <= len(_utf8(value, what)) <= max_len:
        raise MasterError(ErrorCode.INVALID_PARAMS, f"{what} must be a non-empty string of at most {max_len} bytes")
    return value


def _check_bool(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise MasterError(ErrorCode.INVALID_PARAMS, f"{what} must be a bool, not {type(value).__name__}")
    return value


def _check_int(value: Any, what: str, lo: int, hi: int = 2**53 - 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise MasterError(ErrorCode.INVALID_PARAMS, f"{what} must be an integer in [{lo}, {hi}]")
    return value


def _code(value: Any) -> ErrorCode | None:
    """A per-key reply that is an integer is an error code (0 = OK)."""
    return ErrorCode(value) if isinstance(value, int) else None


class Master:
    def __init__(self, client: redis.Redis, config: MasterConfig):
        self.redis = client
        self.config = config
        self.ns = config.namespace
        self.shards = config.shards
        self._shard_keys = [shard_key(self.ns, i) for i in range(self.shards)]

    # ---- connection -------------------------------------------------------------------
    @classmethod
    def connect(cls, url: str = "memory://", config: MasterConfig | None = None, *,
                socket_timeout: float | None = SOCKET_TIMEOUT_S,
                connect_timeout: float | None = CONNECT_TIMEOUT_S, require_noeviction: bool = True) -> "Master":
        """Connect, load the functions if needed, and make sure the store has a configuration:
        an explicit `config` is written to every shard; with none, the stored one is used
        (or the defaults, on a new store). `socket_timeout` bounds the wait for each reply and
        `connect_timeout` the opening of a connection (seconds; None waits forever); a call
        that gets no reply raises OUTCOME_UNKNOWN.

        On a real server it first checks (mooncake_redis.preflight) that maxmemory-policy is
        noeviction (require_noeviction=False accepts another, for operators who know no store
        key can be evicted) and, with ACLs, that the user may run every command needed on the
        namespace's keys."""
        if config is not None and not isinstance(config, MasterConfig):
            raise MasterError(ErrorCode.INVALID_PARAMS, "config must be a MasterConfig")
        _check_bool(require_noeviction, "require_noeviction")
        client = _redis_from_url(url, socket_timeout, connect_timeout)
        try:
            if not url.startswith("memory://"):
                check_server(client, config.namespace if config else MasterConfig.namespace, require_noeviction)
            return cls._open(client, config)
        except BaseException:
            client.close()
            raise

    @classmethod
    def _open(cls, client: redis.Redis, config: MasterConfig | None) -> "Master":
        namespace = config.namespace if config else MasterConfig.namespace
        stored = run(client, [("HGETALL", f"{shard_key(namespace, 0)}:config")])[0]
        check_schema(namespace, stored)
        current = MasterConfig.from_redis(namespace, stored) if stored else None
        if config is None:
            config = current or MasterConfig()
        elif current and current.shards != config.shards:
            raise MasterError(ErrorCode.INVALID_PARAMS,
                              f"store {namespace!r} has {current.shards} shards, config says {config.shards}")
        load(client)
        master = cls(client, config)
        wanted = {k.encode(): v.encode() for k, v in stored_config(config).items()}
        if any(stored.get(k) != v for k, v in wanted.items()):  # new store, new settings or new fields
            master._write_config()
        return master

    def _write_config(self) -> None:
        fields = [x for kv in stored_config(self.config).items() for x in kv]
        self._run([("HSET", f"{p}:config", *fields) for p in self._shard_keys])

    def close(self) -> None:
        self.redis.close()

    # ---- low-level calls -------------------------------------------------------------
    def _run(self, commands: Sequence[Sequence[Any]], raise_on_error: bool = True) -> list[Any]:
        """Every command goes through functions.run (library reload, errors as MasterError)."""
        return run(self.redis, commands, raise_on_error)

    def _fcall(self, fn: str, shard: int, *args: Any) -> Any:
        return self._run([("FCALL", fn, 1, self._shard_keys[shard], *args)])[0]

    def _each_shard(self, fn: str, *args: Any) -> list[Any]:
        return self._run([("FCALL", fn, 1, p, *args) for p in self._shard_keys])

    def _shard(self, key: bytes) -> int:
        return shard_of(key, self.shards)

    def _batch(self, fn: str, head: Sequence[Any], items: Sequence[Sequence[Any]],
               keys: Sequence[bytes]) -> list[Any]:
        """Run `fn` over items (each one key's ARGV tail) grouped by shard; replies in input order."""
        by_shard: dict[int, list[int]] = defaultdict(list)
        for i, key in enumerate(keys):
            by_shard[self._shard(key)].append(i)
        calls = []
        size = CHUNK_OF.get(fn, BATCH_CHUNK)
        for shard, idx in by_shard.items():
            for start in range(0, len(idx), size):
                chunk = idx[start:start + size]
                argv = [a for i in chunk for a in items[i]]
                calls.append((shard, chunk, argv))
        replies = self._run([("FCALL", fn, 1, self._shard_keys[shard], *head, *argv) for shard, _, argv in calls])
        out: list[Any] = [None] * len(keys)
        for (_, chunk, _), reply in zip(calls, replies):
            for i, value in zip(chunk, reply):
                out[i] = value
        return out

    # ---- segments and clients --------------------------------------------------------
    def mount_segment(self, name: str, size: int, client_id: str, base: int = 0) -> None:
        _check_name(name, "segment name", 1024)
        _check_name(client_id, "client_id")
        _check_int(size, "size", self.shards)
        _check_int(base, "base", 0)
        _check_int(base + size, "base + size", 1)
        slices = [segment_slice(base, size, shard, self.shards) for shard in range(self.shards)]
        self._run([("FCALL", "mc_mount_segment", 1, p,
                    *wire.options(name=name, client_id=client_id, base=lo, size=length))
                   for p, (lo, length) in zip(self._shard_keys, slices)])

    def unmount_segment(self, name: str, client_id: str,
                        progress: Callable[[int], None] | None = None) -> int:
        """Unmount on every shard (replicas hide at once), then sweep the dead replicas out of
        the object hashes in bounded steps. Returns how many objects were left with no replica
        and deleted."""
        _check_name(name, "segment name", 1024)
        _check_name(client_id, "client_id")
        argv = wire.options(name=name, client_id=client_id)
        results = self._run([("FCALL", "mc_unmount_segment", 1, p, *argv) for p in self._shard_keys],
                            raise_on_error=False)
        errors = [r for r in results if isinstance(r, MasterError)]
        if len(errors) == len(results):
            raise errors[0]
        return sum(self.sweep_shard(shard, progress) for shard in range(self.shards))

    def sweep_shard(self, shard: int, on_batch: Callable[[int], Any] | None = None) -> int:
        """Drop replicas on unmounted segments from every object of one shard (SCAN, then
        bounded mc_sweep_replicas calls), then clear the shard's sweep marker unless another
        unmount happened meanwhile. `on_batch(objects scanned)` returning False stops early and
        leaves the marker set, so a worker sweeps again later. Returns objects deleted."""
        token = self._run([("GET", f"{self._shard_keys[shard]}:sweep_pending")])[0] or b""
        deleted = scanned = 0
        for tenant, keys in self._scan_objects(shard, "*"):
            size = CHUNK_OF["mc_sweep_replicas"]
            for start in range(0, len(keys), size):
                deleted += self._fcall("mc_sweep_replicas", shard, *wire.head(wire.KEY, tenant=tenant),
                                       *keys[start:start + size])
            scanned += len(keys)
            if on_batch and on_batch(scanned) is False:
                return deleted
        self._fcall("mc_sweep_done", shard, token)
        return deleted

    def ping(self, client_id: str) -> str:
        """Record liveness; returns "OK", or "NEED_REMOUNT" when some shard does not know the
        client (never mounted, or expired by the client-TTL cleanup)."""
        _check_name(client_id, "client_id")
        known = self._each_shard("mc_ping", *wire.options(client_id=client_id))
        return "OK" if all(known) else "NEED_REMOUNT"

    # ---- puts ------------------------------------------------------------------------
    def _put_head(self, client_id: str, tenant_id: str, config: ReplicateConfig | None) -> list[Any]:
        _check_name(client_id, "client_id")
        _check_tenant(tenant_id)
        c = config or ReplicateConfig()
        if not isinstance(c, ReplicateConfig):
            raise MasterError(ErrorCode.INVALID_PARAMS, "config must be a ReplicateConfig")
        _check_int(c.replica_num, "replica_num", 1, 64)
        try:
            action = SoftPinAction(c.soft_pin_action)
        except ValueError:
            raise MasterError(ErrorCode.INVALID_PARAMS, f"unknown soft_pin_action {c.soft_pin_action!r}") from None
        ttl = None if c.soft_pin_ttl_ms is None else _check_int(c.soft_pin_ttl_ms, "soft_pin_ttl_ms", 0)
        group = None if c.group_id in (None, "") else _check_name(c.group_id, "group_id")  # "": ungrouped
        if not isinstance(c.preferred_segments, (list, tuple)):
            raise MasterError(ErrorCode.INVALID_PARAMS, "preferred_segments must be a list or tuple of names")
        prefs = [_check_name(s, "preferred segment", 1024) for s in c.preferred_segments]
        hard_pin = _check_bool(c.with_hard_pin, "with_hard_pin")
        return wire.head(wire.KEY_SIZE, client_id=client_id, tenant=tenant_id, replica_num=c.replica_num,
                         soft_pin_action=action.value, soft_pin_ttl_ms=ttl, hard_pin=int(hard_pin),
                         group=group, preferred=prefs)

    def _group_shard_ok(self, key: bytes, config: ReplicateConfig | None) -> bool:
        if config is None or config.group_id in (None, "") or self.shards == 1:
            return True
        return self._shard(key) == self._shard(config.group_id.encode())

    def put_start(self, client_id: str, key: Any, size: int, config: ReplicateConfig | None = None,
                  tenant_id: str = "default") -> list[Replica]:
        result = self.batch_put_start(client_id, [key], [size], config, tenant_id)[0]
        if isinstance(result, ErrorCode):
            raise MasterError(result, f"put_start {key!r}")
        return result

    def batch_put_start(self, client_id: str, keys: Sequence[Any], sizes: Sequence[int],
                        config: ReplicateConfig | None = None, tenant_id: str = "default") -> list[Result]:
        if len(keys) != len(sizes):
            raise MasterError(ErrorCode.INVALID_PARAMS, "keys and sizes differ in length")
        head = self._put_head(client_id, tenant_id, config)
        bkeys = [_as_key(k) for k in keys]
        out: list[Result] = [None] * len(bkeys)
        todo = []
        for i, (key, size) in enumerate(zip(bkeys, sizes)):
            if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size < 2**53:
                out[i] = ErrorCode.INVALID_PARAMS
            elif not self._group_shard_ok(key, config):
                out[i] = ErrorCode.INVALID_PARAMS  # group members must share the group's shard
            else:
                todo.append(i)
        replies = self._batch("mc_put_start", head, [(bkeys[i], sizes[i]) for i in todo], [bkeys[i] for i in todo])
        for i, reply in zip(todo, replies):
            code = _code(reply)
            out[i] = code if code is not None else [
                Replica(reply[j].decode(errors="replace"), int(reply[j + 1]), sizes[i], ReplicaStatus.PROCESSING)
                for j in range(0, len(reply), 2)]
        return out

    def _writer_op(self, fn: str, client_id: str, keys: Sequence[Any], tenant_id: str) -> list[ErrorCode]:
        _check_name(client_id, "client_id")
        _check_tenant(tenant_id)
        bkeys = [_as_key(k) for k in keys]
        head = wire.head(wire.KEY, client_id=client_id, tenant=tenant_id)
        return [ErrorCode(r) for r in self._batch(fn, head, [(k,) for k in bkeys], bkeys)]

    def put_end(self, client_id: str, key: Any, tenant_id: str = "default") -> None:
        self._single(self._writer_op("mc_put_end", client_id, [key], tenant_id)[0], "put_end", key)

    def put_revoke(self, client_id: str, key: Any, tenant_id: str = "default") -> None:
        self._single(self._writer_op("mc_put_revoke", client_id, [key], tenant_id)[0], "put_revoke", key)

    def batch_put_end(self, client_id: str, keys: Sequence[Any], tenant_id: str = "default") -> list[ErrorCode]:
        return self._writer_op("mc_put_end", client_id, keys, tenant_id)

    def batch_put_revoke(self, client_id: str, keys: Sequence[Any], tenant_id: str = "default") -> list[ErrorCode]:
        return self._writer_op("mc_put_revoke", client_id, keys, tenant_id)

    @staticmethod
    def _single(code: ErrorCode, op: str, key: Any) -> None:
        if code != ErrorCode.OK:
            raise MasterError(code, f"{op} {key!r}")

    # ---- reads -----------------------------------------------------------------------
    def _read(self, fn: str, keys: Sequence[Any], tenant_id: str) -> list[Any]:
        _check_tenant(tenant_id)
        bkeys = [_as_key(k) for k in keys]
        head = wire.head(wire.KEY, tenant=tenant_id)
        if self.shards == 1 and len(bkeys) <= BATCH_CHUNK:  # the hot path: one round trip, no grouping
            return self._fcall(fn, 0, *head, *bkeys)
        return self._batch(fn, head, [(k,) for k in bkeys], bkeys)

    @staticmethod
    def _replica_list(reply: Any) -> Result:
        code = _code(reply)
        if code is not None:
            return code
        size = int(reply[1])
        return ReplicaListResult(
            [Replica(reply[j].decode(errors="replace"), int(reply[j + 1]), size, ReplicaStatus.COMPLETE)
             for j in range(2, len(reply), 2)], int(reply[0]))

    def get_replica_list(self, key: Any, tenant_id: str = "default") -> ReplicaListResult:
        result = self._replica_list(self._read("mc_get_replica_list", [key], tenant_id)[0])
        if isinstance(result, ErrorCode):
            raise MasterError(result, f"get_replica_list {key!r}")
        return result

    def batch_get_replica_list(self, keys: Sequence[Any], tenant_id: str = "default") -> list[Result]:
        return [self._replica_list(r) for r in self._read("mc_get_replica_list", keys, tenant_id)]

    def exist_key(self, key: Any, tenant_id: str = "default") -> bool:
        return self._read("mc_exist_key", [key], tenant_id)[0] == 1

    def batch_exist_key(self, keys: Sequence[Any], tenant_id: str = "default") -> list[bool]:
        return [r == 1 for r in self._read("mc_exist_key", keys, tenant_id)]

    # ---- removal ---------------------------------------------------------------------
    def _remove(self, keys: Sequence[bytes], force: bool, tenant_id: str) -> list[ErrorCode]:
        head = wire.head(wire.KEY, tenant=tenant_id, force=int(force))
        return [ErrorCode(r) for r in self._batch("mc_remove", head, [(k,) for k in keys], keys)]

    def remove(self, key: Any, force: bool = False, tenant_id: str = "default") -> None:
        _check_tenant(tenant_id)
        _check_bool(force, "force")
        self._single(self._remove([_as_key(key)], force, tenant_id)[0], "remove", key)

    def _scan_objects(self, shard: int, tenant_glob: str) -> Iterable[tuple[str, list[bytes]]]:
        """SCAN one shard's object keys in steps; yields (tenant, [user key]) batches."""
        prefix = f"{self._shard_keys[shard]}:obj:".encode()
        for batch in self._scan(prefix + tenant_glob.encode() + b":*"):
            by_tenant: dict[str, list[bytes]] = defaultdict(list)
            for rkey in batch:
                tenant, _, key = rkey[len(prefix):].partition(b":")
                name = tenant.decode(errors="replace")
                if NAME_RE.fullmatch(name):  # a stray key is not an object of any tenant
                    by_tenant[name].append(key)
            yield from by_tenant.items()

    def _scan(self, match: bytes) -> Iterable[list[bytes]]:
        cursor = 0
        while True:
            cursor, batch = self._run([("SCAN", cursor, "MATCH", match, "COUNT", SCAN_COUNT)])[0]
            if batch:
                yield batch
            if int(cursor) == 0:
                return

    def _remove_matching(self, keep: Callable[[bytes], bool], force: bool, tenant_id: str) -> int:
        _check_tenant(tenant_id)
        _check_bool(force, "force")
        removed = 0
        for shard in range(self.shards):
            for _, keys in self._scan_objects(shard, tenant_id):
                chosen = [k for k in keys if keep(k)]
                if chosen:
                    removed += sum(1 for c in self._remove(chosen, force, tenant_id) if c == ErrorCode.OK)
        return removed

    def remove_by_regex(self, pattern: str | bytes, force: bool = False, tenant_id: str = "default") -> int:
        """Remove the objects whose key matches `pattern` (re.search); skips leased (unless
        force) and in-progress objects. Returns how many were removed."""
        try:
            rx = re.compile(pattern)
        except (re.error, TypeError) as exc:
            raise MasterError(ErrorCode.INVALID_PARAMS, f"bad regex: {exc}") from None
        if isinstance(pattern, str):
            return self._remove_matching(lambda k: rx.search(k.decode("utf-8", "surrogateescape")) is not None,
                                         force, tenant_id)
        return self._remove_matching(lambda k: rx.search(k) is not None, force, tenant_id)

    def remove_all(self, force: bool = False, tenant_id: str = "default") -> int:
        return self._remove_matching(lambda k: True, force, tenant_id)

    # ---- task references ---------------------------------------------------------------
    def _task_ref(self, key: Any, delta: int, tenant_id: str) -> int:
        _check_tenant(tenant_id)
        bkey = _as_key(key)
        reply = self._fcall("mc_task_ref", self._shard(bkey), *wire.head(wire.KEY, tenant=tenant_id, delta=delta), bkey)[0]
        if isinstance(reply, int):
            raise MasterError(ErrorCode(reply), f"task reference {key!r}")
        return int(reply[0])

    def add_task_ref(self, key: Any, tenant_id: str = "default") -> int:
        """A replication/offload task starts using the object: while referenced, the object
        (or its group) is never evicted and remove without force is OBJECT_HAS_REPLICATION_TASK.
        Returns the reference count."""
        return self._task_ref(key, 1, tenant_id)

    def release_task_ref(self, key: Any, tenant_id: str = "default") -> int:
        return self._task_ref(key, -1, tenant_id)

    def task_refs(self, key: Any, tenant_id: str = "default") -> int:
        """The object's current task reference count (OBJECT_NOT_FOUND if there is no object).
        add/release_task_ref change a count, so after an OUTCOME_UNKNOWN read it here and
        reconcile instead of retrying blindly."""
        return int(self.describe(key, tenant_id).fields.get("task_refs", 0))

    # ---- inspection ------------------------------------------------------------------
    def describe(self, key: Any, tenant_id: str = "default") -> ObjectInfo:
        """The object as stored; an inspection, not a read: no lease is granted."""
        _check_tenant(tenant_id)
        bkey = _as_key(key)
        reply = self._fcall("mc_describe", self._shard(bkey), *wire.options(tenant=tenant_id, key=bkey))
        if isinstance(reply, int):
            raise MasterError(ErrorCode(reply), f"describe {key!r}")
        flat, lease, live = reply
        f = {flat[i].decode(errors="replace"): flat[i + 1].decode(errors="replace") for i in range(0, len(flat), 2)}
        size = int(f["size"])
        status = ReplicaStatus(f["status"])
        live_set = {s.decode(errors="replace") for s in live}
        replicas = [Replica(name[4:], int(value.split()[0]), size, status)
                    for name, value in sorted(f.items()) if name.startswith("rep:") and name[4:] in live_set]
        pin = int(f.get("soft_pin_until", 0))  # task_refs shows in .fields while nonzero
        return ObjectInfo(key=bkey, tenant_id=tenant_id, size=size, status=status, writer=f["writer"],
                          put_started_ms=int(f["put_started"]), lease_until_ms=int(lease),
                          soft_pin_until_ms=pin or None, hard_pinned=f.get("hard_pin") == "1",
                          group_id=f.get("group"), replicas=replicas, fields=f)

    def usage(self) -> Usage:
        rows = self._run([("HMGET", p, "used_bytes", "capacity_bytes", "objects") for p in self._shard_keys])
        per = [ShardUsage(i, *(int(v or 0) for v in row)) for i, row in enumerate(rows)]
        return Usage(sum(s.used_bytes for s in per), sum(s.capacity_bytes for s in per),
                     sum(s.objects for s in per), per)

    def segments(self) -> list[dict[str, Any]]:
        """Mounted segments with per-shard slices summed: name, client, size, used."""
        names = self._run([("ZRANGE", f"{p}:segs", 0, -1) for p in self._shard_keys])
        wanted = [(p, name) for p, shard_names in zip(self._shard_keys, names) for name in shard_names]
        rows = self._run([("HGETALL", f"{p}:seg:".encode() + name) for p, name in wanted]) if wanted else []
        merged: dict[str, dict[str, Any]] = {}
        for (_, name), row in zip(wanted, rows):
            if not row:
                continue
            text = name.decode(errors="backslashreplace")  # names and ids are bytes on the wire
            seg = merged.setdefault(text, {"name": text, "client": row[b"client"].decode(errors="backslashreplace"),
                                           "size": 0, "used": 0})
            seg["size"] += int(row[b"size"])
            seg["used"] += int(row[b"used"])
        return list(merged.values())

    # ---- eviction --------------------------------------------------------------------
    def evict_step(self, shard: int, max_units: int = EVICT_STEP_UNITS) -> EvictionStep:
        _check_int(shard, "shard", 0, self.shards - 1)
        _check_int(max_units, "max_units", 1, 1024)
        state, units, objects, nbytes, used, target = self._fcall("mc_evict", shard, max_units)
        return EvictionStep(shard, state.decode(), int(units), int(objects), int(nbytes), int(used), int(target))

    def run_eviction(self, max_units_per_step: int = EVICT_STEP_UNITS) -> EvictionReport:
        """Evict now, in bounded steps, until every shard is at its target (or has nothing
        evictable left)."""
        units = objects = nbytes = steps = 0
        final = []
        for shard in range(self.shards):
            while True:
                step = self.evict_step(shard, max_units_per_step)
                steps += 1
                units, objects, nbytes = units + step.units, objects + step.objects, nbytes + step.bytes
                if step.state != "more":
                    final.append(step)
                    break
        return EvictionReport(units, objects, nbytes, steps, final)

    # ---- the store clock (test hook) -------------------------------------------------
    def now_ms(self) -> int:
        return int(self._fcall("mc_now", 0))

    def freeze_clock(self, now_ms: int) -> None:
        """Make every shard's functions read `now_ms` instead of the server's TIME."""
        _check_int(now_ms, "now_ms", 0)
        self._run([("SET", f"{p}:clock", now_ms) for p in self._shard_keys])

    def advance_clock(self, delta_ms: int) -> int:
        _check_int(delta_ms, "delta_ms", 0)
        if self._run([("GET", f"{self._shard_keys[0]}:clock")])[0] is None:
            raise MasterError(ErrorCode.INVALID_PARAMS, "the clock is not frozen")
        return int(self._run([("INCRBY", f"{p}:clock", delta_ms) for p in self._shard_keys])[0])

    def unfreeze_clock(self) -> None:
        self._run([("DEL", *[f"{p}:clock" for p in self._shard_keys])])
