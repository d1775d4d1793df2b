-- The members of a composite unit. A group's keys are the set P:grpm:<tenant>:<group>; a radix
-- node's (schema 7) are fields of its record P:rnode:<tenant>:<hash>, one a key in the member
-- form (Object.member_of: '=' or '\' first, which no other field of the record has), with an
-- empty value: no key of its own, about 120 B a node less than a set. A node's set
-- P:rkeys:<tenant>:<hash> left by an older layout is read too, until mc_upgrade_objects has
-- moved its members into the record (lua/ops/upgrade.lua).

local grp_key, grp_members_key, radix_hash = Object.grp_key, Object.grp_members_key, Object.radix_hash
local CALL = Base.CALL
local byte_ -- (bound at the first call: Base.on_first_call)
Base.on_first_call(function() byte_ = string.byte end)

local EQ, BS = 61, 92 -- '=', '\'
-- The most fields of a node's record that are not members (lua/lib/32_radix.lua lists them).
local RECORD_FIELDS_MAX = 16

local function is_member_field(f)
  local b = byte_(f, 1)
  return b == EQ or b == BS
end

-- Add a member: 1 when it is new, 0 when it was one.
local function add_member(P, tenant, group, member)
  if radix_hash(group) then return redis.call('HSETNX', grp_key(P, tenant, group), member, '') end
  return redis.call('SADD', grp_members_key(P, tenant, group), member)
end

-- Remove `members` (a list): how many of them were members.
local function remove_members(P, tenant, group, members)
  if not radix_hash(group) then return redis.call('SREM', grp_members_key(P, tenant, group), unpack(members)) end
  local n = redis.call('HDEL', grp_key(P, tenant, group), unpack(members))
  if n < #members then
    CALL.legacy_members = true
    n = n + redis.call('SREM', grp_members_key(P, tenant, group), unpack(members))
  end
  return n
end

-- Up to `count` members, any of them; `total`: how many the unit's record counts (a node's set
-- of an older layout is read only when its record shows fewer). A node's come from an HSCAN
-- that matches members only: the record's own fields stay in the server (a listpack record,
-- the usual one, answers in one step).
local MEMBER_MATCH = '[=\\\\]*' -- (a glob: '=' or '\' first)
local function some_members(P, tenant, group, count, total)
  if not radix_hash(group) then return redis.call('SRANDMEMBER', grp_members_key(P, tenant, group), count) end
  local nkey, out, seen, cursor = grp_key(P, tenant, group), {}, nil, '0'
  repeat
    local step = redis.call('HSCAN', nkey, cursor, 'MATCH', MEMBER_MATCH, 'COUNT', count + RECORD_FIELDS_MAX)
    cursor = step[1]
    local found = step[2]
    for i = 1, #found, 2 do
      local m = found[i]
      if not (seen and seen[m]) then -- (a later step may return a field again; one step never does)
        out[#out + 1] = m
        if #out == count then return out end
      end
    end
    if cursor ~= '0' and not seen then
      seen = {}
      for i = 1, #out do seen[out[i]] = true end
    elseif seen then
      for i = 1, #found, 2 do seen[found[i]] = true end
    end
  until cursor == '0'
  if #out < total then -- (the call has read an older layout's set: Evict keeps its DEL)
    CALL.legacy_members = true
    for _, m in ipairs(redis.call('SRANDMEMBER', grp_members_key(P, tenant, group), count - #out)) do out[#out + 1] = m end
  end
  return out
end

-- Every member (the queries and fsck: a unit's own size).
local function all_members(P, tenant, group)
  if not radix_hash(group) then return redis.call('SMEMBERS', grp_members_key(P, tenant, group)) end
  local out = {}
  for _, f in ipairs(redis.call('HKEYS', grp_key(P, tenant, group))) do
    if is_member_field(f) then out[#out + 1] = f end
  end
  for _, m in ipairs(redis.call('SMEMBERS', grp_members_key(P, tenant, group))) do out[#out + 1] = m end
  return out
end

return {
  add_member = add_member, remove_members = remove_members,
  some_members = some_members, all_members = all_members,
}
