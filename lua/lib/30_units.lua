-- Eviction units and their candidate indexes. A unit is an ungrouped object ("o:<tenant>:<key>")
-- or a whole group ("g:<tenant>:<group>"). An evictable unit sits in exactly one tier:
--   P:evict:ordinary   zset unit -> lease_until   (evicted first)
--   P:evict:soft       zset unit -> lease_until   (active soft pin: only after ordinary, and only
--                                                  when allow_evict_soft_pinned_objects)
-- Scored by lease_until, so every leased unit (lease_until > now) sits above every unleased one
-- and an eviction step pops from the low end without ever walking over a leased unit.
-- A unit is not in any tier while protected: put in progress, hard-pinned, or referenced by a
-- replication/offload task (object field task_refs > 0); a group while any member is so.
-- (Protections of later kinds plug in here: place_object / place_group decide evictability.) Soft pins expire through the deadline index P:deadline:soft_pin
-- (unit -> soft_pin_until), which moves units from the soft tier to the ordinary one.
-- Group hash P:grp:<tenant>:<group>: members, processing, hard_pinned (member counts), task_refs
-- (sum of the members'),
-- lease_until (shared by all members), soft_pin_until (latest of the members'), draining (1 while
-- the group is being evicted).
-- A group is evicted over several steps so that no call grows with its size: the step that picks
-- it marks it draining and moves its unit to P:evict:draining (unit -> ms the drain began); each
-- later step drops up to its budget of members. A draining group's members are gone for readers
-- (OBJECT_NOT_FOUND), take no task references, and the group takes no new members
-- (NO_AVAILABLE_HANDLE) until the last member is dropped and the group retires.

local TIER_ORDINARY, TIER_SOFT, SOFT_DEADLINES = ':evict:ordinary', ':evict:soft', ':deadline:soft_pin'
local DRAINING = ':evict:draining'

local function object_unit(tenant, key) return 'o:' .. tenant .. ':' .. key end
local function group_unit(tenant, group) return 'g:' .. tenant .. ':' .. group end

local function unplace(P, unit)
  redis.call('ZREM', P .. TIER_ORDINARY, unit)
  redis.call('ZREM', P .. TIER_SOFT, unit)
  redis.call('ZREM', P .. SOFT_DEADLINES, unit)
  redis.call('ZREM', P .. DRAINING, unit)
end

-- Put a unit into the tier its state calls for, or take it out of the candidates.
local function place(P, unit, evictable, lease, soft_until, now)
  unplace(P, unit)
  if not evictable then return end
  if soft_until > now then
    redis.call('ZADD', P .. TIER_SOFT, lease, unit)
    redis.call('ZADD', P .. SOFT_DEADLINES, soft_until, unit)
  else
    redis.call('ZADD', P .. TIER_ORDINARY, lease, unit)
  end
end

local function object_protected(o)
  return o.status ~= 'complete' or o.hard_pin == '1' or (tonumber(o.task_refs) or 0) > 0
end

local function place_object(P, tenant, key, o, now)
  place(P, object_unit(tenant, key), not object_protected(o),
    tonumber(o.lease_until) or 0, tonumber(o.soft_pin_until) or 0, now)
end

local function group_state(P, tenant, group)
  local g = redis.call('HMGET', grp_key(P, tenant, group), 'members', 'processing', 'hard_pinned',
    'lease_until', 'soft_pin_until', 'task_refs', 'draining')
  local n = {}
  for i = 1, 7 do n[i] = tonumber(g[i]) or 0 end
  return { members = n[1], processing = n[2], hard_pinned = n[3], lease_until = n[4], soft_pin_until = n[5],
    task_refs = n[6], draining = n[7] == 1 }
end

local function group_draining(P, tenant, group)
  return redis.call('HGET', grp_key(P, tenant, group), 'draining') == '1'
end

-- An object whose group is being evicted is gone for every caller but the eviction itself.
local function being_evicted(P, tenant, o)
  return o.group ~= nil and group_draining(P, tenant, o.group)
end

local function group_protected(g)
  return g.members == 0 or g.processing > 0 or g.hard_pinned > 0 or g.task_refs > 0
end

local function place_group(P, tenant, group, now)
  local g = group_state(P, tenant, group)
  if g.draining then -- its unit stays in P:evict:draining until the last member is gone
    local unit = group_unit(tenant, group)
    redis.call('ZREM', P .. TIER_ORDINARY, unit)
    redis.call('ZREM', P .. TIER_SOFT, unit)
    redis.call('ZREM', P .. SOFT_DEADLINES, unit)
    redis.call('ZADD', P .. DRAINING, 'NX', S(now), unit)
    return
  end
  place(P, group_unit(tenant, group), not group_protected(g),
    g.lease_until, g.soft_pin_until, now)
end

-- Re-place the unit an object belongs to after its state changed.
local function place_unit_of(P, tenant, key, o, now)
  if o.group then place_group(P, tenant, o.group, now) else place_object(P, tenant, key, o, now) end
end

-- A read leases the object's unit: the object, or its whole group. Both tiers are re-scored
-- with XX (only a unit that is a candidate moves; protected units stay out): a unit whose soft
-- pin expired may still sit in the soft tier until the sweep moves it, and its score must stay
-- its lease.
local function extend_lease(P, tenant, key, okey, o, until_ms)
  local target, unit, cur = okey, object_unit(tenant, key), tonumber(o.lease_until) or 0
  if o.group then
    target, unit = grp_key(P, tenant, o.group), group_unit(tenant, o.group)
    cur = tonumber(redis.call('HGET', target, 'lease_until')) or 0
  end
  if until_ms <= cur then return cur end
  redis.call('HSET', target, 'lease_until', S(until_ms))
  redis.call('ZADD', P .. TIER_ORDINARY, 'XX', until_ms, unit)
  redis.call('ZADD', P .. TIER_SOFT, 'XX', until_ms, unit)
  return until_ms
end

local function join_group(P, tenant, key, group, hard_pin, now)
  if redis.call('SADD', grp_members_key(P, tenant, group), key) == 0 then return end
  local gkey = grp_key(P, tenant, group)
  redis.call('HINCRBY', gkey, 'members', 1)
  redis.call('HINCRBY', gkey, 'processing', 1)
  if hard_pin == '1' then redis.call('HINCRBY', gkey, 'hard_pinned', 1) end
  place_group(P, tenant, group, now)
end

-- A member's put ended: it counts as complete, its soft pin extends the group's, and, as for an
-- object at put_end, the group's lease becomes max(lease, now) (so an unread group ranks by
-- its last completion, like an object).
local function group_member_completed(P, tenant, group, soft_pin_until, now)
  local gkey = grp_key(P, tenant, group)
  redis.call('HINCRBY', gkey, 'processing', -1)
  local cur = redis.call('HMGET', gkey, 'soft_pin_until', 'lease_until')
  if tonumber(soft_pin_until) > (tonumber(cur[1]) or 0) then
    redis.call('HSET', gkey, 'soft_pin_until', soft_pin_until)
  end
  if now > (tonumber(cur[2]) or 0) then redis.call('HSET', gkey, 'lease_until', S(now)) end
  place_group(P, tenant, group, now)
end

-- The last member is gone: drop the group's unit and counters (a group record that carries
-- more than the counters, e.g. a retention declared ahead of members, stays).
local function retire_group(P, tenant, group)
  local gkey = grp_key(P, tenant, group)
  unplace(P, group_unit(tenant, group))
  redis.call('DEL', grp_members_key(P, tenant, group))
  redis.call('HDEL', gkey, 'members', 'processing', 'hard_pinned', 'lease_until', 'soft_pin_until', 'task_refs',
    'draining')
end

local function leave_group(P, tenant, key, o, now)
  local group = o.group
  if redis.call('SREM', grp_members_key(P, tenant, group), key) == 0 then return end
  local gkey = grp_key(P, tenant, group)
  if o.status ~= 'complete' then redis.call('HINCRBY', gkey, 'processing', -1) end
  if o.hard_pin == '1' then redis.call('HINCRBY', gkey, 'hard_pinned', -1) end
  local refs = tonumber(o.task_refs) or 0
  if refs > 0 then redis.call('HINCRBY', gkey, 'task_refs', -refs) end
  if redis.call('HINCRBY', gkey, 'members', -1) <= 0 then
    retire_group(P, tenant, group)
  else
    place_group(P, tenant, group, now)
  end
end

-- Free an object's replicas (or hold them until `hold_until`) and drop its hash and counters.
-- Returns the bytes its live replicas occupied.
local function drop_object(P, tenant, key, okey, o, hold_until)
  local bytes = 0
  local size = tonumber(o.size) or 0
  for _, r in ipairs(replicas_of(P, o)) do
    if r.live and r.off then
      if hold_until then
        hold_extent(P, r.seg, r.mount, r.off, size, hold_until)
        bytes = bytes + size
      elseif free_extent(P, r.seg, r.off, size) then
        bytes = bytes + size
      end
    end
  end
  if o.status ~= 'complete' then redis.call('ZREM', P .. ':processing', obj_id(tenant, key)) end
  redis.call('DEL', okey)
  redis.call('HINCRBY', P, 'objects', -1)
  return bytes
end

-- Delete an object and keep its unit's indexes right.
local function delete_object(P, tenant, key, okey, o, hold_until, now)
  drop_object(P, tenant, key, okey, o, hold_until)
  if o.group then leave_group(P, tenant, key, o, now) else unplace(P, object_unit(tenant, key)) end
end
