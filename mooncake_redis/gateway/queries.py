"""The gateway's handlers of Mooncake's segment queries and graceful unmount (a mixin of
Handlers, mooncake_redis/gateway/handlers.py): CalcCacheStats, BatchQueryIp,
GracefulUnmountSegment, QuerySegmentStatusById and QuerySegmentStatus, all "blocking" (they run
on the gateway's thread pool and call Master)."""
from __future__ import annotations

import functools
import uuid as uuidlib
from typing import TYPE_CHECKING, Any, Sequence

from ..errors import ErrorCode, MasterError
from ..segments import MAX_GRACE_MS
from . import schema
from .codec import Err

if TYPE_CHECKING:
    from ..master import Master
    from .store import GatewayStore

MAX_QUERY_CLIENTS = 4096  # client ids per BatchQueryIp


def uuid_text(pair: Sequence[int]) -> str:
    """A Mooncake UUID (hi, lo) as the client or segment id the store keeps."""
    return _uuid_text(pair[0], pair[1])


@functools.lru_cache(maxsize=4096)  # a gateway sees few clients, each in every request it sends
def _uuid_text(hi: int, lo: int) -> str:
    return str(uuidlib.UUID(int=(hi << 64) | lo))


def uuid_client(text: str) -> tuple[int, int]:
    """A client id the store keeps (a UUID's text, as uuid_text makes it) as Mooncake's UUID."""
    try:
        n = uuidlib.UUID(text).int
    except ValueError:
        return (0, 0)
    return n >> 64, n & ((1 << 64) - 1)


def _text(b: bytes) -> str:
    return b.decode("utf-8", "surrogateescape")


class SegmentQueries:
    master: "Master"
    store: "GatewayStore"

    def CalcCacheStats(self) -> dict[int, float]:
        return self.master.cache_stats().mooncake()

    def BatchQueryIp(self, clients: Sequence[Sequence[int]]) -> dict:
        """Each asked client with a mounted segment -> the hosts of its segments' endpoints."""
        if len(clients) > MAX_QUERY_CLIENTS:
            raise MasterError(ErrorCode.INVALID_PARAMS, f"at most {MAX_QUERY_CLIENTS} client ids per call")
        hosts = self.store.client_hosts([uuid_text(c) for c in clients])
        return {tuple(c): [h.encode("utf-8", "surrogateescape") for h in hosts[uuid_text(c)]]
                for c in clients if uuid_text(c) in hosts}

    # ---- graceful unmount --------------------------------------------------------------
    def GracefulUnmountSegment(self, segment: Sequence[int], client: Sequence[int], grace_period_ms: int) -> Any:
        """Stop allocating on the segment; its objects stay readable until it drains or the grace
        period ends, then the worker unmounts it (the recorded facts go with shard 0's slice).
        Mooncake's answers: a segment the client does not own is INVALID_PARAMS, a client with
        no segment SEGMENT_NOT_FOUND; a grace period past 10^15 ms is taken as 10^15."""
        client_id = uuid_text(client)
        name = self.store.segment_name(uuid_text(segment))
        if name is None:
            owns_any = client_id in self.store.client_hosts([client_id])
            return Err(int(ErrorCode.INVALID_PARAMS if owns_any else ErrorCode.SEGMENT_NOT_FOUND))
        try:
            self.master.graceful_unmount_segment(name, client_id, min(grace_period_ms, MAX_GRACE_MS))
        except MasterError as exc:
            if exc.code == ErrorCode.ILLEGAL_CLIENT:  # Mooncake: not among the client's segments
                return Err(int(ErrorCode.INVALID_PARAMS))
            raise
        return None

    def QuerySegmentStatusById(self, segment: Sequence[int]) -> Any:
        name = self.store.segment_name(uuid_text(segment))
        return self.QuerySegmentStatus(name.encode("utf-8", "surrogateescape")) if name is not None \
            else Err(int(ErrorCode.SEGMENT_NOT_FOUND))

    def QuerySegmentStatus(self, name: bytes) -> Any:
        """Mooncake's SegmentStatus: OK (1), GRACEFULLY_UNMOUNTING (4); not mounted: SEGMENT_NOT_FOUND."""
        text = _text(name)
        status = self.master.segment_status(text) if 1 <= len(name) <= 1024 else None
        if status is None:
            return Err(int(ErrorCode.SEGMENT_NOT_FOUND))
        return getattr(schema.SegmentStatus, status)
