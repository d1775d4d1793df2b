"""`mooncake-redis inspect`: one object, group (--group) or radix node (--node), as stored; an
inspection, not a read."""
from __future__ import annotations

import re

import click

from mooncake_redis import ErrorCode, MasterError
from mooncake_redis.keys import ShardKeys

from .context import Opts, open_existing
from .output import deadline, emit_json, human, iso, json_option, text
from .radix import node_lines, node_report
from .retention import group_lines, group_report

_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")


def key_candidates(key: str, as_hex: bool) -> list[bytes]:
    """The object keys KEY may name, in the order tried: with --hex, the bytes it spells; else
    the key as typed (bytes the shell passed that are not UTF-8 come back as they were), then,
    if it has \\xNN escapes (as status, inspect and --json print bytes that are not UTF-8),
    the key with each one as its byte."""
    if as_hex:
        try:
            return [bytes.fromhex(key)]
        except ValueError:
            raise click.BadParameter(f"{key!r} is not hex (two digits per byte, e.g. 6b31ff)",
                                     param_hint="KEY") from None
    typed = key.encode("utf-8", "surrogateescape")
    unescaped = _ESCAPE.sub(lambda m: bytes([int(m.group(1), 16)]), typed)
    return [typed] + ([unescaped] if unescaped != typed else [])


@click.command()
@click.argument("key", required=False)
@click.option("--hex", "as_hex", is_flag=True,
              help="KEY is the key's bytes in hex (e.g. 6b31ff), for a key that is not UTF-8.")
@click.option("--tenant", default="default", show_default=True, help="Tenant id of the object.")
@click.option("--raw", is_flag=True, help="Print the object hash's fields as stored.")
@click.option("--group", default=None, help="Show this group (members, retention, lease) instead of an object.")
@click.option("--node", default=None, help="Show this radix node (parent, children, keys) instead of an object.")
@json_option
@click.pass_obj
def inspect(opts: Opts, key: str | None, as_hex: bool, tenant: str, raw: bool, group: str | None, as_json: bool,
            node: str | None = None) -> None:
    """Show one object: size, status, writer, times, lease, pins, guarantee, group, replicas (or,
    with --group, one group: members, retention, lease, eviction tier).

    A key that is not UTF-8: as printed (\\xNN for such bytes, e.g. 'k\\xff1'), or its bytes
    in hex with --hex (6bff31). An inspection, not a read: no lease is granted. Exit 1 if
    the object does not exist (--json: prints found false)."""
    if sum(x is not None for x in (key, group, node)) != 1:
        raise click.UsageError("give an object KEY, --group GROUP or --node HASH")
    if as_hex and key is None:
        raise click.UsageError("--hex is for an object KEY")
    if group is not None:
        return _inspect_group(opts, group, tenant, as_json)
    if node is not None:
        return _inspect_node(opts, node, tenant, as_json)
    assert key is not None  # the one given
    candidates = key_candidates(key, as_hex)
    master = open_existing(opts)
    try:
        shown = text(candidates[0])
        info = _describe_or_exit(lambda: _describe_first(master, candidates, tenant),
                                 f"object {shown!r} (tenant {tenant!r}, namespace {master.ns!r})",
                                 {"key": shown, "tenant": tenant}, as_json)
        now = master.now_ms()
    finally:
        master.close()
    bkey = info.key
    key = text(bkey)
    shard = master.transport.shard_of(bkey)
    rkey = ShardKeys(master.ns, shard).object(tenant, bkey).decode(errors="backslashreplace")
    out = click.echo
    if as_json:
        emit_json("inspect", _inspect_report(info, key, tenant, shard, rkey, now))
        return
    if raw:
        out(f"# HGETALL {rkey}")
        for name in sorted(info.fields):
            out(f"{name} {info.fields[name]}")
        return
    f = info.fields
    out(f"key          {key}" + ("" if _is_utf8(bkey) else f"   (not UTF-8; hex {bkey.hex()})"))
    out(f"tenant       {tenant}")
    out(f"shard        {shard}   redis key {rkey}")
    out(f"size         {info.size} ({human(info.size)})")
    out(f"status       {info.status.value}")
    out(f"writer       {info.writer}")
    if info.put_started_ms is not None:  # only while the put is in progress
        out(f"put started  {iso(info.put_started_ms)} ({info.put_started_ms} ms)")
    out(f"store clock  {iso(now)} ({now} ms)")
    lease = deadline(info.lease_until_ms, now)
    if info.group_id and lease != "none":
        lease += " (the later of the object's and its group's lease)"
    out(f"lease        {lease}")
    pin = deadline(info.soft_pin_until_ms, now)
    if "soft_pin_action" in f:  # committed by the first put_end
        ttl = f" ttl {f['soft_pin_ttl']} ms" if "soft_pin_ttl" in f else ""
        pin += f" (the first put_end applies soft_pin_action {f['soft_pin_action']}{ttl})"
    out(f"soft pin     {pin}")
    out(f"guaranteed   {deadline(info.guaranteed_until_ms, now)}")
    out(f"hard pin     {'yes' if info.hard_pinned else 'no'}")
    out(f"group        {info.group_id if info.group_id is not None else 'none'}")
    dead = info.dead_replicas
    out(f"replicas     {len(info.replicas)} live" + (f", {len(dead)} dead" if dead else ""))
    for r in info.replicas:
        out(f"  {r.segment}  offset {r.offset}  size {r.size}  {r.status.value}")
    for r in dead:
        out(f"  {r.segment}  offset {r.offset}  dead (segment unmounted or remounted)")


def _is_utf8(b: bytes) -> bool:
    try:
        b.decode()
    except UnicodeDecodeError:
        return False
    return True


def _describe_first(master, candidates: list[bytes], tenant: str):
    """describe() of the first candidate key that exists; the first one's OBJECT_NOT_FOUND if none."""
    first: MasterError | None = None
    for bkey in candidates:
        try:
            return master.describe(bkey, tenant)
        except MasterError as exc:
            if exc.code != ErrorCode.OBJECT_NOT_FOUND:
                raise
            first = first or exc
    assert first is not None
    raise first


def _inspect_report(info, key: str, tenant: str, shard: int, rkey: str, now: int) -> dict:
    """inspect's documented JSON fields (docs/json.md)."""
    f = info.fields
    return {
        "key": key, "key_hex": info.key.hex(), "tenant": tenant, "found": True, "shard": shard, "redis_key": rkey,
        "size_bytes": info.size, "status": info.status.value, "writer": info.writer,
        "put_started_ms": info.put_started_ms, "now_ms": now,
        "lease_until_ms": info.lease_until_ms or None, "soft_pin_until_ms": info.soft_pin_until_ms or None,
        "guaranteed_until_ms": info.guaranteed_until_ms, "hard_pin": info.hard_pinned, "group": info.group_id,
        "replicas": [{"segment": r.segment, "offset": r.offset, "size_bytes": r.size, "status": r.status.value}
                     for r in info.replicas],
        "dead_replicas": [{"segment": r.segment, "offset": r.offset} for r in info.dead_replicas],
        "fields": dict(f),
    }



def _describe_or_exit(describe, what: str, ident: dict, as_json: bool):
    """describe(); OBJECT_NOT_FOUND prints "not found: <what>" (and, with --json, the ident
    fields with found false) and exits 1."""
    try:
        return describe()
    except MasterError as exc:
        if exc.code != ErrorCode.OBJECT_NOT_FOUND:
            raise
        click.echo(f"not found: {what}", err=True)
        if as_json:
            emit_json("inspect", {**ident, "found": False})
        raise click.exceptions.Exit(1) from None


def _inspect_group(opts: Opts, group: str, tenant: str, as_json: bool) -> None:
    master = open_existing(opts)
    try:
        info = _describe_or_exit(lambda: master.describe_group(group, tenant),
                                 f"group {group!r} (tenant {tenant!r}): no members and no active retention",
                                 {"group": group, "tenant": tenant}, as_json)
        now = master.now_ms()
    finally:
        master.close()
    report = group_report(info, master.ns, now)
    if as_json:
        emit_json("inspect", report)
        return
    for line in group_lines(report, deadline):
        click.echo(line)


def _inspect_node(opts: Opts, node: str, tenant: str, as_json: bool) -> None:
    master = open_existing(opts)
    try:
        info = _describe_or_exit(lambda: master.describe_radix_node(node, tenant),
                                 f"radix node {node!r} (tenant {tenant!r})", {"node": node, "tenant": tenant}, as_json)
    finally:
        master.close()
    report = node_report(info)
    if as_json:
        emit_json("inspect", report)
        return
    for line in node_lines(report):
        click.echo(line)

