-- Eviction: pop candidates from the low end of the tiers, re-check protections, delete.

-- Move units whose soft pin has expired from the soft tier to the ordinary one (bounded).
local function expire_soft_pins(P, now, limit)
  local due = redis.call('ZRANGEBYSCORE', P .. SOFT_DEADLINES, '-inf', now, 'LIMIT', 0, limit)
  for _, unit in ipairs(due) do
    local lease = redis.call('ZSCORE', P .. TIER_SOFT, unit)
    if lease then
      redis.call('ZREM', P .. TIER_SOFT, unit)
      redis.call('ZADD', P .. TIER_ORDINARY, lease, unit)
    end
    redis.call('ZREM', P .. SOFT_DEADLINES, unit)
  end
end

-- The next unit to evict: a group whose eviction is under way first, then the least recently
-- leased unleased unit: ordinary tier first, then (if allowed) soft.
-- Returns the unit and the suffix of the index it was found in.
local function next_candidate(P, now, allow_soft)
  local d = redis.call('ZRANGE', P .. DRAINING, 0, 0)[1]
  if d then return d, DRAINING end
  local c = redis.call('ZRANGE', P .. TIER_ORDINARY, 0, 0, 'WITHSCORES')
  if c[1] and tonumber(c[2]) <= now then return c[1], TIER_ORDINARY end
  if allow_soft then
    c = redis.call('ZRANGE', P .. TIER_SOFT, 0, 0, 'WITHSCORES')
    if c[1] and tonumber(c[2]) <= now then return c[1], TIER_SOFT end
  end
  return nil
end

-- Take an evicted unit out of the tier it was popped from (cheaper than unplace: eviction is the
-- hot loop, and a unit sits in one tier only; only soft units have a deadline entry).
local function take(P, unit, tier)
  redis.call('ZREM', P .. tier, unit)
  if tier == TIER_SOFT then redis.call('ZREM', P .. SOFT_DEADLINES, unit) end
end

local function evict_object(P, tenant, key, now, tier)
  local okey = obj_key(P, tenant, key)
  local o = load_object(okey)
  if not o or o.group then -- gone, or a stray unit of a group member: its group is the unit
    unplace(P, object_unit(tenant, key))
    if o then place_group(P, tenant, o.group, now) end
    return 0, 0
  end
  if object_protected(o) or (tonumber(o.lease_until) or 0) > now then
    place_object(P, tenant, key, o, now) -- the index was stale: put the unit where it belongs
    return 0, 0
  end
  local bytes = drop_object(P, tenant, key, okey, o, nil)
  take(P, object_unit(tenant, key), tier)
  return 1, bytes
end

-- Evict a group: decide (re-checking its protections), mark it draining, then drop up to
-- `budget` members a call; the group retires with its last member.
-- Returns objects and bytes freed and the budget spent (at least 1).
local function evict_group(P, tenant, group, now, budget)
  local g = group_state(P, tenant, group)
  local unit, gkey, mkey = group_unit(tenant, group), grp_key(P, tenant, group), grp_members_key(P, tenant, group)
  if not g.draining then
    if group_protected(g) or g.lease_until > now then
      place_group(P, tenant, group, now)
      return 0, 0, 1
    end
    unplace(P, unit)
    redis.call('HSET', gkey, 'draining', '1')
    redis.call('ZADD', P .. DRAINING, S(now), unit)
  end
  local objects, bytes = 0, 0
  local keys = redis.call('SRANDMEMBER', mkey, budget)
  for _, key in ipairs(keys) do
    local okey = obj_key(P, tenant, key)
    local o = load_object(okey)
    if o then
      bytes = bytes + drop_object(P, tenant, key, okey, o, nil)
      objects = objects + 1
    end
    redis.call('SREM', mkey, key)
  end
  if redis.call('SCARD', mkey) == 0 then
    retire_group(P, tenant, group)
  elseif #keys > 0 then
    redis.call('HINCRBY', gkey, 'members', S(0 - #keys))
  end
  return objects, bytes, math.max(#keys, 1)
end

-- Evict one unit (popped from `tier`) if it is still evictable, spending at most `budget`
-- (members of a group); returns objects and bytes freed and the budget spent.
local function evict_unit(P, unit, tier, now, budget)
  local kind, tenant, name = string.match(unit, '^([og]):([^:]+):(.*)$')
  if kind == 'o' then
    local n, b = evict_object(P, tenant, name, now, tier)
    return n, b, 1
  end
  if kind == 'g' then return evict_group(P, tenant, name, now, budget or 1) end
  unplace(P, unit)
  return 0, 0, 1
end
