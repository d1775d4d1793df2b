"""The CLI's group retention parts: the `retain` command and its --ttl duration type, status's
retention report and lines, and the `inspect --group` view."""
from __future__ import annotations

import re
from typing import Callable

import click

from mooncake_redis import ErrorCode
from mooncake_redis.groups import GroupInfo, ShardRetention
from mooncake_redis.keys import ShardKeys

from .context import Opts, open_existing
from .output import emit_json, iso, json_option

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


def retention_report(usage: list[ShardRetention]) -> dict:
    """status's `retention` object (docs/json.md)."""
    return {"active_groups": sum(s.active for s in usage), "held_slots": sum(s.held for s in usage),
            "limit": sum(s.share for s in usage), "tenant_limit": sum(s.tenant_share for s in usage),
            "shards": [{"shard": s.shard, "active_groups": s.active, "held_slots": s.held, "share": s.share,
                        "tenant_share": s.tenant_share} for s in usage]}


def status_lines(r: dict) -> list[str]:
    line = (f"retention  {r['active_groups']} active retained group(s) of at most {r['limit']} "
            f"(per tenant {r['tenant_limit']})")
    if r["held_slots"] != r["active_groups"]:
        line += f"; {r['held_slots'] - r['active_groups']} expired, freed by the next sweep"
    lines = [line]
    if len(r["shards"]) > 1:
        lines.append("           per shard (active/share): " +
                     "  ".join(f"{s['shard']}:{s['active_groups']}/{s['share']}" for s in r["shards"]))
    return lines


def group_report(info: GroupInfo, namespace: str, now: int) -> dict:
    """inspect --group's JSON fields (docs/json.md)."""
    return {"group": info.group_id, "tenant": info.tenant_id, "found": True, "shard": info.shard,
            "redis_key": ShardKeys(namespace, info.shard).group(info.tenant_id, info.group_id).decode(errors="replace"),
            "now_ms": now, "members": info.members, "retained_until_ms": info.retained_until_ms,
            "lease_until_ms": info.lease_until_ms or None, "protected_by": info.why or None,
            "tier": info.tier or None, "fields": dict(info.fields)}


def group_lines(r: dict, deadline: Callable[[int | None, int], str]) -> list[str]:
    state = "evictable" if r["protected_by"] is None else f"protected ({r['protected_by']})"
    return [
        f"group        {r['group']}",
        f"tenant       {r['tenant']}",
        f"shard        {r['shard']}   redis key {r['redis_key']}",
        f"members      {r['members']}",
        f"retention    {deadline(r['retained_until_ms'], r['now_ms'])}",
        f"lease        {deadline(r['lease_until_ms'], r['now_ms'])}",
        f"eviction     {state}" + (f", tier {r['tier']}" if r["tier"] else ""),
    ]


@click.command()
@click.argument("groups", nargs=-1, required=True)
@click.option("--ttl", type=Duration(), required=True, help="Retention from now: 10m, 90s, 2h, 500ms.")
@click.option("--tenant", default="default", show_default=True, help="Tenant id of the groups.")
@json_option
@click.pass_obj
def retain(opts: Opts, groups: tuple[str, ...], ttl: int, tenant: str, as_json: bool) -> None:
    """Retain GROUPs for --ttl (never shortens a later deadline). Exit 1 if any was refused."""
    master = open_existing(opts)
    try:
        results = master.retain_groups(list(groups), ttl, tenant)
    finally:
        master.close()
    # an ErrorCode is an IntEnum: check it before treating r as a deadline
    if as_json:
        emit_json("retain", {"tenant": tenant, "ttl_ms": ttl, "groups": [
            {"group": g, "retained_until_ms": None if isinstance(r, ErrorCode) else int(r),
             "refused": r.name if isinstance(r, ErrorCode) else None,
             "code": int(r) if isinstance(r, ErrorCode) else None} for g, r in zip(groups, results)]})
    else:
        for g, r in zip(groups, results):
            click.echo(f"{g}  " + (f"refused: {r.name} ({int(r)})" if isinstance(r, ErrorCode)
                                   else f"retained until {iso(r)} ({r} ms)"))
    if any(isinstance(r, ErrorCode) for r in results):
        raise click.exceptions.Exit(1)

