"""The RPCs of Mooncake's master, each turned into the Master API calls that do the same: one
method per RPC name, taking the decoded arguments and returning the reply value (an `Err` for
the error side of an expected). No rule of the store lives here; this module only translates
ids, configs, descriptors and error numbers.

Three kinds of handler (`kind`): "inline" ones touch no store and answer on the event loop;
the hot path ("steps": reads, puts, removes, pings) is written as steps (mooncake_redis.steps)
over Master's own steps, which the gateway runs on its event loop with every request's Redis
calls pipelined; the rest ("blocking": mounts, remove_all, regex) call Master and run on the
gateway's thread pool."""
from __future__ import annotations

import inspect
import logging
import threading
import time
from functools import partial
from typing import Any, Callable, Sequence

from ..config import ReplicateConfig, SoftPinAction
from ..errors import ErrorCode, MasterError
from ..master import Master
from ..models import Replica, ReplicaListResult
from ..steps import Blocking, Steps
from . import schema
from .codec import Err
from .queries import SegmentQueries, _text, uuid_text
from .store import GatewayStore, SegmentFacts, host_without_port
from .tasks import TaskHandlers

log = logging.getLogger("mooncake_redis.gateway")

PROCESSING, COMPLETE = 2, 3  # Mooncake's ReplicaStatus
OK_STATUS, NEED_REMOUNT = 1, 2  # Mooncake's ClientStatus
SOFT_PIN_ACTIONS = {0: SoftPinAction.PRESERVE, 1: SoftPinAction.ENABLE, 2: SoftPinAction.DISABLE}
MOONCAKE_CODES = range(-1799, 1)  # Mooncake's own error numbers; ours below -10000 have no match there
FACTS_TTL_S = 5.0  # how long a gateway trusts a segment's recorded facts before reading them again
INLINE = frozenset({"ServiceReady", "GetStorageConfig", "GetFsdir"})  # no store involved


def mooncake_code(exc: MasterError) -> int:
    code = int(exc.code)
    if code in MOONCAKE_CODES:
        return code
    log.warning("store error %s has no Mooncake number; answering INTERNAL_ERROR", exc)
    return int(ErrorCode.INTERNAL_ERROR)


def _void(code: ErrorCode) -> Any:
    """An expected<void>: None for OK, else Err(code)."""
    return None if code == ErrorCode.OK else Err(int(code))


class ReadCounts:
    """The GetReplicaList keys served and those answered with a replica, since the last take()
    (the heartbeat adds them to the store's counters: CalcCacheStats)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reads = self.hits = 0

    def add(self, reads: int, hits: int) -> None:
        with self._lock:
            self.reads += reads
            self.hits += hits

    def take(self) -> tuple[int, int]:
        with self._lock:
            taken, self.reads, self.hits = (self.reads, self.hits), 0, 0
        return taken


def segment_host(seg: Any, endpoint: str) -> str | None:
    """The node a segment is on, as Mooncake identifies one: the client's host_id, else the host
    of its transfer endpoint (getHostNameWithoutPort); None when neither names one that the store
    takes (1-256 bytes). Unlike Mooncake, a loopback host (127.0.0.1, localhost) is a node too:
    every client of one machine then shares it."""
    host = _text(seg.host_id) or host_without_port(endpoint)
    return host if 1 <= len(host.encode(errors="surrogateescape")) <= 256 else None


class Handlers(SegmentQueries, TaskHandlers):
    def __init__(self, master: Master):
        self.master = master
        self.reads = ReadCounts()
        self.store = GatewayStore(master)
        self._facts: dict[str, tuple[float, SegmentFacts | None]] = {}
        self._hosts: dict[str, tuple[float, str | None]] = {}  # client -> (when, its node): PutStart's host
        self._kinds = {name: kind for name in schema.RPCS if (kind := self._kind(name))}

    def kind(self, name: str) -> str | None:
        """"inline", "steps" or "blocking" (see the module's doc), or None: not served."""
        return self._kinds.get(name)

    def _kind(self, name: str) -> str | None:
        fn = getattr(self, name, None)
        if not callable(fn):
            return None
        return "inline" if name in INLINE else "steps" if inspect.isgeneratorfunction(fn) else "blocking"

    def call(self, name: str, args: tuple) -> Any:
        """Run the handler of RPC `name` to its reply, blocking (a MasterError becomes
        Err(Mooncake's number)); steps run with Master's own transport."""
        try:
            result = getattr(self, name)(*args)
            return self.master.drive(result) if inspect.isgenerator(result) else result
        except MasterError as exc:
            return Err(mooncake_code(exc))

    # ---- setup and liveness --------------------------------------------------------------
    def ServiceReady(self) -> bytes:
        return schema.SERVICE_VERSION.encode()

    def GetStorageConfig(self) -> Any:
        return schema.GetStorageConfigResponse(fsdir=b"", enable_disk_eviction=True, quota_bytes=0)

    def GetFsdir(self) -> bytes:
        return b""

    def Ping(self, client: Sequence[int]) -> Steps[Any]:
        status = yield from self.master.ping_steps(uuid_text(client))
        return schema.PingResponse(view_version_id=0, client_status=OK_STATUS if status == "OK" else NEED_REMOUNT)

    # ---- segments --------------------------------------------------------------------------
    def _store_name(self, name: str, seg_uuid: str) -> str:
        """The store's name of a segment: Mooncake names segments by host, so a client's second
        segment (allocate_and_mount_segment) shares its first one's name; the store keys
        segments by name, so a segment whose name another UUID holds is kept as
        "<name>#<uuid>" (its descriptors carry its endpoint, never this name)."""
        facts = self.store.segment_facts(name)
        if facts is None or facts.uuid == seg_uuid or self.master.segment_status(name) is None:
            return name  # free, the same segment again, or the name's last holder is gone
        return f"{name}#{seg_uuid}"

    def _mount(self, seg: Any, client_id: str) -> None:
        seg_uuid, given = uuid_text(seg.id), _text(seg.name)
        name = self._store_name(given, seg_uuid)
        endpoint = _text(seg.te_endpoint) or given
        host = segment_host(seg, endpoint)
        self.master.mount_segment(name, seg.size, client_id, base=seg.base, host=host)
        self._hosts[client_id] = (time.monotonic(), host)
        facts = SegmentFacts(name, seg_uuid, client_id, endpoint, _text(seg.protocol) or "tcp", seg.base, seg.size)
        self.store.record_segment(facts)
        self._facts[name] = (time.monotonic(), facts)

    def MountSegment(self, seg: Any, client: Sequence[int]) -> None:
        self._mount(seg, uuid_text(client))

    def ReMountSegment(self, segments: Sequence[Any], client: Sequence[int]) -> None:
        """After NEED_REMOUNT (the store lost the client, or never had it: a reader without a
        segment): mount again what is not mounted (a mount of the same segment is idempotent)."""
        client_id = uuid_text(client)
        self.store.register_client(client_id)
        for seg in segments:
            self._mount(seg, client_id)

    def UnmountSegment(self, segment: Sequence[int], client: Sequence[int]) -> Any:
        name = self.store.segment_name(uuid_text(segment))
        if name is None:
            return Err(int(ErrorCode.SEGMENT_NOT_FOUND))
        # replicas on it hide at once; the worker sweeps them out of the objects
        self.master.unmount_segment(name, uuid_text(client), sweep=False)
        self.store.forget_segment(name)
        self._facts.pop(name, None)
        return None

    def facts_steps(self, names: set[str], fresh: bool = False) -> Steps[dict[str, SegmentFacts | None]]:
        """The recorded facts of these segments: from the cache, the others in one round trip."""
        now = time.monotonic()
        cached = {n: self._facts.get(n) for n in names}
        stale = [n for n, c in cached.items() if fresh or c is None or now - c[0] > FACTS_TTL_S]
        if stale:
            for name, facts in zip(stale, (yield from self.store.segment_facts_steps(stale))):
                cached[name] = self._facts[name] = (now, facts)
        return {n: c[1] for n, c in cached.items() if c is not None}  # none is None now

    # ---- descriptors ---------------------------------------------------------------------
    def descriptors_steps(self, replica_lists: list[list[Replica]], status: int) -> Steps[list[Any]]:
        """Each list of replicas as Mooncake's descriptors; an Err for a list with a replica
        outside its segment (read the facts again once first: remounted elsewhere meanwhile?)."""
        names = {r.segment for reps in replica_lists for r in reps}
        facts = yield from self.facts_steps(names)
        outside = {r.segment for reps in replica_lists for r in reps
                   if (seg_facts := facts[r.segment]) is not None and not seg_facts.holds(r.offset, r.size)}
        if outside:
            facts.update((yield from self.facts_steps(outside, fresh=True)))

        def descriptors(reps: list[Replica]) -> list[Any]:
            return [self._descriptor(i, r, status, facts[r.segment]) for i, r in enumerate(reps)]
        return [self._one(partial(descriptors, reps)) for reps in replica_lists]

    def _descriptor(self, i: int, rep: Replica, status: int, facts: SegmentFacts | None) -> Any:
        if facts is not None and not facts.holds(rep.offset, rep.size):
            # the client would write or read at that address: never hand out one outside its segment
            raise MasterError(ErrorCode.INTERNAL_ERROR, f"replica of segment {rep.segment!r} at {rep.offset} "
                                                        f"lies outside it")
        endpoint, protocol = (facts.endpoint, facts.protocol) if facts else (rep.segment, "tcp")
        buffer = schema.BufferDescriptor(size_=rep.size, buffer_address_=rep.offset, protocol_=protocol.encode(),
                                         transport_endpoint_=endpoint.encode())
        return schema.ReplicaDescriptor(id=i + 1, descriptor_variant=(0, schema.MemoryDescriptor(buffer)),
                                        status=status)

    def replica_lists_steps(self, results: list[Any]) -> Steps[list[Any]]:
        """get_replica_list results (or error codes) as Mooncake's GetReplicaListResponse (or Err)."""
        memory = [[r for r in res.replicas if r.kind == "memory"] if isinstance(res, ReplicaListResult) else []
                  for res in results]
        descriptors = yield from self.descriptors_steps(memory, COMPLETE)
        out: list[Any] = []
        for res, mem, desc in zip(results, memory, descriptors):
            if isinstance(res, ErrorCode):
                out.append(Err(int(res)))
            elif not mem:  # only disk copies: Mooncake's client cannot read our local disks
                out.append(Err(int(ErrorCode.REPLICA_IS_NOT_READY)))
            elif isinstance(desc, Err):
                out.append(desc)
            else:
                c = res.checksum
                checksum = int(c) if c and c.isdigit() and int(c) < 2**64 else None
                out.append(schema.GetReplicaListResponse(replicas=desc, lease_ttl_ms=max(1, res.lease_ttl_ms),
                                                         object_checksum=checksum))
        return out

    def _one(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except MasterError as exc:
            return Err(mooncake_code(exc))

    # ---- reads ---------------------------------------------------------------------------
    def ExistKey(self, key: bytes, tenant: bytes) -> Steps[bool]:
        return (yield from self.master.batch_exist_key_steps([key], _text(tenant)))[0]

    def BatchExistKey(self, keys: Sequence[bytes], tenant: bytes) -> Steps[list]:
        return (yield from self.master.batch_exist_key_steps(list(keys), _text(tenant)))

    def GetReplicaList(self, key: bytes, tenant: bytes) -> Steps[Any]:
        return (yield from self.BatchGetReplicaList([key], tenant))[0]

    def BatchGetReplicaList(self, keys: Sequence[bytes], tenant: bytes) -> Steps[list]:
        results = yield from self.master.batch_get_replica_list_steps(list(keys), _text(tenant))
        out = yield from self.replica_lists_steps(results)
        self.reads.add(len(out), sum(not isinstance(r, Err) for r in out))
        return out

    # ---- writes --------------------------------------------------------------------------
    def client_host_steps(self, client_id: str) -> Steps[str | None]:
        """The node of a client's segments (the first one's), as Mooncake's GetClientHostId:
        remembered from its mounts here, else read from the store (cached like the facts)."""
        now = time.monotonic()
        cached = self._hosts.get(client_id)
        if cached is None or now - cached[0] > FACTS_TTL_S:
            hosts = (yield from self.store.client_hosts_steps([client_id])).get(client_id) or []
            cached = self._hosts[client_id] = (now, hosts[0] if hosts else None)
        return cached[1]

    def _config(self, c: Any, group_id: str | None, host: str | None = None) -> ReplicateConfig:
        if c.nof_replica_num or c.dfs_replica_num:
            raise MasterError(ErrorCode.INVALID_PARAMS, "NoF and DFS replicas are not supported by this master")
        if c.soft_pin_action not in SOFT_PIN_ACTIONS:
            raise MasterError(ErrorCode.INVALID_PARAMS, f"unknown soft_pin_action {c.soft_pin_action}")
        prefs = [_text(s) for s in c.preferred_segments] + ([_text(c.preferred_segment)] if c.preferred_segment else [])
        # prefer_alloc_in_same_node: the writer's host (host_id, else its segments'); data_type is
        # ignored (docs/gateway.md)
        return ReplicateConfig(replica_num=c.replica_num, soft_pin_action=SOFT_PIN_ACTIONS[c.soft_pin_action],
                               soft_pin_ttl_ms=c.soft_pin_ttl_ms, with_hard_pin=bool(c.with_hard_pin),
                               preferred_segments=tuple(dict.fromkeys(prefs)), group_id=group_id,
                               host=host, prefer_same_host=host is not None)

    @staticmethod
    def _groups(c: Any, count: int) -> list[str | None]:
        """Each key's group: group_ids absent or empty: none; one id: every key's; else one per key."""
        ids = [(_text(g) or None) for g in (c.group_ids or [])]
        if not ids:
            return [None] * count
        if len(ids) == 1:
            return ids * count
        if len(ids) != count:
            raise MasterError(ErrorCode.INVALID_PARAMS, "group_ids must name one group, or one per key")
        return ids

    def PutStart(self, client: Sequence[int], key: bytes, size: int, c: Any, tenant: bytes) -> Steps[Any]:
        return (yield from self.BatchPutStart(client, [key], [size], c, tenant))[0]

    def BatchPutStart(self, client: Sequence[int], keys: Sequence[bytes], sizes: Sequence[int], c: Any,
                      tenant: bytes) -> Steps[list]:
        return (yield from self._starts(self.master.batch_put_start_steps, client, keys, sizes, c, tenant))

    def UpsertStart(self, client: Sequence[int], key: bytes, size: int, c: Any, tenant: bytes) -> Steps[Any]:
        return (yield from self.BatchUpsertStart(client, [key], [size], c, tenant))[0]

    def BatchUpsertStart(self, client: Sequence[int], keys: Sequence[bytes], sizes: Sequence[int], c: Any,
                         tenant: bytes) -> Steps[list]:
        """batch_upsert_start: in place (the same descriptors as before) or newly allocated."""
        return (yield from self._starts(self.master.batch_upsert_start_steps, client, keys, sizes, c, tenant))

    def UpsertEnd(self, client: Sequence[int], meta: Any, replica_type: int, tenant: bytes) -> Steps[Any]:
        return (yield from self.BatchPutEnd(client, [meta], replica_type, tenant))[0]

    def BatchUpsertEnd(self, client: Sequence[int], metas: Sequence[Any], tenant: bytes) -> Steps[list]:
        return (yield from self.BatchPutEnd(client, metas, 4, tenant))  # Mooncake: BatchPutEnd(..., ALL)

    def UpsertRevoke(self, client: Sequence[int], key: bytes, replica_type: int, tenant: bytes) -> Steps[Any]:
        return (yield from self.BatchPutRevoke(client, [key], replica_type, tenant))[0]

    def BatchUpsertRevoke(self, client: Sequence[int], keys: Sequence[bytes], tenant: bytes) -> Steps[list]:
        return (yield from self.BatchPutRevoke(client, keys, 4, tenant))

    def _starts(self, start: Callable[..., Steps[list]], client: Sequence[int], keys: Sequence[bytes],
                sizes: Sequence[int], c: Any, tenant: bytes) -> Steps[list]:
        """put_start or upsert_start of each key, split by group, as Mooncake's descriptors."""
        if len(keys) != len(sizes):
            raise MasterError(ErrorCode.INVALID_PARAMS, "keys and sizes differ in length")
        groups = self._groups(c, len(keys))
        host = None
        if c.prefer_alloc_in_same_node:  # a writer whose node is not known gets the normal placement
            host = _text(c.host_id) or (yield from self.client_host_steps(uuid_text(client)))
        results: list[Any] = [None] * len(keys)
        for group in dict.fromkeys(groups):  # one batch per group (a batch call carries one group)
            idx = [i for i, g in enumerate(groups) if g == group]
            started = yield from start(uuid_text(client), [keys[i] for i in idx], [sizes[i] for i in idx],
                                       self._config(c, group, host), _text(tenant))
            for i, r in zip(idx, started):
                results[i] = r
        lists = [r if isinstance(r, list) else [] for r in results]
        descriptors = yield from self.descriptors_steps(lists, PROCESSING)
        return [Err(int(r)) if isinstance(r, ErrorCode) else d for r, d in zip(results, descriptors)]

    def PutEnd(self, client: Sequence[int], meta: Any, replica_type: int, tenant: bytes) -> Steps[Any]:
        return (yield from self.BatchPutEnd(client, [meta], replica_type, tenant))[0]

    def BatchPutEnd(self, client: Sequence[int], metas: Sequence[Any], replica_type: int,
                    tenant: bytes) -> Steps[list]:
        codes: list[Any] = [None] * len(metas)
        with_sum = [i for i, m in enumerate(metas) if m.object_checksum is not None]
        plain = [i for i, m in enumerate(metas) if m.object_checksum is None]
        for idx, sums in ((plain, None), (with_sum, [str(metas[i].object_checksum) for i in with_sum])):
            if idx:
                ended = yield from self.master.writer_steps("mc_put_end", uuid_text(client),
                                                            [metas[i].key for i in idx], _text(tenant), sums)
                for i, code in zip(idx, ended):
                    codes[i] = code
        return [_void(code) for code in codes]

    def PutRevoke(self, client: Sequence[int], key: bytes, replica_type: int, tenant: bytes) -> Steps[Any]:
        return (yield from self.BatchPutRevoke(client, [key], replica_type, tenant))[0]

    def BatchPutRevoke(self, client: Sequence[int], keys: Sequence[bytes], replica_type: int,
                       tenant: bytes) -> Steps[list]:
        codes = yield from self.master.writer_steps("mc_put_revoke", uuid_text(client), list(keys), _text(tenant))
        return [_void(code) for code in codes]

    # ---- removal -------------------------------------------------------------------------
    def Remove(self, key: bytes, force: bool, tenant: bytes) -> Steps[Any]:
        return (yield from self.BatchRemove([key], force, tenant))[0]

    def BatchRemove(self, keys: Sequence[bytes], force: bool, tenant: bytes) -> Steps[list]:
        codes = yield from self.master.batch_remove_steps(list(keys), force, _text(tenant))
        return [_void(code) for code in codes]

    def RemoveAll(self, force: bool, tenant: bytes) -> int:
        try:
            return self.master.remove_all(force, _text(tenant))
        except MasterError as exc:  # a bare i64 reply: Mooncake answers an error as its number
            return mooncake_code(exc)

    def RemoveByRegex(self, regex: bytes, force: bool, tenant: bytes) -> int:
        return self.master.remove_by_regex(_text(regex), force, _text(tenant))

    def GetReplicaListByRegex(self, regex: bytes, tenant: bytes) -> Steps[Any]:
        """The replica lists of the readable objects whose key matches, by key (each a read)."""
        keys = yield Blocking(partial(self.master.keys_matching, _text(regex), _text(tenant)))
        if not keys:
            return {}
        results = yield from self.master.batch_get_replica_list_steps(keys, _text(tenant))
        out = yield from self.replica_lists_steps(results)
        self.reads.add(len(out), sum(not isinstance(r, Err) for r in out))
        return {k: r.replicas for k, r in zip(keys, out) if not isinstance(r, Err)}
