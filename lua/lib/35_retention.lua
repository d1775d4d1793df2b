-- Group retention: a fixed, tenant-scoped deadline per group, declared before or after members
-- exist (lua/ops/retain.lua: mc_retain_groups).
--
-- The record is the field retained_until (absolute store-clock ms) of P:grp:<tenant>:<group>:
-- written by retain_groups only, never copied into members, moved by nothing else (reads,
-- leases, put_end, soft pins). It may exist with no member (retire_group keeps it). While it is
-- > now the group's unit ranks in the fallback tiers (unit_rule). Every record sits in
--   P:deadline:retention   unit "g:<tenant>:<group>" -> retained_until
-- and is counted in
--   P:retained_tenants     hash tenant -> records of that tenant on this shard
-- until sweep_retention drops it after its deadline (freeing its slot): the index's ZCARD and
-- the tenant's count are what admission checks against this shard's share of the limits.
-- A group's radix-indexed keys (30_units.lua) have their nodes as units: a node ranks as retained
-- while a group of its keys is, so a retention that starts or ends re-places those nodes.

local K, S, valid_tenant = Base.K, Base.S, Base.valid_tenant
local grp_key = Object.grp_key
local group_unit, place_group, place_group_nodes = Units.group_unit, Units.place_group, Units.place_group_nodes

local RETENTION_INDEX, RETAINED_TENANTS = K.deadline_retention, K.retained_tenants

local function group_has_members(P, tenant, group)
  return (tonumber(redis.call('HGET', grp_key(P, tenant, group), 'members')) or 0) > 0
end

-- Drop a group's retention record (index entry, tenant count, field); its unit, if it has
-- members, becomes what the rule says without the retention.
local function drop_retention(P, tenant, group, now)
  if redis.call('ZREM', P .. RETENTION_INDEX, group_unit(tenant, group)) == 1 then
    if redis.call('HINCRBY', P .. RETAINED_TENANTS, tenant, -1) <= 0 then
      redis.call('HDEL', P .. RETAINED_TENANTS, tenant)
    end
  end
  redis.call('HDEL', grp_key(P, tenant, group), 'retained_until') -- the last field: the key goes
  if group_has_members(P, tenant, group) then place_group(P, tenant, group, now) end
  place_group_nodes(P, tenant, group, now) -- the nodes of its radix-indexed keys
end

-- Bounded sweep of due retention records (re-checked against the record: an entry whose record
-- says later is re-scored, not dropped).
local function sweep_retention(P, now, limit)
  local index = P .. RETENTION_INDEX
  for _, unit in ipairs(redis.call('ZRANGEBYSCORE', index, '-inf', S(now), 'LIMIT', 0, limit)) do
    local tenant, group = string.match(unit, '^g:([^:]+):(.+)$')
    local rec = tenant and tonumber(redis.call('HGET', grp_key(P, tenant, group), 'retained_until'))
    if rec and rec > now then
      redis.call('ZADD', index, S(rec), unit)
    elseif tenant then
      drop_retention(P, tenant, group, now)
    else
      redis.call('ZREM', index, unit)
    end
  end
end

-- For the audit (mc_unit_state): a group unit's retention index entry, expected (from the
-- record) and actual, appended to the reply's lists.
local function retention_state(P, unit, expected, actual, deadlines)
  local tenant, group = string.match(unit, '^g:([^:]+):(.+)$')
  if not tenant or not valid_tenant(tenant) then return end
  deadlines[#deadlines + 1] = RETENTION_INDEX
  local rec = redis.call('HGET', grp_key(P, tenant, group), 'retained_until')
  if rec then
    expected[#expected + 1] = RETENTION_INDEX
    expected[#expected + 1] = rec
  end
  local have = redis.call('ZSCORE', P .. RETENTION_INDEX, unit)
  if have then
    actual[#actual + 1] = RETENTION_INDEX
    actual[#actual + 1] = have
  end
end

return {
  RETENTION_INDEX = RETENTION_INDEX, RETAINED_TENANTS = RETAINED_TENANTS,
  group_has_members = group_has_members, sweep_retention = sweep_retention,
  retention_state = retention_state,
}
