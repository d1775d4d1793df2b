"""KV events (EventsApi): with MasterConfig.kv_events_maxlen > 0, each shard's stream
`<ns>:{<ns>:<i>}:events` receives one entry for every change to its stored objects or to where
their bytes are, written by the same function call that makes the change (lua/lib/28_events.lua),
so that no event is lost or made up. `events` reads them from a position (per shard), `follow`
polls for new ones, and `live_keys` folds a list of events into the keys they leave readable.
The streams are bounded (about kv_events_maxlen entries each): a reader that falls further
behind loses the oldest, and sees it by the gap in the sequence (`Position.lost`)."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from .api import ApiBase
from .errors import ErrorCode, MasterError
from .layout import decode_reps

MAX_COUNT = 10_000  # entries read from one shard in one call


@dataclass(frozen=True)
class KVEvent:
    shard: int
    id: str          # the stream entry id "0-<n>": n is the shard's event sequence number (1, 2, ...)
    event: str       # stored, removed, evicted or updated (lua/lib/28_events.lua)
    tenant: str
    key: bytes
    ts: int          # the store clock at the change, ms
    size: int = 0    # stored and updated: the object's size, and where its bytes are
    memory: tuple[str, ...] = ()  # segments of its live memory replicas
    disk: tuple[str, ...] = ()    # clients of its live disk replicas

    def as_dict(self) -> dict:
        return {"shard": self.shard, "id": self.id, "event": self.event, "tenant": self.tenant,
                "key": self.key.decode(errors="backslashreplace"), "ts_ms": self.ts, "size_bytes": self.size,
                "memory": list(self.memory), "disk": list(self.disk)}


@dataclass
class Position:
    """Where a reader is in each shard's stream: the last id read (or "0-0": before the first)."""
    last: dict[int, str] = field(default_factory=dict)
    lost: dict[int, bool] = field(default_factory=dict)  # entries trimmed before they were read


def parse_names(text: bytes) -> tuple[str, ...]:
    """The "#<len>:<name>" tokens of a `disk` field (names may hold spaces)."""
    out, i = [], 0
    while i < len(text):
        colon = text.index(b":", i)
        n = int(text[i + 1:colon])
        out.append(text[colon + 1:colon + 1 + n].decode(errors="backslashreplace"))
        i = colon + 1 + n + 1  # the name and the space after it
    return tuple(out)


def _event(shard: int, entry_id: bytes, raw: dict) -> KVEvent:
    replicas = decode_reps(raw.get(b"reps", b"")) or []
    return KVEvent(shard=shard, id=entry_id.decode(), event=raw[b"e"].decode(), tenant=raw[b"tenant"].decode(),
                   key=raw[b"key"], ts=int(raw[b"ts"]), size=int(raw.get(b"size", b"0")),
                   memory=tuple(r.segment.decode(errors="backslashreplace") for r in replicas),
                   disk=parse_names(raw.get(b"disk", b"")))


def live_keys(events: Iterable[KVEvent]) -> set[tuple[str, bytes]]:
    """The (tenant, key) pairs left readable by `events` applied in order from an empty store."""
    live: set[tuple[str, bytes]] = set()
    for ev in events:
        if ev.event in ("stored", "updated"):
            live.add((ev.tenant, ev.key))
        else:
            live.discard((ev.tenant, ev.key))
    return live


class EventsApi(ApiBase):
    def events(self, position: Position | None = None, count: int = 1000) -> list[KVEvent]:
        """Up to `count` entries of each shard after `position` (None: from the oldest kept),
        shard by shard, in stream order within a shard; `position` moves past them, and
        `position.lost[shard]` is set when the stream was trimmed past where it stood. Changes
        of different shards have no order between them (each shard is its own stream)."""
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_COUNT:
            raise MasterError(ErrorCode.INVALID_PARAMS, f"count must be an integer in 1..{MAX_COUNT}")
        position = position if position is not None else Position()
        keys = self.transport.keys
        starts = [position.last.get(k.shard, "0-0") for k in keys]
        replies = self.transport.run([("XRANGE", k.events, f"({start}", "+", "COUNT", count)
                                      for k, start in zip(keys, starts)])
        out: list[KVEvent] = []
        for k, start, entries in zip(keys, starts, replies):
            if not entries:
                continue
            if _seq(entries[0][0]) != _seq(start) + 1:  # trimmed past where this reader was
                position.lost[k.shard] = True
            for entry_id, raw in entries:
                if isinstance(raw, list):  # RESP2: a flat list of field, value
                    raw = dict(zip(raw[::2], raw[1::2]))
                out.append(_event(k.shard, entry_id, raw))
            position.last[k.shard] = entries[-1][0].decode()
        return out

    def follow(self, position: Position | None = None, stop: threading.Event | None = None,
               interval_s: float = 0.2, count: int = 1000) -> Iterator[KVEvent]:
        """Events as they come, from `position` (None: only new ones), until `stop` is set:
        each shard polled every `interval_s` (works on Redis Cluster, where one XREAD cannot
        span shards)."""
        stop = stop or threading.Event()
        if position is None:
            position = self.events_position_now()
        while not stop.is_set():
            batch = self.events(position, count)
            yield from batch
            if len(batch) < count:
                stop.wait(interval_s)

    def events_position_now(self) -> Position:
        """The position after every entry written so far (a reader from here sees only new events)."""
        keys = self.transport.keys
        replies = self.transport.run([("XREVRANGE", k.events, "+", "-", "COUNT", 1) for k in keys],
                                     raise_on_error=False)
        last = {}
        for k, reply in zip(keys, replies):
            if isinstance(reply, list) and reply:
                last[k.shard] = reply[0][0].decode()
        return Position(last)


def _seq(entry_id: bytes | str) -> int:
    """The event sequence number of a stream id "0-<n>"."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.partition("-")[2] or 0)
