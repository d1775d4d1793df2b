-- Eviction: pop candidates from the low end of the tiers, re-check the rule, delete. An object
-- with a live disk replica is not deleted: its memory is freed and it stays readable from disk.
-- With offload_on_evict (cfg, as mc_evict reads it), an ungrouped object without one is queued for
-- offload instead (Offload.queue_on_evict, lua/lib/45_offload.lua) and freed when that ends; a
-- group (or radix node) is evicted outright, and so is everything a put_start evicts.

local tonumber_, match_, max_ -- (bound at the first call: Base.on_first_call)
Base.on_first_call(function() tonumber_, match_, max_ = tonumber, string.match, math.max end)
local S, CALL = Base.S, Base.CALL
local obj_key, RADIX_MARK, grp_key = Object.obj_key, Object.RADIX_MARK, Object.grp_key
local load_object, key_of = Object.load_object, Object.key_of
local some_members, remove_members = Members.some_members, Members.remove_members
local live_disk_replicas, shed_memory = Disk.live_disk_replicas, Disk.shed_memory
local DRAINING, TIERS, TIER_LEVEL = Units.DRAINING, Units.TIERS, Units.TIER_LEVEL
local TIER_ALLOW, object_unit, group_unit = Units.TIER_ALLOW, Units.object_unit, Units.group_unit
local unplace, unplace_object, unit_rule = Units.unplace, Units.unplace_object, Units.unit_rule
local object_facts, group_facts = Units.object_facts, Units.group_facts
local apply_rule, apply_composite, place_group = Units.apply_rule, Units.apply_composite, Units.place_group
local retire_group, drop_object, keep_lease = Units.retire_group, Units.drop_object, Units.keep_lease
local leave_indexed, flush_placed = Units.leave_indexed, Radix.flush_placed

-- May units of this tier be evicted under `cfg`? (A tier without a flag always may.)
-- A flag may be a list of flags, all of which must allow it.
local function tier_allowed(tier, cfg)
  local flag = TIER_ALLOW[tier]
  if type(flag) == 'table' then
    for _, f in ipairs(flag) do
      if cfg[f] ~= 1 then return false end
    end
    return true
  end
  return flag == nil or cfg[flag] == 1
end

-- The next unit to evict: a group whose eviction is under way first (unless the caller knows
-- that none is: `no_draining`), then the least recently leased unleased unit among the allowed
-- tiers of the first level (TIER_LEVEL) that has one. Returns the unit and its index.
-- A node placement the last eviction left pending (Radix.place_node) counts as its tier's
-- entry, first among equal scores; it is written unless it is the unit picked.
local function next_candidate(P, now, cfg, no_draining)
  local p = CALL.placed
  if not (p and p.pending) then p = nil end
  local d = not no_draining and redis.call('ZRANGE', P .. DRAINING, 0, 0)[1]
  if d then
    flush_placed(P)
    return d, DRAINING
  end
  local best, best_score, best_tier
  for _, tier in ipairs(TIERS) do
    if best and TIER_LEVEL[tier] ~= TIER_LEVEL[best_tier] then break end
    if tier_allowed(tier, cfg) then
      local c = redis.call('ZRANGE', P .. tier, 0, 0, 'WITHSCORES')
      local unit, score = c[1], tonumber_(c[2])
      if p and p.tier == tier and (not unit or p.score <= score) then unit, score = p.unit, p.score end
      if unit and score <= now and (not best or score < best_score) then
        best, best_score, best_tier = unit, score, tier
      end
    end
  end
  if p and best ~= p.unit then flush_placed(P) end
  return best, best_tier
end

-- Re-check at the moment of eviction: evictable now under the rule, unleased, in an allowed
-- tier. Otherwise the index was stale, and the unit is put where the rule says instead.
local function still_evictable(why, entries, lease_until, now, cfg)
  if why ~= '' or lease_until > now then return false end
  for _, tier in ipairs(TIERS) do
    if entries[tier] ~= nil then return tier_allowed(tier, cfg) end
  end
  return false
end

-- Returns objects and bytes freed, and the bytes queued for offload instead.
local function evict_object(P, tenant, key, now, cfg)
  local okey, unit = obj_key(P, tenant, key), object_unit(tenant, key)
  local o = load_object(okey)
  if not o or o.group then -- gone, or a stray unit of a group member: its group is the unit
    unplace(P, unit)
    if o then place_group(P, tenant, o.group, now) end
    return 0, 0
  end
  -- the candidate's tier score (at most now) is its lease, and the hash's is never above it
  local f = object_facts(o)
  local why, entries = unit_rule(f, now)
  if not still_evictable(why, entries, f.lease_until, now, cfg) then
    keep_lease(P, unit, okey, o)
    f.lease_until = tonumber_(o.lease_until) or 0
    _, entries = unit_rule(f, now)
    apply_rule(P, unit, entries, now)
    return 0, 0
  end
  unplace_object(P, unit, o)
  if f.has_disk and #live_disk_replicas(P, okey, o) > 0 then -- the disk replica keeps the object readable
    return 1, shed_memory(P, tenant, key, okey, o)
  end
  if cfg.offload_on_evict == 1 then -- its memory goes when the offload ends
    local queued = Offload.queue_on_evict(P, tenant, key, okey, o, now, cfg)
    if queued then return 0, 0, queued end
  end
  return 1, drop_object(P, tenant, key, okey, o, nil, 'evicted')
end

-- Evict a group: decide (re-checking the rule), mark it draining when it has more members than
-- the budget (a group dropped within one call needs no mark), then drop up to `budget` members a
-- call; the group retires with its last member. One read of budget + 1 members
-- (Members.some_members) tells both whether the group outlasts this call and which members go.
-- Returns objects and bytes freed, the budget spent (at least 1), nil (nothing queued for
-- offload) and whether the group is left draining.
local function evict_group(P, tenant, group, now, budget, cfg, noted)
  local unit, gkey = group_unit(tenant, group), grp_key(P, tenant, group)
  local f = noted and noted.unit == unit and noted.f or group_facts(P, tenant, group)
  if not f.draining then
    local why, entries = unit_rule(f, now)
    -- (both placements ignore the memo: the candidate may be an entry it does not list)
    if not still_evictable(why, entries, f.lease_until, now, cfg) then
      apply_composite(P, gkey, unit, entries, now, nil)
      return 0, 0, 1
    end
  end
  local keys = some_members(P, tenant, group, budget + 1, f.members or 0)
  local last = #keys <= budget -- every member goes in this call
  if not last then
    keys[#keys] = nil
    if not f.draining then -- evicted over several calls: mark it meanwhile
      redis.call('HSET', gkey, 'draining', '1')
      apply_composite(P, gkey, unit, { [DRAINING] = false }, now, nil)
    end
  end
  local objects, bytes = 0, 0
  for _, member in ipairs(keys) do
    local key = key_of(group, member)
    local okey = obj_key(P, tenant, key)
    local o = load_object(okey)
    if o and o.group ~= group then o = nil end -- not a member (a stale entry): only the entry goes
    if o and o.ugroup then leave_indexed(P, tenant, key, o.ugroup, o.node) end -- a grouped radix key
    if o and #live_disk_replicas(P, okey, o) > 0 then -- kept from disk, out of the group
      bytes = bytes + shed_memory(P, tenant, key, okey, o)
      redis.call('HDEL', okey, 'group', 'node', 'ugroup') -- (a radix node's key leaves it the same way)
      objects = objects + 1
    elseif o then
      bytes = bytes + drop_object(P, tenant, key, okey, o, nil, 'evicted')
      objects = objects + 1
    end
  end
  if last then -- (retire_group drops a group's set, a node's record or its members)
    f.no_legacy_set = not CALL.legacy_members -- (every member was a field of the record)
    retire_group(P, tenant, group, now, f, keys)
  else
    remove_members(P, tenant, group, keys)
    redis.call('HINCRBY', gkey, 'members', S(0 - #keys))
  end
  return objects, bytes, max_(#keys, 1), nil, not last
end

-- Evict one unit if it is still evictable, spending at most `budget` (members of a group);
-- returns objects and bytes freed, the budget spent, the bytes queued for offload instead
-- (an object: see evict_object), and whether a group is left draining.
-- The node whose last child the eviction before this one unlinked, placed as that eviction's
-- last step (Radix's note, CALL.placed), lends its facts to this one when it is the same unit:
-- only next_candidate and allocations, which write no unit's state, run between two evictions
-- of a call. (A note of the unit just evicted is dropped: its eviction wrote on after it.)
local function evict_one(P, unit, now, budget, cfg, noted)
  local kind, tenant, name = match_(unit, '^([ogr]):([^:]+):(.*)$')
  if kind == 'o' then
    local n, b, queued = evict_object(P, tenant, name, now, cfg)
    return n, b, 1, queued
  end
  if kind == 'g' then return evict_group(P, tenant, name, now, budget, cfg, noted) end
  if kind == 'r' then return evict_group(P, tenant, RADIX_MARK .. name, now, budget, cfg, noted) end -- a radix node's keys
  unplace(P, unit)
  return 0, 0, 1
end

-- `defer`: mc_evict's loop, which picks every unit through next_candidate (see Radix.place_node).
local function evict_unit(P, unit, now, budget, cfg, defer)
  local noted = CALL.placed
  CALL.placed, CALL.noting = nil, defer and 'defer' or true
  local n, b, spent, queued, drains = evict_one(P, unit, now, budget, cfg, noted)
  CALL.noting = nil
  if CALL.placed and CALL.placed.unit == unit then CALL.placed = nil end
  return n, b, spent, queued, drains
end

return {
  next_candidate = next_candidate, evict_unit = evict_unit,
}
