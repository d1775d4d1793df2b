"""Mooncake's master RPCs as the client release 0.3.13.post1 speaks them: the structs (NamedTuples
and their struct_pack descriptors), the RPC table (name, function id, request, response), the
handler ids, Mooncake's error codes and enums.

Sources: the types are those of kvcache-ai/Mooncake mooncake-store/include/{rpc_service.h,
rpc_types.h, replica.h, types.h, allocator.h, segment.h} @3b5a594 (2026-08-22), checked against
the 0.3.13.post1 wheel (git 7197358, not in that snapshot): every RPC marked "wire" was recorded
between that client and its mooncake_master, hash and literal equal; the others ("client") take
their parameter and return types from the RPC calls compiled into the wheel's store.so, and
"source" from the headers only.

Adding the next client release
------------------------------
struct_pack hashes pin each release: a type that gained a field has a new hash, and a client
refuses the old one. For a release R:
1. diff the headers above between the tags; for each struct whose layout changed, add a
   NamedTuple (e.g. ReplicateConfigR) and its descriptor; reuse every unchanged one.
2. write `_spec_R()` starting from `_spec_0_3_13_post1()` and replacing the changed entries,
   and add `SCHEMAS["R"] = _table(_spec_R())`.
3. record a session of client R against mooncake_master R (captures: see tests/data/mooncake-wire)
   and add it to the capture test, which re-encodes every recorded body byte for byte.
The server picks a table by release (one per gateway; a release cannot be told from the bytes: the
GetReplicaList request of 0.3.12 and 0.3.13 is the same, its response is not).
"""
from __future__ import annotations

import hashlib
from typing import NamedTuple, Optional

from .codec import (
    Type,
    args,
    boolean,
    expected,
    f64,
    i32,
    i64,
    optional,
    prepare,
    string,
    struct_,
    u8,
    u32,
    u64,
    unordered_map,
    uuid,
    variant,
    vector,
    void,
)

CLIENT_RELEASE = "0.3.13.post1"
SERVICE_VERSION = "2.0.0"  # ServiceReady's answer: MOONCAKE_STORE_VERSION, unchanged since v0.3.8
UUID = tuple  # (hi, lo): std::pair<uint64_t, uint64_t>


class ErrorCode:
    """Mooncake's ErrorCode (types.h), the int32 in every expected's error side."""
    OK = 0
    INTERNAL_ERROR = -1
    BUFFER_OVERFLOW = -10
    SEGMENT_NOT_FOUND = -101
    SEGMENT_ALREADY_EXISTS = -102
    CLIENT_NOT_FOUND = -103
    NO_AVAILABLE_HANDLE = -200
    INVALID_VERSION = -300
    INVALID_KEY = -400
    INVALID_PARAMS = -600
    ILLEGAL_CLIENT = -601
    INVALID_WRITE = -700
    INVALID_READ = -701
    INVALID_REPLICA = -702
    REPLICA_IS_NOT_READY = -703
    OBJECT_NOT_FOUND = -704
    OBJECT_ALREADY_EXISTS = -705
    OBJECT_HAS_LEASE = -706
    LEASE_EXPIRED = -707
    OBJECT_HAS_REPLICATION_TASK = -708
    OBJECT_NO_REPLICATION_TASK = -709
    REPLICA_NOT_FOUND = -710
    REPLICA_IS_GONE = -712
    TRANSFER_FAIL = -800
    CHECKSUM_MISMATCH = -801
    RPC_FAIL = -900
    UNAVAILABLE_IN_CURRENT_STATUS = -1010
    UNAVAILABLE_IN_CURRENT_MODE = -1011
    UNSUPPORTED = -1012  # Mooncake's NOT_SUPPORTED, "operation is not supported in current mode"
    TASK_NOT_FOUND = -1400
    TASK_PENDING_LIMIT_EXCEEDED = -1401
    TENANT_QUOTA_EXCEEDED = -1700


ERROR_NAMES = {v: k for k, v in vars(ErrorCode).items() if k.isupper()}
ERROR_NAMES[ErrorCode.UNSUPPORTED] = "NOT_SUPPORTED"


class ReplicaType:  # replica.h, int32
    MEMORY, DISK, LOCAL_DISK, NOF_SSD, ALL, DFS = 0, 1, 2, 3, 4, 100


class ReplicaStatus:  # replica.h, int32
    UNDEFINED, INITIALIZED, PROCESSING, COMPLETE, REMOVED, FAILED = range(6)


class ClientStatus:  # types.h, int32: PingResponse.client_status
    UNDEFINED, OK, NEED_REMOUNT = 0, 1, 2


class SoftPinAction:  # types.h, uint8: ReplicateConfig.soft_pin_action
    PRESERVE, ENABLE, DISABLE = 0, 1, 2


class SegmentStatus:  # segment.h, int32
    UNDEFINED, OK, DRAINING, DRAINED, GRACEFULLY_UNMOUNTING, UNMOUNTING = range(6)


class DescriptorKind:
    """Index of Replica::Descriptor's descriptor_variant alternatives."""
    MEMORY, NOF, DISK, LOCAL_DISK, DFS = range(5)


# ------------------------------------------------------------------ structs (0.3.13.post1)

class Segment(NamedTuple):
    id: UUID
    name: bytes
    base: int
    size: int
    te_endpoint: bytes
    protocol: bytes
    host_id: bytes


class ReplicateConfig(NamedTuple):  # an aggregate: declaration order
    replica_num: int = 1
    nof_replica_num: int = 0
    dfs_replica_num: int = 0
    soft_pin_action: int = SoftPinAction.PRESERVE
    soft_pin_ttl_ms: Optional[int] = None
    with_hard_pin: bool = False
    preferred_segments: list = ()  # type: ignore[assignment]  # () not []: a shared default
    preferred_segment: bytes = b""
    preferred_nof_segments: list = ()  # type: ignore[assignment]
    prefer_alloc_in_same_node: bool = False
    data_type: int = 0
    host_id: bytes = b""
    group_ids: Optional[list] = None


class ObjectMeta(NamedTuple):
    key: bytes
    object_checksum: Optional[int] = None


class BufferDescriptor(NamedTuple):  # AllocatedBuffer::Descriptor
    size_: int
    buffer_address_: int
    protocol_: bytes
    transport_endpoint_: bytes


class MemoryDescriptor(NamedTuple):
    buffer_descriptor: BufferDescriptor


class NoFDescriptor(NamedTuple):
    buffer_descriptor: BufferDescriptor


class DiskDescriptor(NamedTuple):
    file_path: bytes
    object_size: int


class LocalDiskDescriptor(NamedTuple):
    client_id: UUID
    object_size: int
    transport_endpoint: bytes


class DfsDescriptor(NamedTuple):  # DistributedFSDescriptor
    file_path: bytes
    offset: int
    object_size: int
    aligned_size: int
    shard_idx: int


class ReplicaDescriptor(NamedTuple):  # Replica::Descriptor
    id: int
    descriptor_variant: tuple  # (DescriptorKind, its descriptor)
    status: int


class GetReplicaListResponse(NamedTuple):
    replicas: list
    lease_ttl_ms: int
    object_checksum: Optional[int] = None


class PingResponse(NamedTuple):
    view_version_id: int
    client_status: int


class GetStorageConfigResponse(NamedTuple):
    fsdir: bytes
    enable_disk_eviction: bool
    quota_bytes: int


class TaskAssignment(NamedTuple):
    id: UUID
    type: int
    payload: bytes
    created_at_ms_epoch: int
    max_retry_attempts: int


class CopyStartResponse(NamedTuple):
    source: "ReplicaDescriptor"
    targets: list


class MoveStartResponse(NamedTuple):
    source: "ReplicaDescriptor"
    target: Optional["ReplicaDescriptor"]


class QueryTaskResponse(NamedTuple):
    id: UUID
    type: int      # TaskType
    status: int    # TaskStatus
    created_at_ms_epoch: int
    last_updated_at_ms_epoch: int
    assigned_client: UUID
    message: bytes


class TaskCompleteRequest(NamedTuple):
    id: UUID
    status: int    # TaskStatus
    message: bytes


class TaskType:  # task_manager.h, int32
    REPLICA_COPY, REPLICA_MOVE = 0, 1


class TaskStatus:  # task_manager.h, int32
    PENDING, PROCESSING, FAILED, SUCCESS = range(4)


# Descriptors. Enums are their underlying integers: ErrorCode, ReplicaType, ReplicaStatus,
# ClientStatus, SegmentStatus i32; SoftPinAction, ObjectDataType u8.
KEYS = vector(string)
SEGMENT = struct_(Segment, id=uuid, name=string, base=u64, size=u64, te_endpoint=string,
                  protocol=string, host_id=string)
REPLICATE_CONFIG = struct_(
    ReplicateConfig, replica_num=u64, nof_replica_num=u64, dfs_replica_num=u64, soft_pin_action=u8,
    soft_pin_ttl_ms=optional(u64), with_hard_pin=boolean, preferred_segments=KEYS,
    preferred_segment=string, preferred_nof_segments=KEYS, prefer_alloc_in_same_node=boolean,
    data_type=u8, host_id=string, group_ids=optional(KEYS))
OBJECT_META = struct_(ObjectMeta, key=string, object_checksum=optional(u64))
BUFFER_DESCRIPTOR = struct_(BufferDescriptor, size_=u64, buffer_address_=u64, protocol_=string,
                            transport_endpoint_=string)
REPLICA_DESCRIPTOR = struct_(
    ReplicaDescriptor, id=u64,
    descriptor_variant=variant(
        struct_(MemoryDescriptor, buffer_descriptor=BUFFER_DESCRIPTOR),
        struct_(NoFDescriptor, buffer_descriptor=BUFFER_DESCRIPTOR),
        struct_(DiskDescriptor, file_path=string, object_size=u64),
        struct_(LocalDiskDescriptor, client_id=uuid, object_size=u64, transport_endpoint=string),
        struct_(DfsDescriptor, file_path=string, offset=u64, object_size=u64, aligned_size=u64,
                shard_idx=i32)),
    status=i32)
REPLICAS = vector(REPLICA_DESCRIPTOR)
GET_REPLICA_LIST_RESPONSE = struct_(GetReplicaListResponse, replicas=REPLICAS, lease_ttl_ms=u64,
                                    object_checksum=optional(u64))
PING_RESPONSE = struct_(PingResponse, view_version_id=i64, client_status=i32)
GET_STORAGE_CONFIG_RESPONSE = struct_(GetStorageConfigResponse, fsdir=string,
                                      enable_disk_eviction=boolean, quota_bytes=u64)
COPY_START_RESPONSE = struct_(CopyStartResponse, source=REPLICA_DESCRIPTOR, targets=REPLICAS)
MOVE_START_RESPONSE = struct_(MoveStartResponse, source=REPLICA_DESCRIPTOR, target=optional(REPLICA_DESCRIPTOR))
QUERY_TASK_RESPONSE = struct_(QueryTaskResponse, id=uuid, type=i32, status=i32, created_at_ms_epoch=i64,
                              last_updated_at_ms_epoch=i64, assigned_client=uuid, message=string)
TASK_COMPLETE_REQUEST = struct_(TaskCompleteRequest, id=uuid, status=i32, message=string)
TASK_ASSIGNMENT = struct_(TaskAssignment, id=uuid, type=i32, payload=string,
                          created_at_ms_epoch=i64, max_retry_attempts=u32)


class Rpc(NamedTuple):
    name: str
    id: int  # coro_rpc function id
    request: Optional[Type]  # None: no parameters, an empty body
    response: Type


def function_id(name: str) -> int:
    """coro_rpc's id of a registered member function: MD5 of its qualified name, first 4 bytes
    read big-endian."""
    return int.from_bytes(hashlib.md5(f"mooncake::WrappedMasterService::{name}".encode()).digest()[:4], "big")


def _spec_0_3_13_post1() -> dict[str, tuple[Optional[Type], Type]]:
    E = expected
    e_void, e_replicas, e_grl = E(void), E(REPLICAS), E(GET_REPLICA_LIST_RESPONSE)
    key_tenant = args(string, string)
    uuid_key_tenant = args(uuid, string, string)
    return {
        # wire: recorded from the 0.3.13.post1 client and master
        "ServiceReady": (None, E(string)),
        "GetStorageConfig": (None, E(GET_STORAGE_CONFIG_RESPONSE)),
        "MountSegment": (args(SEGMENT, uuid), e_void),
        "ReMountSegment": (args(vector(SEGMENT), uuid), e_void),
        "UnmountSegment": (args(uuid, uuid), e_void),  # (segment_id, client_id)
        "Ping": (args(uuid), E(PING_RESPONSE)),
        "FetchTasks": (args(uuid, u64), E(vector(TASK_ASSIGNMENT))),
        "ExistKey": (key_tenant, E(boolean)),
        "BatchExistKey": (args(KEYS, string), vector(E(boolean))),
        "GetReplicaList": (key_tenant, e_grl),
        "PutStart": (args(uuid, string, u64, REPLICATE_CONFIG, string), e_replicas),
        "PutEnd": (args(uuid, OBJECT_META, i32, string), e_void),
        "Remove": (args(string, boolean, string), e_void),
        "RemoveAll": (args(boolean, string), i64),  # a bare C++ long, not an expected
        # client: the calls compiled into the wheel; the prototype gateway served most of them
        "GetFsdir": (None, E(string)),
        "BatchGetReplicaList": (args(KEYS, string), vector(e_grl)),
        "PutRevoke": (args(uuid, string, i32, string), e_void),
        "BatchPutStart": (args(uuid, KEYS, vector(u64), REPLICATE_CONFIG, string), vector(e_replicas)),
        "BatchPutEnd": (args(uuid, vector(OBJECT_META), i32, string), vector(e_void)),
        "BatchPutRevoke": (args(uuid, KEYS, i32, string), vector(e_void)),
        "RemoveByRegex": (args(string, boolean, string), E(i64)),
        "BatchRemove": (args(KEYS, boolean, string), vector(e_void)),
        "GetReplicaListByRegex": (key_tenant, E(unordered_map(string, REPLICAS))),
        "UpsertStart": (args(uuid, string, u64, REPLICATE_CONFIG, string), e_replicas),
        "UpsertEnd": (args(uuid, OBJECT_META, i32, string), e_void),
        "UpsertRevoke": (args(uuid, string, i32, string), e_void),
        "BatchUpsertStart": (args(uuid, KEYS, vector(u64), REPLICATE_CONFIG, string), vector(e_replicas)),
        "BatchUpsertEnd": (args(uuid, vector(OBJECT_META), string), vector(e_void)),  # no ReplicaType
        "BatchUpsertRevoke": (args(uuid, KEYS, string), vector(e_void)),
        "GracefulUnmountSegment": (args(uuid, uuid, u64), e_void),
        "QuerySegmentStatusById": (args(uuid), E(i32)),  # SegmentStatus
        "BatchQueryIp": (args(vector(uuid)), E(unordered_map(uuid, KEYS))),
        "BatchReplicaClear": (args(KEYS, uuid, string), E(KEYS)),
        "MountLocalDiskSegment": (args(uuid, boolean), e_void),
        "UnmountLocalDiskSegment": (args(uuid), e_void),
        "PollRemoveAll": (args(uuid), E(boolean)),
        "ReportSsdCapacity": (args(uuid, i64), e_void),
        "UnmountNoFSegment": (args(uuid, uuid), e_void),
        "NotifyPromotionSuccess": (uuid_key_tenant, e_void),
        "NotifyPromotionFailure": (uuid_key_tenant, e_void),
        "CreateCopyTask": (args(string, string, KEYS), E(uuid)),  # (key, tenant, targets)
        "CreateMoveTask": (args(string, string, string, string), E(uuid)),
        "CopyStart": (args(uuid, string, string, string, KEYS), E(COPY_START_RESPONSE)),  # (.., src, targets)
        "MoveStart": (args(uuid, string, string, string, string), E(MOVE_START_RESPONSE)),
        "QueryTask": (args(uuid), E(QUERY_TASK_RESPONSE)),
        "MarkTaskToComplete": (args(uuid, TASK_COMPLETE_REQUEST), e_void),
        "CopyEnd": (uuid_key_tenant, e_void),
        "CopyRevoke": (uuid_key_tenant, e_void),
        "MoveEnd": (uuid_key_tenant, e_void),
        "MoveRevoke": (uuid_key_tenant, e_void),
        "DynamicReplicaCopyEnd": (args(uuid, string, string, uuid, u64), e_void),
        "DynamicReplicaCopyRevoke": (args(uuid, string, string, uuid, u64), e_void),
        "EvictDiskReplica": (args(uuid, string, string, i32), e_void),
        "BatchEvictDiskReplica": (args(uuid, KEYS, string, i32), vector(e_void)),
        "CalcCacheStats": (None, E(unordered_map(i32, f64))),  # CacheHitStat -> double
        # source: registered by the master, not called by this client
        "QuerySegmentStatus": (args(string), E(i32)),
    }


def _table(spec: dict[str, tuple[Optional[Type], Type]]) -> dict[str, Rpc]:
    table = {name: Rpc(name, function_id(name), req, rsp) for name, (req, rsp) in spec.items()}
    for rpc in table.values():  # compile every reader and writer now, not on a request's path
        prepare(rpc.request)
        prepare(rpc.response)
    return table


SCHEMAS: dict[str, dict[str, Rpc]] = {"0.3.13.post1": _table(_spec_0_3_13_post1())}
RPCS = SCHEMAS[CLIENT_RELEASE]  # the default release
BY_ID: dict[int, Rpc] = {rpc.id: rpc for rpc in RPCS.values()}

# Every handler RegisterRpcService registers (rpc_service.cpp; the same 65 names are called in the
# wheel's client), so that an RPC the gateway does not serve can be named and refused.
HANDLER_NAMES = """ExistKey BatchQueryIp BatchReplicaClear GetReplicaListByRegex GetReplicaList
BatchGetReplicaList PutStart PutEnd PutRevoke BatchPutStart BatchPutEnd BatchPutRevoke UpsertStart
UpsertEnd UpsertRevoke BatchUpsertStart BatchUpsertEnd BatchUpsertRevoke Remove RemoveByRegex
RemoveAll BatchRemove MountSegment MountNoFSegment ReMountSegment ReMountNoFSegment UnmountSegment
GracefulUnmountSegment UnmountNoFSegment GetAllNoFSegments GetNoFSegmentsByName Ping GetFsdir
QuerySegmentStatus QuerySegmentStatusById GetStorageConfig BatchExistKey ServiceReady
MountLocalDiskSegment UnmountLocalDiskSegment OffloadObjectHeartbeat ReportSsdCapacity
NotifyOffloadSuccess PromotionObjectHeartbeat PromotionAllocStart NotifyPromotionSuccess
NotifyPromotionFailure CopyStart DynamicReplicaCopyStart CopyEnd DynamicReplicaCopyEnd CopyRevoke
DynamicReplicaCopyRevoke MoveStart MoveEnd MoveRevoke EvictDiskReplica BatchEvictDiskReplica
PollRemoveAll CreateCopyTask CreateMoveTask QueryTask FetchTasks MarkTaskToComplete
CalcCacheStats""".split()
NAMES_BY_ID: dict[int, str] = {function_id(n): n for n in HANDLER_NAMES}
