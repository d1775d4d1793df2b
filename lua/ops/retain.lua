-- Group retention (lua/lib/35_retention.lua holds the record, its index and its sweep).
--
-- retain_groups. KEYS: P. ARGV: options ttl_ms (required, 1..max_group_retention), tenant;
--   fields group; rows: group ids (1-256 bytes) of this shard.
--   Per group, in order: the retention deadline in effect after the call (absolute store-clock
--   ms), or an error code: INVALID_PARAMS for a bad group id, RETENTION_LIMIT_EXCEEDED when
--   admitting a group without a record would pass this shard's share of max_retained_groups or
--   of max_retained_groups_per_tenant. A new record gets now + ttl_ms; an existing one
--   max(its deadline, now + ttl_ms) and is never counted twice. A bad ttl_ms (or any malformed
--   call) is a whole-call INVALID_PARAMS with nothing written. Due records are swept first, so
--   the slots of expired retentions are free for the call.
-- describe_group. KEYS: P. ARGV: options group (required), tenant. No writes.
--   Reply: OBJECT_NOT_FOUND (-704) when the group has no member and no active retention, else
--   {members, retained_until (0: none active), lease_until, {flat HGETALL of the group
--   record}, why (as mc_unit_state: "" evictable, a protection, "no_members", "draining";
--   "radix_nodes" when every member is radix-indexed, its node its unit; members counts those too),
--   tier (the index suffix of the tier it ranks in, "" for none)}.
-- retention_usage. KEYS: P. No writes. Reply: {active records (deadline > now), records
--   holding a slot (until swept), this shard's share of max_retained_groups, of
--   max_retained_groups_per_tenant}.
-- fsck_retention. KEYS: P. ARGV: tenant, group. Re-derives the group's P:deadline:retention
--   entry from its record (retained_until, or no entry). Reply: 1 entry written, 0 removed.
-- fsck_retention_counts. KEYS: P. ARGV: (tenant, expected, value) triples (at most 16).
--   Compare-and-set of P:retained_tenants: each tenant's count (missing = 0) is set to value
--   (0 deletes it) only if it still equals expected. Reply: per triple {applied (1|0), count}.

local E, fail, S, MAX_INT, int_arg = Base.E, Base.fail, Base.S, Base.MAX_INT, Base.int_arg
local now_ms, shard_share, valid_tenant = Base.now_ms, Base.shard_share, Base.valid_tenant
local valid_name, register = Base.valid_name, Base.register
local grp_key, MAX_KEYS_PER_CALL = Object.grp_key, Object.MAX_KEYS_PER_CALL
local obj_key, RADIX_MARK = Object.obj_key, Object.RADIX_MARK
local agg_key, MAX_GROUP_NODES = Units.agg_key, Units.MAX_GROUP_NODES
local object_call, node_of = Object.object_call, Object.node_of
local TIERS, group_unit, place_group = Units.TIERS, Units.group_unit, Units.place_group
local unit_state, place_group_nodes, indexed_members = Units.unit_state, Units.place_group_nodes, Units.indexed_members
local RETENTION_INDEX, RETAINED_TENANTS = Retention.RETENTION_INDEX, Retention.RETAINED_TENANTS
local group_has_members, sweep_retention = Retention.group_has_members, Retention.sweep_retention

local RETAIN_SPEC = { opts = { tenant = 'optional', ttl_ms = 'required' }, fields = { group = 'required' },
  max_rows = MAX_KEYS_PER_CALL }
local DESCRIBE_GROUP_SPEC = { opts = { tenant = 'optional', group = 'required' } }
local MAX_GROUP_ID = 256

local function retain_one(P, tenant, group, until_wanted, now, limits)
  if not valid_name(group, MAX_GROUP_ID) or string.byte(group, 1) == 0 then return E.INVALID_PARAMS end -- NUL: radix nodes' names
  local unit, gkey, tenants = group_unit(tenant, group), grp_key(P, tenant, group), P .. RETAINED_TENANTS
  if not redis.call('ZSCORE', P .. RETENTION_INDEX, unit) then
    if redis.call('ZCARD', P .. RETENTION_INDEX) >= limits.shard
      or (tonumber(redis.call('HGET', tenants, tenant)) or 0) >= limits.tenant then
      return E.RETENTION_LIMIT_EXCEEDED
    end
    redis.call('HINCRBY', tenants, tenant, 1)
  end
  local cur = tonumber(redis.call('HGET', gkey, 'retained_until')) or 0
  local until_ms = math.max(cur, until_wanted)
  if until_ms ~= cur then redis.call('HSET', gkey, 'retained_until', S(until_ms)) end
  redis.call('ZADD', P .. RETENTION_INDEX, S(until_ms), unit)
  if cur <= now then
    if group_has_members(P, tenant, group) then place_group(P, tenant, group, now) end
    place_group_nodes(P, tenant, group, now) -- its radix-indexed keys' nodes rank as retained too
  end
  return until_ms
end

local function retain_groups(P, args, cfg)
  local call, err = object_call(args, RETAIN_SPEC)
  if not call then return err end
  local ttl = int_arg(call.opts.ttl_ms, 1, cfg.max_group_retention)
  if not ttl then
    return fail(E.INVALID_PARAMS,
      'ttl_ms must be an integer in [1, ' .. S(cfg.max_group_retention) .. '] (max_group_retention)')
  end
  local now = now_ms(P)
  sweep_retention(P, now, call.rows + 16)
  local limits = { shard = shard_share(P, cfg.max_retained_groups, cfg.shards),
    tenant = shard_share(P, cfg.max_retained_groups_per_tenant, cfg.shards) }
  local reply = {}
  for r = 1, call.rows do
    reply[r] = retain_one(P, call.tenant, args[call.first + r - 1], now + ttl, now, limits)
  end
  return reply
end

local function describe_group(P, args)
  local call, err = object_call(args, DESCRIBE_GROUP_SPEC)
  if not call then return err end
  local tenant, group = call.tenant, call.opts.group
  if not valid_name(group, MAX_GROUP_ID) then return fail(E.INVALID_PARAMS, 'group must be 1-256 bytes') end
  local now = now_ms(P)
  local gkey = grp_key(P, tenant, group)
  local row = redis.call('HMGET', gkey, 'members', 'retained_until', 'lease_until')
  local own, retained = tonumber(row[1]) or 0, tonumber(row[2]) or 0
  local members = own + indexed_members(P, tenant, group)
  if retained <= now then retained = 0 end
  if members <= 0 and retained == 0 then return E.OBJECT_NOT_FOUND end
  local why, entries = unit_state(P, group_unit(tenant, group), now)
  if own <= 0 and members > 0 then why = 'radix_nodes' end -- every member's unit is its radix node
  local tier = ''
  for _, t in ipairs(TIERS) do
    if entries[t] ~= nil then tier = t end
  end
  return { members, retained, tonumber(row[3]) or 0, redis.call('HGETALL', gkey), why, tier }
end

local function retention_usage(P, args, cfg)
  local index = P .. RETENTION_INDEX
  return { redis.call('ZCOUNT', index, '(' .. S(now_ms(P)), '+inf'), redis.call('ZCARD', index),
    shard_share(P, cfg.max_retained_groups, cfg.shards),
    shard_share(P, cfg.max_retained_groups_per_tenant, cfg.shards) }
end

-- retention_members. KEYS: P. ARGV: offset (>= 0). No writes. The members (own and
--   radix-indexed) of up to MEMBERS_PAGE active retained groups, from the offset-th active record
--   in deadline order. Reply: {members, next offset, or -1 when no record is left}.
local MEMBERS_PAGE = 1024

local function retention_members(P, args)
  local offset = int_arg(args[1] or '', 0, MAX_INT)
  if #args ~= 1 or not offset then return fail(E.INVALID_PARAMS, 'expected offset >= 0') end
  local units = redis.call('ZRANGEBYSCORE', P .. RETENTION_INDEX, '(' .. S(now_ms(P)), '+inf', 'LIMIT', offset,
    MEMBERS_PAGE)
  local members = 0
  for _, unit in ipairs(units) do
    local tenant, group = string.match(unit, '^g:([^:]+):(.+)$')
    if tenant then
      members = members + (tonumber(redis.call('HGET', grp_key(P, tenant, group), 'members')) or 0)
        + indexed_members(P, tenant, group)
    end
  end
  return { members, #units < MEMBERS_PAGE and -1 or offset + #units }
end

local function fsck_retention(P, args)
  local tenant, group = args[1], args[2]
  if #args ~= 2 or not valid_tenant(tenant) or not valid_name(group, MAX_GROUP_ID) then
    return fail(E.INVALID_PARAMS, 'expected tenant, group')
  end
  local unit = group_unit(tenant, group)
  local rec = int_arg(redis.call('HGET', grp_key(P, tenant, group), 'retained_until'), 1, MAX_INT)
  if rec then
    redis.call('ZADD', P .. RETENTION_INDEX, S(rec), unit)
    return 1
  end
  redis.call('ZREM', P .. RETENTION_INDEX, unit)
  return 0
end

local function fsck_retention_counts(P, args)
  if #args == 0 or #args % 3 ~= 0 or #args > 48 then
    return fail(E.INVALID_PARAMS, 'expected 1-16 tenant, expected, value triples')
  end
  for i = 1, #args, 3 do
    if not valid_tenant(args[i]) or not int_arg(args[i + 1], 0, MAX_INT) or not int_arg(args[i + 2], 0, MAX_INT) then
      return fail(E.INVALID_PARAMS, 'expected tenant, expected (>= 0), value (>= 0)')
    end
  end
  local key, reply = P .. RETAINED_TENANTS, {}
  for i = 1, #args, 3 do
    local cur = tonumber(redis.call('HGET', key, args[i])) or 0
    if cur == tonumber(args[i + 1]) then
      if args[i + 2] == '0' then redis.call('HDEL', key, args[i]) else redis.call('HSET', key, args[i], args[i + 2]) end
      reply[#reply + 1] = { 1, tonumber(args[i + 2]) }
    else
      reply[#reply + 1] = { 0, cur }
    end
  end
  return reply
end

-- fsck_indexed. KEYS: P. ARGV: tenant, group, n, key x n, node...: re-derives the group's
--   radix-indexed membership (30_units.lua) from the objects of the given keys and of its
--   current P:agg:indexed entries: P:agg:indexed and P:agg:nodes of the group, and the group's
--   entry in P:agg:groups of every node named (given, or in P:agg:nodes; a node with keys of the
--   group gets its record's grouped = 1), then re-places those nodes. At most FSCK_INDEXED_MAX keys and MAX_GROUP_NODES + 64 nodes in all.
--   Reply: {indexed members, nodes}.
local FSCK_INDEXED_MAX = 4096

local function fsck_indexed(P, args)
  local tenant, group, n = args[1], args[2], int_arg(args[3] or '', 0, FSCK_INDEXED_MAX)
  if not n or #args < 3 + n or not valid_tenant(tenant) or not valid_name(group, MAX_GROUP_ID) then
    return fail(E.INVALID_PARAMS, 'expected tenant, group, n, n keys, nodes')
  end
  local uunit = 'g:' .. tenant .. ':' .. group
  local ikey, nkey = agg_key(P, 'indexed', uunit), agg_key(P, 'nodes', uunit)
  if redis.call('ZCARD', ikey) + n > FSCK_INDEXED_MAX or redis.call('ZCARD', nkey) + #args - 3 - n > MAX_GROUP_NODES + 64 then
    return fail(E.INVALID_PARAMS, 'too many keys or nodes')
  end
  local seen, cand, nodes, node_list = {}, {}, {}, {}
  local function node(h) if not nodes[h] then nodes[h] = 0; node_list[#node_list + 1] = h end end
  for _, k in ipairs(redis.call('ZRANGE', ikey, 0, -1)) do seen[k] = true; cand[#cand + 1] = k end
  for i = 4, 3 + n do if not seen[args[i]] then seen[args[i]] = true; cand[#cand + 1] = args[i] end end
  for _, h in ipairs(redis.call('ZRANGE', nkey, 0, -1)) do node(h) end
  for i = 4 + n, #args do node(args[i]) end
  redis.call('DEL', ikey, nkey)
  local members = 0
  for _, k in ipairs(cand) do
    local o = redis.call('HMGET', obj_key(P, tenant, k), 'ugroup', 'node')
    o[2] = o[2] and node_of(k, o[2])
    if o[1] == group and o[2] then
      redis.call('ZADD', ikey, 0, k)
      node(o[2])
      nodes[o[2]] = nodes[o[2]] + 1
      members = members + 1
    end
  end
  local now = now_ms(P)
  for _, h in ipairs(node_list) do
    local gk = agg_key(P, 'groups', 'r:' .. tenant .. ':' .. h)
    if nodes[h] > 0 then
      redis.call('ZADD', nkey, nodes[h], h)
      redis.call('ZADD', gk, nodes[h], group)
      redis.call('HSET', grp_key(P, tenant, RADIX_MARK .. h), 'grouped', '1')
    else
      redis.call('ZREM', gk, group)
    end
    if redis.call('EXISTS', grp_key(P, tenant, RADIX_MARK .. h)) == 1 then place_group(P, tenant, RADIX_MARK .. h, now) end
  end
  return { members, #node_list }
end

register('mc_retain_groups', { 'max_group_retention', 'max_retained_groups', 'max_retained_groups_per_tenant' },
  retain_groups)
register('mc_describe_group', {}, describe_group, { 'no-writes' })
register('mc_retention_usage', { 'max_retained_groups', 'max_retained_groups_per_tenant' }, retention_usage,
  { 'no-writes' })
register('mc_retention_members', {}, retention_members, { 'no-writes' })
register('mc_fsck_retention', {}, fsck_retention)
register('mc_fsck_retention_counts', {}, fsck_retention_counts)
register('mc_fsck_indexed', {}, fsck_indexed)
