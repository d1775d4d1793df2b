-- upgrade_objects: rewrite objects of an older layout in this library's (Master.connect runs it
-- over every object of a store whose schema_version is older; mooncake_redis/upgrade.py).
--   Layout 1 -> 7: the replica fields rep:<segment> become the one field reps; layout 2 -> 7: an
--   object that needs the read mark (special, lua/lib/20_object.lua) gets it; layout 3 -> 7: a
--   complete object's status "complete" goes (a complete object has none); layouts 4 to 6 -> 7:
--   see relisted, renamed_node and folded below. An object already in layout 7, or gone, is left alone.
--   Objects of older layouts stay readable meanwhile (load_object reads both replica layouts and
--   both ways of saying complete, and a node field as the hash itself; an object without reps
--   takes the general read).
-- KEYS: P. ARGV: object ids "<tenant>:<key>" (at most MAX_KEYS_PER_CALL).
-- Reply: the number of objects rewritten.

local K, E, fail, register = Base.K, Base.E, Base.fail, Base.register
local load_object, decode_reps, write_reps = Object.load_object, Object.decode_reps, Object.write_reps
local needs_read_mark, grp_members_key = Object.needs_read_mark, Object.grp_members_key
local member_of, node_field, node_of, grp_key = Object.member_of, Object.node_field, Object.node_of, Object.grp_key
local MAX_KEYS_PER_CALL = Object.MAX_KEYS_PER_CALL

-- Layout 5 -> 6: a radix key's `node` field, the hash as it is, says where the hash sits in the
-- key (Object.node_field). A field already in that form (written by this library while the
-- upgrade runs) reads back as itself. Whether it was rewritten.
local function renamed_node(okey, key)
  local raw = redis.call('HGET', okey, 'node')
  if not raw or node_field(key, node_of(key, raw)) == raw then return false end
  redis.call('HSET', okey, 'node', node_field(key, raw))
  return true
end

-- Layout 4 -> 5: a radix node's key listed as it is goes into the member form (Object.member_of),
-- unless the two are the same: the set shrinks, and no old entry is read as another key (one that
-- starts with '=' or '\'). Whether it was relisted.
local function relisted(P, tenant, key, group)
  if member_of(group, key) == key then return false end
  local mkey = grp_members_key(P, tenant, group)
  if redis.call('SREM', mkey, key) == 0 then return false end
  redis.call('SADD', mkey, member_of(group, key))
  return true
end

-- Layout 6 -> 7: a radix node's members are fields of its record (lua/lib/22_members.lua): the
-- key's member leaves the node's set (which goes with its last) for the record. Whether it moved.
local function folded(P, tenant, key, group)
  local member = member_of(group, key)
  if redis.call('SREM', grp_members_key(P, tenant, group), member) == 0 then return false end
  redis.call('HSET', grp_key(P, tenant, group), member, '')
  return true
end

local function upgrade_objects(P, args)
  if #args > MAX_KEYS_PER_CALL then return fail(E.INVALID_PARAMS, 'at most ' .. MAX_KEYS_PER_CALL .. ' ids a call') end
  local done = 0
  for _, id in ipairs(args) do
    local okey = P .. K.object .. id
    local o = load_object(okey)
    local changed = false
    if o and o.legacy_reps then
      write_reps(okey, o, decode_reps(o.reps) or {})
      changed = true
    elseif o and not o.special and needs_read_mark(o) then
      redis.call('HSET', okey, 'special', '1')
      changed = true
    end
    if o and o.status == 'complete' and redis.call('HDEL', okey, 'status') == 1 then changed = true end
    if o and o.node then
      local colon = string.find(id, ':', 1, true)
      local tenant, key = string.sub(id, 1, colon - 1), string.sub(id, colon + 1)
      if relisted(P, tenant, key, o.group) then changed = true end
      if renamed_node(okey, key) then changed = true end
      if folded(P, tenant, key, o.group) then changed = true end
    end
    if changed then done = done + 1 end
  end
  return done
end

register('mc_upgrade_objects', {}, upgrade_objects)
