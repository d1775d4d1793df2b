"""Error codes (Mooncake's numbers, plus this project's own below -10000) and the exception
single calls raise."""
from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    OK = 0
    INTERNAL_ERROR = -1
    SEGMENT_NOT_FOUND = -101
    SEGMENT_ALREADY_EXISTS = -102
    CLIENT_NOT_FOUND = -103
    NO_AVAILABLE_HANDLE = -200
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
    UNAVAILABLE_IN_CURRENT_STATUS = -1010
    TASK_NOT_FOUND = -1400
    TASK_PENDING_LIMIT_EXCEEDED = -1401
    # This project's own codes, clear of Mooncake's ranges (-1 to -1799 so far).
    OUTCOME_UNKNOWN = -10000  # no reply (timeout, lost connection): the call may or may not have run
    UNAVAILABLE = -10001      # the server did not run the call now (loading its data, busy, failing over): retry
    # a guaranteed put would pass the shard's or the tenant's guaranteed-bytes limit
    GUARANTEED_CAPACITY_EXCEEDED = -10002
    RETENTION_LIMIT_EXCEEDED = -10003  # retain_groups: admitting the group would pass a retained-groups limit
    HOST_SEGMENTS_EXCEEDED = -10004  # mount_segment: the host already has 64 segments mounted (per shard)
    # put_end: the key's radix node is not yet listed by its parent on another shard (drain the outbox, retry)
    RADIX_LINK_PENDING = -10010


class MasterError(Exception):
    """A failed master call; `.code` is an ErrorCode."""

    def __init__(self, code: ErrorCode, message: str = ""):
        self.code = ErrorCode(code)
        self.message = message
        super().__init__(f"{self.code.name} ({int(self.code)}): {message}" if message else self.code.name)


def parse_error_reply(text: str) -> MasterError | None:
    """Turn a function's error reply "<NAME> <code> <detail>" into a MasterError (None if foreign)."""
    _, marker, rest = text.partition("caused error: ")  # redis-py's prefix inside pipelines
    parts = (rest if marker else text).split(" ", 2)
    if len(parts) >= 2 and parts[0] in ErrorCode.__members__:
        try:
            code = ErrorCode(int(parts[1]))
        except ValueError:
            return None
        return MasterError(code, parts[2] if len(parts) > 2 else "")
    return None
