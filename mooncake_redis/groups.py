"""Groups: retention (retain_groups), describe_group and the shards' retention counts.

A group's retention is a fixed, tenant-scoped deadline kept in the group's own record on the
group's shard (lua/lib/35_retention.lua): declared before or after members exist, moved only by
retain_groups, and while active the group's members rank in the fallback eviction tier. A group
id routes by keys.group_shard_of: SGLang's `sglang-hicache:<page key>` goes to its page's shard,
with the page's keys."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from . import wire
from .api import ApiBase
from .checks import _check_int, _check_tenant, _utf8
from .errors import ErrorCode, MasterError
from .keys import K

TIER_NAMES = {suffix.encode(): name.removeprefix("tier_") for name, suffix in K.items() if name.startswith("tier_")}

MAX_GROUP_ID = 256  # bytes, as for ReplicateConfig.group_id


@dataclass(frozen=True)
class GroupInfo:
    group_id: str
    tenant_id: str
    shard: int
    members: int      # its own and its radix-indexed members
    retained_until_ms: int | None   # None: no active retention
    lease_until_ms: int
    why: str          # "" evictable, what protects it ("processing", "hard_pin", "no_members", ...), or
    #                   "radix_nodes": every member is radix-indexed, its node its unit (docs/radix.md)
    tier: str         # the tier it ranks in ("ordinary", "soft", "retained", "soft_retained"), "" for none
    fields: dict[str, str] = field(repr=False, default_factory=dict)  # the group record as stored


@dataclass(frozen=True)
class ShardRetention:
    shard: int
    active: int       # records whose deadline is still ahead
    held: int         # records holding an admission slot (active, or expired and not yet swept)
    share: int        # this shard's share of max_retained_groups
    tenant_share: int  # and of max_retained_groups_per_tenant


def _group_bytes(group_id: Any) -> bytes | None:
    """The group id as sent, or None when it is not a valid one (1-256 bytes of text)."""
    if isinstance(group_id, str):
        try:
            b = _utf8(group_id, "group_id")
        except MasterError:
            return None
    elif isinstance(group_id, (bytes, bytearray)):
        b = bytes(group_id)
    else:
        return None
    return b if 1 <= len(b) <= MAX_GROUP_ID else None


class GroupsApi(ApiBase):
    def retain_groups(self, group_ids: Sequence[Any], ttl_ms: int, tenant_id: str = "default") -> list[int | ErrorCode]:
        """Retain each group until now + ttl_ms (store clock), or keep a later deadline it already
        has. Per group, in input order: the deadline in effect after the call (absolute ms), or
        INVALID_PARAMS (a bad group id) / RETENTION_LIMIT_EXCEEDED (admitting it would pass
        max_retained_groups or max_retained_groups_per_tenant: see docs/group-retention.md for the
        per-shard shares). Each group is admitted or refused on its own. A ttl_ms <= 0 or above
        max_group_retention raises MasterError(INVALID_PARAMS)."""
        _check_int(ttl_ms, "ttl_ms", 1, self.config.max_group_retention)
        _check_tenant(tenant_id)
        if isinstance(group_ids, (str, bytes, bytearray)) or not isinstance(group_ids, Sequence):
            raise MasterError(ErrorCode.INVALID_PARAMS, "group_ids must be a list of group ids")
        out: list[Any] = [ErrorCode.INVALID_PARAMS] * len(group_ids)
        todo = [(i, b) for i, b in enumerate(map(_group_bytes, group_ids)) if b is not None]
        head = wire.head(("group",), tenant=tenant_id, ttl_ms=ttl_ms)
        replies = self.transport.batch("mc_retain_groups", head, [(b,) for _, b in todo], [b for _, b in todo],
                                       route=self.transport.group_shard)
        for (i, _), reply in zip(todo, replies):
            out[i] = ErrorCode(reply) if reply < 0 else int(reply)
        return out

    def describe_group(self, group_id: Any, tenant_id: str = "default") -> GroupInfo:
        """The group as stored (members, active retention, shared lease, where it ranks); an
        inspection, not a read. OBJECT_NOT_FOUND when it has neither members nor an active
        retention."""
        _check_tenant(tenant_id)
        b = _group_bytes(group_id)
        if b is None:
            raise MasterError(ErrorCode.INVALID_PARAMS, "group_id must be a non-empty id of at most 256 bytes")
        shard = self.transport.group_shard(b)
        reply = self.transport.call("mc_describe_group", shard, *wire.options(tenant=tenant_id, group=b))
        if isinstance(reply, int):
            raise MasterError(ErrorCode(reply), f"describe_group {group_id!r}")
        members, retained, lease, flat, why, tier = reply
        f = {flat[i].decode(errors="replace"): flat[i + 1].decode(errors="replace") for i in range(0, len(flat), 2)}
        return GroupInfo(b.decode(errors="replace"), tenant_id, shard, int(members), int(retained) or None,
                         int(lease), why.decode(), TIER_NAMES.get(tier, ""), f)

    def retention_members(self) -> list[int]:
        """Per shard: the members (their own and radix-indexed) of its groups whose retention is
        active, read a page of 1,024 groups a call (mc_retention_members), so no call grows with
        the shard's share of max_retained_groups; a gauge, not a snapshot."""
        out = []
        for shard in range(self.shards):
            total, offset = 0, 0
            while offset >= 0:
                members, offset = (int(v) for v in self.transport.call("mc_retention_members", shard, offset))
                total += members
            out.append(total)
        return out

    def retention_usage(self) -> list[ShardRetention]:
        """Per shard: active retained groups, records holding a slot, and the shard's shares of
        the limits."""
        return [ShardRetention(i, *(int(v) for v in row))
                for i, row in enumerate(self.transport.each("mc_retention_usage"))]
