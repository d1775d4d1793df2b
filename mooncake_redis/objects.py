"""Objects: puts (put_start, put_end, put_revoke and their batches), reads (get_replica_list,
exist_key), removal, task references and describe. Batches are one FCALL per shard and chunk
(Shards.batch); a per-key reply that is an integer is that key's error code."""
from __future__ import annotations

import re
from typing import Any, Callable, Sequence, cast

from . import wire
from .api import ApiBase
from .checks import _as_key, _as_keys, _check_bool, _check_int, _check_name, _check_tenant, _code, _shown_key
from .config import ReplicateConfig, SoftPinAction
from .errors import ErrorCode, MasterError
from .keys import prefix_of
from .layout import stored_replicas, stored_status
from .models import ObjectInfo, Replica, ReplicaListResult, ReplicaStatus
from .steps import Blocking, Steps
from .transport import BATCH_CHUNK

Result = Any  # a value, or an ErrorCode



def _regex_matcher(pattern: str | bytes) -> Callable[[bytes], bool]:
    """re.search of `pattern` over a key (bytes; a str pattern sees the key as text)."""
    try:
        rx = re.compile(pattern)
    except (re.error, TypeError) as exc:
        raise MasterError(ErrorCode.INVALID_PARAMS, f"bad regex: {exc}") from None
    if isinstance(pattern, str):
        text_rx = cast("re.Pattern[str]", rx)  # compiled from a str
        return lambda k: text_rx.search(k.decode("utf-8", "surrogateescape")) is not None
    bytes_rx = cast("re.Pattern[bytes]", rx)
    return lambda k: bytes_rx.search(k) is not None

READ_HEADS = 1024  # read heads remembered (per function and tenant) before the memo starts again


class ObjectsApi(ApiBase):
    # ---- puts ------------------------------------------------------------------------
    def _put_head(self, client_id: str, tenant_id: str, config: ReplicateConfig | None,
                  parents: bool = False) -> list[Any]:
        """The head of a put's call; `parents`: its rows carry parents of their own."""
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
        guarantee = self._guarantee_ttl(c.guaranteed_ttl_ms)
        fallback = _check_bool(c.guarantee_fallback, "guarantee_fallback")
        same_host = _check_bool(c.prefer_same_host, "prefer_same_host")
        host = None if c.host in (None, "") else _check_name(c.host, "host")
        if same_host and host is None:
            raise MasterError(ErrorCode.INVALID_PARAMS, "prefer_same_host needs the writer's host")
        fields = wire.KEY_SIZE_PREFIX if guarantee else wire.KEY_SIZE
        if self._radix_put(c):
            named = parents or c.parent_block_hash is not None
            fields = (*fields, "node") + (("parent", "parent_shard") if named else ())
        # (options at the functions' defaults are left out, as the default tenant is: fewer
        # strings for the server to make and a shorter head to look up, every call)
        return wire.head(fields, client_id=client_id,
                         tenant=tenant_id, replica_num=c.replica_num if c.replica_num != 1 else None,
                         soft_pin_action=action.value if action is not SoftPinAction.PRESERVE else None,
                         soft_pin_ttl_ms=ttl, hard_pin=1 if hard_pin else None, group=group, preferred=prefs,
                         guaranteed_ttl_ms=guarantee or None, guarantee_fallback=int(fallback) if guarantee else None,
                         host=host if same_host else None, prefer_same_host=1 if same_host else None)

    def _radix_put(self, c: ReplicateConfig) -> bool:
        """Do this put's keys register in the radix index? (Index on; a grouped key too: its node
        is its unit, and it is an indexed member of its group.)"""
        return self.config.enable_radix_tree

    def _put_rows(self, keys: list[bytes], sizes: Sequence[int], c: ReplicateConfig, guaranteed: bool,
                  parents: Sequence[bytes | None] | None = None) -> list[tuple]:
        """Each key's row: key, size [, prefix hash (guaranteed puts)] [, radix node [, parent,
        parent's shard]] (the fields of _put_head). `parents`: each key's own parent (None: a
        root), else the config's for all."""
        rows = [(k, s, prefix_of(k, self.key_pattern)) if guaranteed else (k, s) for k, s in zip(keys, sizes)]
        if not self._radix_put(c):
            return rows
        if parents is None:
            if c.parent_block_hash is None:
                return [(*row, self.radix_prefix(k)) for row, k in zip(rows, keys)]
            parents = [_as_key(c.parent_block_hash)] * len(keys)
        shards: dict[bytes, int] = {}
        for parent in parents:
            if parent is not None and parent not in shards:
                shards[parent] = self.node_shard(parent)
        return [(*row, self.radix_prefix(k), b"", b"") if p is None else (*row, self.radix_prefix(k), p, shards[p])
                for row, k, p in zip(rows, keys, parents)]

    @staticmethod
    def _check_parents(parents: Sequence[Any] | None, n: int,
                       config: ReplicateConfig | None) -> list[bytes | None] | None:
        """batch_put_start's per-key parents, checked: one per key, each None or 1-256 bytes,
        and not beside the config's parent_block_hash."""
        if parents is None:
            return None
        if config is not None and config.parent_block_hash is not None:
            raise MasterError(ErrorCode.INVALID_PARAMS, "give parents or config.parent_block_hash, not both")
        if isinstance(parents, (str, bytes)) or len(parents) != n:
            raise MasterError(ErrorCode.INVALID_PARAMS, "parents must be a list of one parent hash (or None) per key")
        out = [None if p is None else _as_key(p) for p in parents]
        if any(p is not None and not 1 <= len(p) <= 256 for p in out):
            raise MasterError(ErrorCode.INVALID_PARAMS, "a parent hash must be 1-256 bytes")
        return out

    def _guarantee_ttl(self, ttl: int) -> int:
        return _check_int(ttl, "guaranteed_ttl_ms", 0, self.config.max_guaranteed_ttl)

    def _group_shard_ok(self, key: bytes, config: ReplicateConfig | None) -> bool:
        if config is None or config.group_id in (None, "") or self.shards == 1:
            return True
        return self.transport.shard_of(key) == self.transport.group_shard(config.group_id.encode())

    def put_start(self, client_id: str, key: Any, size: int, config: ReplicateConfig | None = None,
                  tenant_id: str = "default") -> list[Replica]:
        bkey = _as_key(key)
        self._put_head(client_id, tenant_id, config)  # the options' checks come first
        where = f"put_start {_shown_key(bkey)}"
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size < 2**53:
            raise MasterError(ErrorCode.INVALID_PARAMS,
                              f"{where}: size must be an integer in [1, 2^53 - 1], not {size!r}")
        if not 1 <= len(bkey) <= self.config.max_key_length:
            raise MasterError(ErrorCode.INVALID_PARAMS, f"{where}: the key is {len(bkey):,} bytes; keys are 1 to "
                              f"max_key_length ({self.config.max_key_length:,}) bytes")
        if config is not None and not self._group_shard_ok(bkey, config):
            raise MasterError(ErrorCode.INVALID_PARAMS, f"{where}: the key routes to another shard than group "
                              f"{config.group_id!r} (on a store of several shards a member's key carries the "
                              "group id as its hash tag: {<group id>}...)")
        result = self.batch_put_start(client_id, [bkey], [size], config, tenant_id)[0]
        if isinstance(result, ErrorCode):
            raise MasterError(result, where)
        return result

    def batch_put_start(self, client_id: str, keys: Sequence[Any], sizes: Sequence[int],
                        config: ReplicateConfig | None = None, tenant_id: str = "default",
                        parents: Sequence[Any] | None = None) -> list[Result]:
        """Start the puts of `keys`; with the radix index on, `parents` gives each key's own
        parent hash (None: a root node), e.g. a chain of pages in one call, in place of
        config.parent_block_hash for all."""
        return self.drive(self.batch_put_start_steps(client_id, keys, sizes, config, tenant_id, parents))

    def batch_put_start_steps(self, client_id: str, keys: Sequence[Any], sizes: Sequence[int],
                              config: ReplicateConfig | None = None, tenant_id: str = "default",
                              parents: Sequence[Any] | None = None) -> Steps[list[Result]]:
        if len(keys) != len(sizes):
            raise MasterError(ErrorCode.INVALID_PARAMS, "keys and sizes differ in length")
        c = config or ReplicateConfig()
        own = self._check_parents(parents, len(keys), config)
        linked = self._radix_put(c) and (own is not None or c.parent_block_hash is not None)
        if linked and own is None:
            self._check_parents([c.parent_block_hash], 1, None)
        head = self._put_head(client_id, tenant_id, config, parents=own is not None)
        bkeys = _as_keys(keys)
        out: list[Result] = [None] * len(bkeys)
        todo = []
        for i, (key, size) in enumerate(zip(bkeys, sizes)):
            if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size < 2**53:
                out[i] = ErrorCode.INVALID_PARAMS
            elif not self._group_shard_ok(key, config):
                out[i] = ErrorCode.INVALID_PARAMS  # group members must share the group's shard
            else:
                todo.append(i)
        guaranteed = config is not None and config.guaranteed_ttl_ms > 0  # rows carry the prefix hash
        rows = self._put_rows([bkeys[i] for i in todo], [sizes[i] for i in todo], c,
                              guaranteed, None if own is None else [own[i] for i in todo])
        replies = yield from self.transport.batch_steps("mc_put_start", head, rows, [bkeys[i] for i in todo])
        if rows and linked:  # links to a parent on another shard: deliver them now
            shards = {self.transport.shard_of(bkeys[i]) for i, row in zip(todo, rows)
                      if row[-1] != b"" and self.transport.shard_of(bkeys[i]) != row[-1]}
            if shards:
                yield Blocking(lambda: self.drain_radix_outbox(shards))
        for i, reply in zip(todo, replies):
            code = _code(reply)
            out[i] = code if code is not None else [
                Replica(reply[j].decode(errors="replace"), int(reply[j + 1]), sizes[i], ReplicaStatus.PROCESSING)
                for j in range(0, len(reply), 2)]
        return out

    def _writer_op(self, fn: str, client_id: str, keys: Sequence[Any], tenant_id: str,
                   checksums: Sequence[str] | None = None) -> list[ErrorCode]:
        return self.drive(self.writer_steps(fn, client_id, keys, tenant_id, checksums))

    def writer_steps(self, fn: str, client_id: str, keys: Sequence[Any], tenant_id: str,
                     checksums: Sequence[str] | None = None) -> Steps[list[ErrorCode]]:
        """mc_put_end or mc_put_revoke of each key, as steps: each key's code."""
        _check_name(client_id, "client_id")
        _check_tenant(tenant_id)
        bkeys = _as_keys(keys)
        if checksums is None:
            head = wire.head(wire.KEY, client_id=client_id, tenant=tenant_id)
            replies = yield from self.transport.batch_steps(fn, head, [(k,) for k in bkeys], bkeys)
            return [ErrorCode(r) for r in replies]
        if len(checksums) != len(bkeys):
            raise MasterError(ErrorCode.INVALID_PARAMS, "keys and checksums differ in length")
        for c in checksums:
            _check_name(c, "checksum", 128)
        head = wire.head(("key", "checksum"), client_id=client_id, tenant=tenant_id)
        replies = yield from self.transport.batch_steps(fn, head, list(zip(bkeys, checksums)), bkeys)
        return [ErrorCode(r) for r in replies]

    def put_end(self, client_id: str, key: Any, tenant_id: str = "default", checksum: str | None = None) -> None:
        """End the put; `checksum` (1-128 bytes, e.g. the data plane's blake3 hex digest) is
        stored with the object and returned by get_replica_list."""
        checksums = None if checksum is None else [checksum]
        self._single(self._writer_op("mc_put_end", client_id, [key], tenant_id, checksums)[0], "put_end", key)

    def put_revoke(self, client_id: str, key: Any, tenant_id: str = "default") -> None:
        self._single(self._writer_op("mc_put_revoke", client_id, [key], tenant_id)[0], "put_revoke", key)

    def batch_put_end(self, client_id: str, keys: Sequence[Any], tenant_id: str = "default",
                      checksums: Sequence[str] | None = None) -> list[ErrorCode]:
        """put_end of each key; `checksums[i]` (optional) is stored with keys[i]."""
        return self._writer_op("mc_put_end", client_id, keys, tenant_id, checksums)

    def batch_put_revoke(self, client_id: str, keys: Sequence[Any], tenant_id: str = "default") -> list[ErrorCode]:
        return self._writer_op("mc_put_revoke", client_id, keys, tenant_id)

    @staticmethod
    def _single(code: ErrorCode, op: str, key: Any) -> None:
        if code != ErrorCode.OK:
            raise MasterError(code, f"{op} {key!r}")

    # ---- reads -----------------------------------------------------------------------
    def _read(self, fn: str, keys: Sequence[Any], tenant_id: str, guaranteed_ttl_ms: int = 0) -> list[Any]:
        return self.drive(self._read_steps(fn, keys, tenant_id, guaranteed_ttl_ms))

    def _read_head(self, fn: str, tenant_id: str, guaranteed_ttl_ms: int) -> list[Any]:
        """The ARGV head of a read; the common one (no guarantee TTL) is built and checked once
        per function and tenant."""
        if not guaranteed_ttl_ms and type(tenant_id) is str:
            head = self.read_heads.get((fn, tenant_id))
            if head is not None:
                return head
        _check_tenant(tenant_id)
        with_disk = 1 if fn == "mc_get_replica_list" else None  # replies carry disk replicas and the checksum
        head = wire.head(wire.KEY, tenant=tenant_id, guaranteed_ttl_ms=self._guarantee_ttl(guaranteed_ttl_ms) or None,
                         with_disk=with_disk)
        if not guaranteed_ttl_ms:
            if len(self.read_heads) >= READ_HEADS:
                self.read_heads.clear()
            self.read_heads[(fn, tenant_id)] = head
        return head

    def _read_steps(self, fn: str, keys: Sequence[Any], tenant_id: str, guaranteed_ttl_ms: int = 0) -> Steps[list[Any]]:
        head = self._read_head(fn, tenant_id, guaranteed_ttl_ms)
        bkeys = _as_keys(keys)
        if self.shards == 1 and len(bkeys) <= BATCH_CHUNK:  # the hot path: one round trip, no grouping
            return (yield [self.transport.command(fn, 0, *head, *bkeys)])[0]
        return (yield from self.transport.batch_steps(fn, head, [(k,) for k in bkeys], bkeys))

    @staticmethod
    def _replica_list(reply: Any) -> Result:
        code = _code(reply)
        if code is not None:
            return code
        size, checksum, memory = int(reply[1]), reply[2].decode() or None, 4 + 2 * int(reply[3])
        replicas = [Replica(reply[j].decode(errors="replace"), int(reply[j + 1]), size, ReplicaStatus.COMPLETE)
                    for j in range(4, memory, 2)]
        replicas += [Replica("", 0, size, ReplicaStatus.COMPLETE, kind="disk", client=reply[j].decode(errors="replace"),
                             location=reply[j + 1].decode(errors="replace")) for j in range(memory, len(reply), 2)]
        return ReplicaListResult(replicas, int(reply[0]), checksum)

    def get_replica_list(self, key: Any, tenant_id: str = "default", guaranteed_ttl_ms: int = 0) -> ReplicaListResult:
        """The object's live replicas; leases it. With guaranteed_ttl_ms, an active guarantee is
        renewed to max(guaranteed_until, now + guaranteed_ttl_ms) (renew-only: an object without
        an active guarantee is unchanged)."""
        result = self._replica_list(self._read("mc_get_replica_list", [key], tenant_id, guaranteed_ttl_ms)[0])
        if isinstance(result, ErrorCode):
            raise MasterError(result, f"get_replica_list {key!r}")
        return result

    def batch_get_replica_list(self, keys: Sequence[Any], tenant_id: str = "default",
                               guaranteed_ttl_ms: int = 0) -> list[Result]:
        return self.drive(self.batch_get_replica_list_steps(keys, tenant_id, guaranteed_ttl_ms))

    def batch_get_replica_list_steps(self, keys: Sequence[Any], tenant_id: str = "default",
                                     guaranteed_ttl_ms: int = 0) -> Steps[list[Result]]:
        replies = yield from self._read_steps("mc_get_replica_list", keys, tenant_id, guaranteed_ttl_ms)
        return [self._replica_list(r) for r in replies]

    def exist_key(self, key: Any, tenant_id: str = "default") -> bool:
        return self._read("mc_exist_key", [key], tenant_id)[0] == 1

    def batch_exist_key(self, keys: Sequence[Any], tenant_id: str = "default") -> list[bool]:
        return self.drive(self.batch_exist_key_steps(keys, tenant_id))

    def batch_exist_key_steps(self, keys: Sequence[Any], tenant_id: str = "default") -> Steps[list[bool]]:
        return [r == 1 for r in (yield from self._read_steps("mc_exist_key", keys, tenant_id))]

    # ---- removal ---------------------------------------------------------------------
    def _remove(self, keys: Sequence[bytes], force: bool, tenant_id: str) -> list[ErrorCode]:
        return self.drive(self._remove_steps(keys, force, tenant_id))

    def _remove_steps(self, keys: Sequence[bytes], force: bool, tenant_id: str) -> Steps[list[ErrorCode]]:
        head = wire.head(wire.KEY, tenant=tenant_id, force=1 if force else None)  # (0: the default, left out)
        replies = yield from self.transport.batch_steps("mc_remove", head, [(k,) for k in keys], keys)
        return [ErrorCode(r) for r in replies]

    def remove(self, key: Any, force: bool = False, tenant_id: str = "default") -> None:
        _check_tenant(tenant_id)
        _check_bool(force, "force")
        self._single(self._remove([_as_key(key)], force, tenant_id)[0], "remove", key)

    def batch_remove(self, keys: Sequence[Any], force: bool = False, tenant_id: str = "default") -> list[ErrorCode]:
        """remove of each key; per key its code (OK, OBJECT_NOT_FOUND, OBJECT_HAS_LEASE, ...)."""
        return self.drive(self.batch_remove_steps(keys, force, tenant_id))

    def batch_remove_steps(self, keys: Sequence[Any], force: bool = False,
                           tenant_id: str = "default") -> Steps[list[ErrorCode]]:
        _check_tenant(tenant_id)
        _check_bool(force, "force")
        return (yield from self._remove_steps(_as_keys(keys), force, tenant_id))

    def _remove_matching(self, keep: Callable[[bytes], bool], force: bool, tenant_id: str) -> int:
        _check_tenant(tenant_id)
        _check_bool(force, "force")
        removed = 0
        for shard in range(self.shards):
            for _, keys in self.transport.scan_objects(shard, tenant_id):
                chosen = [k for k in keys if keep(k)]
                if chosen:
                    removed += sum(1 for c in self._remove(chosen, force, tenant_id) if c == ErrorCode.OK)
        return removed

    def remove_by_regex(self, pattern: str | bytes, force: bool = False, tenant_id: str = "default") -> int:
        """Remove the objects whose key matches `pattern` (re.search); skips leased (unless
        force) and in-progress objects. Returns how many were removed."""
        return self._remove_matching(_regex_matcher(pattern), force, tenant_id)

    def keys_matching(self, pattern: str | bytes, tenant_id: str = "default") -> list[bytes]:
        """The keys of the tenant's objects (complete or not) that match `pattern` (re.search),
        shard by shard: a scan of every object key, as remove_by_regex makes."""
        _check_tenant(tenant_id)
        match = _regex_matcher(pattern)
        return [k for shard in range(self.shards) for _, keys in self.transport.scan_objects(shard, tenant_id)
                for k in keys if match(k)]

    def get_replica_list_by_regex(self, pattern: str | bytes, tenant_id: str = "default") -> dict[bytes, Any]:
        """Mooncake's GetReplicaListByRegex: the replica lists of the readable objects whose key
        matches `pattern`, by key; each is a read (it leases its object as get_replica_list does)."""
        keys = self.keys_matching(pattern, tenant_id)
        results = self.batch_get_replica_list(keys, tenant_id) if keys else []
        return {k: r for k, r in zip(keys, results) if not isinstance(r, ErrorCode)}

    def remove_all(self, force: bool = False, tenant_id: str = "default") -> int:
        return self._remove_matching(lambda k: True, force, tenant_id)

    # ---- guarantees ------------------------------------------------------------------
    def expire_guaranteed(self, prefix_hashes: Sequence[Any], tenant_id: str = "default") -> list[int]:
        """End at once the guarantee of every object of the tenant whose key has one of these
        prefix hashes (keys.prefix_of; a key without a prefix hash is its own prefix). Returns,
        per prefix hash, how many objects had an active guarantee that ended. Cost: O(objects of
        the prefix) on each shard, never a scan."""
        _check_tenant(tenant_id)
        prefixes = _as_keys(prefix_hashes, "prefix_hashes")
        for p in prefixes:
            if not 1 <= len(p) <= 256:
                raise MasterError(ErrorCode.INVALID_PARAMS, "a prefix hash must be 1-256 bytes")
        head = wire.head(wire.PREFIX, tenant=tenant_id)
        ended = [0] * len(prefixes)
        for shard in range(self.shards):  # grouped keys ({tag}) may sit away from their prefix's shard
            todo = list(range(len(prefixes)))
            while todo:
                left = []
                for start in range(0, len(todo), BATCH_CHUNK):
                    chunk = todo[start:start + BATCH_CHUNK]
                    replies = self.transport.call("mc_expire_guaranteed", shard, *head, *(prefixes[i] for i in chunk))
                    for i, (n, remaining) in zip(chunk, replies):
                        ended[i] += int(n)
                        if int(remaining) > 0:
                            left.append(i)
                todo = left
        return ended

    def guarantee_cached(self, keys: Sequence[Any], ttl_ms: int, tenant_id: str = "default") -> list[int | ErrorCode]:
        """Guarantee objects already in the store until now + ttl_ms (store clock), as a
        guaranteed put would have: the pages of a marked request first cached without a
        guarantee (reads only renew an active one). Per key, in input order: the deadline in
        effect after the call (absolute ms; an active guarantee is extended to the later one), or
        OBJECT_NOT_FOUND (no such object, being evicted, no live memory replica),
        REPLICA_IS_NOT_READY (its put is in progress), GUARANTEED_CAPACITY_EXCEEDED (the same
        limit as put_start's: nothing written for that key). A bad ttl_ms raises
        MasterError(INVALID_PARAMS)."""
        _check_tenant(tenant_id)
        _check_int(ttl_ms, "ttl_ms", 1, self.config.max_guaranteed_ttl)
        bkeys = _as_keys(keys)
        out: list[int | ErrorCode] = [ErrorCode.INVALID_PARAMS] * len(bkeys)
        todo, rows = [], []
        for i, k in enumerate(bkeys):
            p = prefix_of(k, self.key_pattern)
            if 1 <= len(k) <= self.config.max_key_length and len(p) <= 256:
                todo.append(i)
                rows.append((k, p))
        head = wire.head(("key", "prefix"), tenant=tenant_id, ttl_ms=ttl_ms)
        replies = self.transport.batch("mc_guarantee_cached", head, rows, [bkeys[i] for i in todo])
        for i, reply in zip(todo, replies):
            out[i] = ErrorCode(reply) if reply < 0 else int(reply)
        return out

    # ---- task references ---------------------------------------------------------------
    def _task_ref(self, key: Any, delta: int, tenant_id: str) -> int:
        _check_tenant(tenant_id)
        bkey = _as_key(key)
        head = wire.head(wire.KEY, tenant=tenant_id, delta=delta)
        reply = self.transport.call("mc_task_ref", self.transport.shard_of(bkey), *head, bkey)[0]
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
        argv = wire.options(tenant=tenant_id, key=bkey)
        reply = self.transport.call("mc_describe", self.transport.shard_of(bkey), *argv)
        if isinstance(reply, int):
            raise MasterError(ErrorCode(reply), f"describe {key!r}")
        flat, lease, live, now, started = reply
        raw = {flat[i]: flat[i + 1] for i in range(0, len(flat), 2)}
        f = {k.decode(errors="replace"): v.decode(errors="replace") for k, v in raw.items()}
        size = int(f["size"])
        status = ReplicaStatus(stored_status(raw).decode())
        live_set, stored = set(live), stored_replicas(raw) or []
        replicas = [Replica(r.segment.decode(errors="replace"), r.offset, size, status)
                    for r in stored if r.segment in live_set]
        dead = [Replica(r.segment.decode(errors="replace"), r.offset, size, status)
                for r in stored if r.segment not in live_set]
        pin = int(f.get("soft_pin_until", 0))  # task_refs shows in .fields while nonzero
        guaranteed = int(f.get("guaranteed_until", 0))
        return ObjectInfo(guaranteed_until_ms=guaranteed if guaranteed > int(now) else None, key=bkey,
                          tenant_id=tenant_id, size=size, status=status, writer=f["writer"],
                          put_started_ms=int(started) if started else None,
                          lease_until_ms=int(lease),
                          soft_pin_until_ms=pin or None, hard_pinned=f.get("hard_pin") == "1",
                          group_id=f.get("group", f.get("ugroup")), replicas=replicas, fields=f, dead_replicas=dead)
