"""The RPCs of Mooncake's master, each turned into the Master API calls that do the same: one
method per RPC name, taking the decoded arguments and returning the reply value (an `Err` for
the error side of an expected). No rule of the store lives here; this module only translates
ids, configs, descriptors and error numbers. Handlers are synchronous (they call Master) and
run on the gateway's thread pool, never in its event loop."""
from __future__ import annotations

import logging
import time
import uuid as uuidlib
from typing import Any, Callable, Sequence

from ..config import ReplicateConfig, SoftPinAction
from ..errors import ErrorCode, MasterError
from ..master import Master
from ..models import Replica, ReplicaListResult
from . import schema
from .codec import Err
from .store import GatewayStore, SegmentFacts

log = logging.getLogger("mooncake_redis.gateway")

PROCESSING, COMPLETE = 2, 3  # Mooncake's ReplicaStatus
OK_STATUS, NEED_REMOUNT = 1, 2  # Mooncake's ClientStatus
SOFT_PIN_ACTIONS = {0: SoftPinAction.PRESERVE, 1: SoftPinAction.ENABLE, 2: SoftPinAction.DISABLE}
MOONCAKE_CODES = range(-1799, 1)  # Mooncake's own error numbers; ours below -10000 have no match there
FACTS_TTL_S = 5.0  # how long a gateway trusts a segment's recorded facts before reading them again


def uuid_text(pair: Sequence[int]) -> str:
    """A Mooncake UUID (hi, lo) as the client or segment id the store keeps."""
    return str(uuidlib.UUID(int=(pair[0] << 64) | pair[1]))


def uuid_pair(text: str) -> tuple[int, int]:
    """The inverse of uuid_text, or (0, 0) for an id that is not one (a client of the Python API)."""
    try:
        n = uuidlib.UUID(text).int
    except ValueError:
        return (0, 0)
    return (n >> 64, n & (2**64 - 1))


def mooncake_code(exc: MasterError) -> int:
    code = int(exc.code)
    if code in MOONCAKE_CODES:
        return code
    log.warning("store error %s has no Mooncake number; answering INTERNAL_ERROR", exc)
    return int(ErrorCode.INTERNAL_ERROR)


def _text(b: bytes) -> str:
    return b.decode("utf-8", "surrogateescape")


class Handlers:
    def __init__(self, master: Master):
        self.master = master
        self.store = GatewayStore(master)
        self._facts: dict[str, tuple[float, SegmentFacts | None]] = {}

    def call(self, name: str, args: tuple) -> Any:
        """Run the handler of RPC `name`; a MasterError becomes Err(Mooncake's number)."""
        try:
            return getattr(self, name)(*args)
        except MasterError as exc:
            return Err(mooncake_code(exc))

    def serves(self, name: str) -> bool:
        return name in schema.RPCS and callable(getattr(self, name, None))

    # ---- setup and liveness --------------------------------------------------------------
    def ServiceReady(self) -> bytes:
        return schema.SERVICE_VERSION.encode()

    def GetStorageConfig(self) -> Any:
        return schema.GetStorageConfigResponse(fsdir=b"", enable_disk_eviction=True, quota_bytes=0)

    def GetFsdir(self) -> bytes:
        return b""

    def Ping(self, client: Sequence[int]) -> Any:
        status = self.master.ping(uuid_text(client))
        return schema.PingResponse(view_version_id=0, client_status=OK_STATUS if status == "OK" else NEED_REMOUNT)

    def FetchTasks(self, client: Sequence[int], batch_size: int) -> list:
        return []  # the store has no Mooncake task queue (copy, move): nothing to hand out

    # ---- segments --------------------------------------------------------------------------
    def _mount(self, seg: Any, client_id: str) -> None:
        name = _text(seg.name)
        self.master.mount_segment(name, seg.size, client_id, base=seg.base)
        facts = SegmentFacts(name, uuid_text(seg.id), client_id, _text(seg.te_endpoint) or name,
                             _text(seg.protocol) or "tcp", seg.base, seg.size)
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

    def facts(self, name: str, fresh: bool = False) -> SegmentFacts | None:
        now = time.monotonic()
        cached = self._facts.get(name)
        if fresh or cached is None or now - cached[0] > FACTS_TTL_S:
            cached = (now, self.store.segment_facts(name))
            self._facts[name] = cached
        return cached[1]

    # ---- descriptors ---------------------------------------------------------------------
    def _descriptor(self, i: int, rep: Replica, status: int) -> Any:
        facts = self.facts(rep.segment)
        if facts is not None and not facts.holds(rep.offset, rep.size):
            facts = self.facts(rep.segment, fresh=True)  # remounted at another address meanwhile?
        if facts is not None and not facts.holds(rep.offset, rep.size):
            # the client would write or read at that address: never hand out one outside its segment
            raise MasterError(ErrorCode.INTERNAL_ERROR, f"replica of segment {rep.segment!r} at {rep.offset} "
                                                        f"lies outside it")
        endpoint, protocol = (facts.endpoint, facts.protocol) if facts else (rep.segment, "tcp")
        buffer = schema.BufferDescriptor(size_=rep.size, buffer_address_=rep.offset, protocol_=protocol.encode(),
                                         transport_endpoint_=endpoint.encode())
        return schema.ReplicaDescriptor(id=i + 1, descriptor_variant=(0, schema.MemoryDescriptor(buffer)),
                                        status=status)

    def _replica_list(self, res: ReplicaListResult) -> Any:
        memory = [r for r in res.replicas if r.kind == "memory"]
        if not memory:  # only disk copies: Mooncake's client cannot read our local disks
            return Err(int(ErrorCode.REPLICA_IS_NOT_READY))
        checksum = int(res.checksum) if res.checksum and res.checksum.isdigit() and int(res.checksum) < 2**64 else None
        return schema.GetReplicaListResponse(replicas=[self._descriptor(i, r, COMPLETE) for i, r in enumerate(memory)],
                                             lease_ttl_ms=max(1, res.lease_ttl_ms), object_checksum=checksum)

    def _one(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except MasterError as exc:
            return Err(mooncake_code(exc))

    # ---- reads ---------------------------------------------------------------------------
    def ExistKey(self, key: bytes, tenant: bytes) -> bool:
        return self.master.exist_key(key, _text(tenant))

    def BatchExistKey(self, keys: Sequence[bytes], tenant: bytes) -> list:
        return self.master.batch_exist_key(list(keys), _text(tenant))

    def GetReplicaList(self, key: bytes, tenant: bytes) -> Any:
        return self._replica_list(self.master.get_replica_list(key, _text(tenant)))

    def BatchGetReplicaList(self, keys: Sequence[bytes], tenant: bytes) -> list:
        results = self.master.batch_get_replica_list(list(keys), _text(tenant))
        return [Err(int(r)) if isinstance(r, ErrorCode) else self._one(lambda r=r: self._replica_list(r))
                for r in results]

    # ---- writes --------------------------------------------------------------------------
    def _config(self, c: Any, group_id: str | None) -> ReplicateConfig:
        if c.nof_replica_num or c.dfs_replica_num:
            raise MasterError(ErrorCode.INVALID_PARAMS, "NoF and DFS replicas are not supported by this master")
        if c.soft_pin_action not in SOFT_PIN_ACTIONS:
            raise MasterError(ErrorCode.INVALID_PARAMS, f"unknown soft_pin_action {c.soft_pin_action}")
        prefs = [_text(s) for s in c.preferred_segments] + ([_text(c.preferred_segment)] if c.preferred_segment else [])
        # host_id, prefer_alloc_in_same_node and data_type are ignored (docs/gateway.md)
        return ReplicateConfig(replica_num=c.replica_num, soft_pin_action=SOFT_PIN_ACTIONS[c.soft_pin_action],
                               soft_pin_ttl_ms=c.soft_pin_ttl_ms, with_hard_pin=bool(c.with_hard_pin),
                               preferred_segments=tuple(dict.fromkeys(prefs)), group_id=group_id)

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

    def _descriptors(self, reps: list[Replica]) -> list:
        return [self._descriptor(i, r, PROCESSING) for i, r in enumerate(reps)]

    def PutStart(self, client: Sequence[int], key: bytes, size: int, c: Any, tenant: bytes) -> list:
        config = self._config(c, self._groups(c, 1)[0])
        return self._descriptors(self.master.put_start(uuid_text(client), key, size, config, _text(tenant)))

    def BatchPutStart(self, client: Sequence[int], keys: Sequence[bytes], sizes: Sequence[int], c: Any,
                      tenant: bytes) -> list:
        if len(keys) != len(sizes):
            raise MasterError(ErrorCode.INVALID_PARAMS, "keys and sizes differ in length")
        groups = self._groups(c, len(keys))
        out: list[Any] = [None] * len(keys)
        for group in dict.fromkeys(groups):  # one batch per group (a batch call carries one group)
            idx = [i for i, g in enumerate(groups) if g == group]
            results = self.master.batch_put_start(uuid_text(client), [keys[i] for i in idx], [sizes[i] for i in idx],
                                                  self._config(c, group), _text(tenant))
            for i, r in zip(idx, results):
                out[i] = Err(int(r)) if isinstance(r, ErrorCode) else self._one(lambda r=r: self._descriptors(r))
        return out

    @staticmethod
    def _checksum(meta: Any) -> str | None:
        return None if meta.object_checksum is None else str(meta.object_checksum)

    def PutEnd(self, client: Sequence[int], meta: Any, replica_type: int, tenant: bytes) -> None:
        self.master.put_end(uuid_text(client), meta.key, _text(tenant), checksum=self._checksum(meta))

    def BatchPutEnd(self, client: Sequence[int], metas: Sequence[Any], replica_type: int, tenant: bytes) -> list:
        codes: list[Any] = [None] * len(metas)
        with_sum = [i for i, m in enumerate(metas) if m.object_checksum is not None]
        plain = [i for i, m in enumerate(metas) if m.object_checksum is None]
        for idx, sums in ((plain, None), (with_sum, [self._checksum(metas[i]) for i in with_sum])):
            if idx:
                for i, code in zip(idx, self.master.batch_put_end(uuid_text(client), [metas[i].key for i in idx],
                                                                  _text(tenant), checksums=sums)):
                    codes[i] = code
        return [None if code == ErrorCode.OK else Err(int(code)) for code in codes]

    def PutRevoke(self, client: Sequence[int], key: bytes, replica_type: int, tenant: bytes) -> None:
        self.master.put_revoke(uuid_text(client), key, _text(tenant))

    def BatchPutRevoke(self, client: Sequence[int], keys: Sequence[bytes], replica_type: int, tenant: bytes) -> list:
        codes = self.master.batch_put_revoke(uuid_text(client), list(keys), _text(tenant))
        return [None if code == ErrorCode.OK else Err(int(code)) for code in codes]

    # ---- removal -------------------------------------------------------------------------
    def Remove(self, key: bytes, force: bool, tenant: bytes) -> None:
        self.master.remove(key, force, _text(tenant))

    def BatchRemove(self, keys: Sequence[bytes], force: bool, tenant: bytes) -> list:
        codes = self.master.batch_remove(list(keys), force, _text(tenant))
        return [None if code == ErrorCode.OK else Err(int(code)) for code in codes]

    def RemoveAll(self, force: bool, tenant: bytes) -> int:
        try:
            return self.master.remove_all(force, _text(tenant))
        except MasterError as exc:  # a bare i64 reply: Mooncake answers an error as its number
            return mooncake_code(exc)

    def RemoveByRegex(self, regex: bytes, force: bool, tenant: bytes) -> int:
        return self.master.remove_by_regex(_text(regex), force, _text(tenant))
