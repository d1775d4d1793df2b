"""The CLI's group retention parts: the --ttl duration type, the status lines and the
`inspect --group` view (cli/main.py wires them in)."""
from __future__ import annotations

import re
from typing import Callable

import click

from mooncake_redis.groups import GroupInfo, ShardRetention
from mooncake_redis.keys import ShardKeys

_DURATION = re.compile(r"([0-9]+)(ms|s|m|h|d)?")
_UNIT_MS = {"ms": 1, None: 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


class Duration(click.ParamType):
    """A duration: an integer with a unit ms, s, m, h or d (no unit: milliseconds)."""

    name = "duration"

    def convert(self, value, param, ctx) -> int:
        if isinstance(value, int):
            return value
        m = _DURATION.fullmatch(str(value).strip())
        if not m:
            self.fail(f"{value!r} is not a duration (e.g. 10m, 90s, 1h, 500ms)", param, ctx)
        return int(m.group(1)) * _UNIT_MS[m.group(2)]


def status_lines(usage: list[ShardRetention], now: int) -> list[str]:
    active = sum(s.active for s in usage)
    held = sum(s.held for s in usage)
    line = (f"retention  {active} active retained group(s) of at most {sum(s.share for s in usage)} "
            f"(per tenant {sum(s.tenant_share for s in usage)})")
    if held != active:
        line += f"; {held - active} expired, freed by the next sweep"
    lines = [line]
    if len(usage) > 1:
        lines.append("           per shard (active/share): " +
                     "  ".join(f"{s.shard}:{s.active}/{s.share}" for s in usage))
    return lines


def group_lines(info: GroupInfo, namespace: str, now: int, deadline: Callable[[int | None, int], str]) -> list[str]:
    rkey = ShardKeys(namespace, info.shard).group(info.tenant_id, info.group_id).decode(errors="replace")
    state = "evictable" if info.why == "" else f"protected ({info.why})"
    return [
        f"group        {info.group_id}",
        f"tenant       {info.tenant_id}",
        f"shard        {info.shard}   redis key {rkey}",
        f"members      {info.members}",
        f"retention    {deadline(info.retained_until_ms, now)}",
        f"lease        {deadline(info.lease_until_ms, now)}",
        f"eviction     {state}" + (f", tier {info.tier}" if info.tier else ""),
    ]
