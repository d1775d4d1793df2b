"""The object hash's replica and status fields (lua/lib/20_object.lua): `reps` holds an object's
memory replicas, each "<offset> <mount id> <#segment> <segment>" one after another in segment
order (layout 2; a layout 1 object has one field rep:<segment> = "<offset> <mount id>" per
replica); `status` is there only while a put is in progress (layout 4)."""
from __future__ import annotations

import re
from typing import NamedTuple

REPS_FIELD = "reps"
STATUS_FIELD = b"status"
COMPLETE = b"complete"


def in_progress(status: bytes | None) -> bool:
    """Whether an object's stored `status` (None: none) says a put is in progress: it is stored
    only then (schema 4); a complete object has none, or, written by an older schema, "complete"."""
    return status is not None and status != COMPLETE


def stored_status(fields: dict[bytes, bytes]) -> bytes:
    """An object's status from its fields (see in_progress)."""
    return fields.get(STATUS_FIELD, COMPLETE)


_NODE_AT = re.compile(rb"=(\d+):(\d+)")


def node_of(key: bytes, field: bytes) -> bytes:
    """The radix node an object's `node` field names (lua/lib/20_object.lua, node_of: `=<n>:<length>`
    is where the hash sits in the key, `\\` escapes a hash that starts with `=` or a backslash,
    anything else is the hash itself), for the audit's reads of raw hashes."""
    at = _NODE_AT.fullmatch(field) if field[:1] == b"=" else None
    if at:
        n = int(at.group(1))
        return key[n:n + int(at.group(2))]
    return field[1:] if field[:1] == b"\\" else field


LEGACY_PREFIX = b"rep:"
_HEAD = re.compile(rb"(\d+) (\d+) (\d+) ")
_LEGACY_VALUE = re.compile(rb"(\d+) (\d+)")


class StoredReplica(NamedTuple):
    segment: bytes
    offset: int
    mount: bytes


def decode_reps(value: bytes) -> list[StoredReplica] | None:
    """The replicas of a `reps` value in its order; None when it is malformed."""
    out, at = [], 0
    while at < len(value):
        m = _HEAD.match(value, at)
        if not m or m.group(3) == b"0":
            return None
        start = m.end()
        end = start + int(m.group(3))
        if end > len(value):
            return None
        out.append(StoredReplica(value[start:end], int(m.group(1)), m.group(2)))
        at = end
    return out


def encode_reps(replicas: list[StoredReplica]) -> bytes:
    return b"".join(b"%d %s %d %s" % (r.offset, r.mount, len(r.segment), r.segment)
                    for r in sorted(replicas, key=lambda r: r.segment))


def stored_replicas(fields: dict[bytes, bytes]) -> list[StoredReplica] | None:
    """An object hash's memory replicas, of either layout (None: a malformed field)."""
    value = fields.get(REPS_FIELD.encode())
    out = decode_reps(value) if value is not None else []
    if out is None:
        return None
    for name, v in fields.items():
        if name.startswith(LEGACY_PREFIX):
            m = _LEGACY_VALUE.fullmatch(v)
            if not m:
                return None
            out.append(StoredReplica(name[len(LEGACY_PREFIX):], int(m.group(1)), m.group(2)))
    return sorted(out, key=lambda r: r.segment)
