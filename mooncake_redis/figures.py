"""The store's figures as Python reads them: the counts, byte sizes, sequences and clocks kept as
hash fields (every field of P, a segment's `base`, `size`, `used` and `g:<tenant>`, P:gtenants,
a local disk's counts, the workers' P:metrics). The functions write them as integers in
canonical decimal form within +-(2^53 - 1) and count with them (HINCRBY, tonumber); anything else
(a hand edit, another program, a value past 2^53) is malformed: a function that adds to it fails.

Readers never raise on one: `Figures.get` reads it as 0 and records it, `note` logs a warning
the first time a reader (a Master) sees it, and fsck reports it and recomputes the ones it
derives (mooncake_redis/fsck: the shard counters, segment used bytes, guaranteed bytes, disk
used bytes)."""
from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

log = logging.getLogger(__name__)

MAX_FIGURE = 2**53 - 1  # Base.MAX_INT in lua/lib/00_base.lua
_CANONICAL = re.compile(rb"0|-?[1-9][0-9]{0,15}")


def parse(raw: Any) -> int | None:
    """The figure stored as `raw` (bytes as Redis replies; None, an absent field, is 0), or None
    when it is malformed."""
    if raw is None:
        return 0
    b = raw if isinstance(raw, bytes) else str(raw).encode()
    if not _CANONICAL.fullmatch(b):
        return None
    value = int(b)
    return value if -MAX_FIGURE <= value <= MAX_FIGURE else None


def shown(raw: Any) -> str:
    """A stored value as text, for messages."""
    return raw.decode("utf-8", "backslashreplace") if isinstance(raw, (bytes, bytearray)) else str(raw)


class Figures:
    """Reads the figures of one hash: get() answers 0 for a malformed one and records it in
    `malformed` (its name as given -> the value as stored)."""

    def __init__(self, where: str = ""):
        self.where = where  # prefixed to the names recorded, e.g. "P." or "P:seg:<name>."
        self.malformed: dict[str, str] = {}

    def get(self, name: str, raw: Any) -> int:
        value = parse(raw)
        if value is None:
            self.malformed[self.where + name] = shown(raw)
            return 0
        return value


def note(seen: dict[str, str], shard: int, read: str | Iterable[str], malformed: dict[str, str]) -> None:
    """Log a warning for each malformed figure of `shard` that this reader did not report yet
    with that value. `read` names the figures the reader has just read: a prefix such as "P."
    (every field of that hash) or the names themselves. `seen` is the reader's memory (a
    Master's), so a long-running reader such as a metrics endpoint warns once, not at every
    scrape, and `status` once for a figure that two of its reads see; figures read well-formed
    again are forgotten, so a new corruption warns again."""
    prefix = f"{shard}:"

    def was_read(name: str) -> bool:
        return name.startswith(read) if isinstance(read, str) else name in names

    names = set() if isinstance(read, str) else set(read)
    for name, raw in malformed.items():
        if was_read(name) and seen.get(prefix + name) != raw:
            seen[prefix + name] = raw
            log.warning("shard %d: %s is malformed (%r, not an integer) and reads as 0: `mooncake-redis fsck` "
                        "reports it, `fsck --repair` recomputes the derived ones", shard, name, raw)
    for key in [k for k in seen if k.startswith(prefix) and was_read(k[len(prefix):])
                and k[len(prefix):] not in malformed]:
        del seen[key]
