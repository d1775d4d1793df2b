-- expire_guaranteed: end at once the guarantees of a tenant's objects, by prefix hash.
-- KEYS: P.  ARGV: options tenant; fields prefix (a prefix hash, 1-256 bytes; a key that has no
--   prefix hash is its own prefix).
-- Reply: one {ended, left} per prefix: ended = objects whose active guarantee ended (each is an
--   ordinary object again at once: eviction may take it), left = keys of that prefix still
--   indexed because the call's budget ran out (call again for that prefix while left > 0).
-- Cost: O(keys of the prefix) through P:gpfx:<tenant>:<prefix>, never a scan; at most
--   EXPIRE_PER_CALL objects a call, shared by its prefixes in order.

local E, fail, valid_name, row_of = Base.E, Base.fail, Base.valid_name, Base.row_of
local register, S, int_arg, now_ms = Base.register, Base.S, Base.int_arg, Base.now_ms
local obj_key, MAX_KEYS_PER_CALL = Object.obj_key, Object.MAX_KEYS_PER_CALL
local object_call, per_row, load_object = Object.object_call, Object.per_row, Object.load_object
local replicas_of = Object.replicas_of
local guarantee_prefix_key, guarantee_room = Guarantee.guarantee_prefix_key, Guarantee.guarantee_room
local start_guarantee = Guarantee.start_guarantee
local end_guarantee, renew_guarantee, agg_key = Units.end_guarantee, Units.renew_guarantee, Units.agg_key
local group_unit, place_group, place_object = Units.group_unit, Units.place_group, Units.place_object
local being_evicted, sweep_guarantees = Units.being_evicted, Units.sweep_guarantees

local EXPIRE_PER_CALL = 128 -- about 2 ms of server time at 15 redis.calls a key
local EXPIRE_SPEC = { opts = { tenant = 'optional' }, fields = { prefix = 'required' }, max_rows = MAX_KEYS_PER_CALL }

local function expire_prefix(P, tenant, prefix, now, budget)
  local pkey = guarantee_prefix_key(P, tenant, prefix)
  local ended = 0
  local keys = budget > 0 and redis.call('SRANDMEMBER', pkey, budget) or {}
  for _, key in ipairs(keys) do
    local okey = obj_key(P, tenant, key)
    local o = load_object(okey)
    if o and o.guaranteed_until and (o.prefix or key) == prefix then -- (a stray entry never ends another's)
      if tonumber(o.guaranteed_until) > now then ended = ended + 1 end
      end_guarantee(P, tenant, key, okey, o, now)
    end
    redis.call('SREM', pkey, key) -- also a stale entry (object gone or no longer guaranteed)
  end
  return ended, #keys
end

local function expire_guaranteed(P, args)
  local call, err = object_call(args, EXPIRE_SPEC)
  if not call then return err end
  for r = 1, call.rows do
    if not valid_name(row_of(args, call, r).prefix, 256) then
      return fail(E.INVALID_PARAMS, 'a prefix hash must be 1-256 bytes')
    end
  end
  local budget = EXPIRE_PER_CALL
  return per_row(P, args, call, function(_, tenant, row, now)
    local ended, spent = expire_prefix(P, tenant, row.prefix, now, budget)
    budget = budget - spent
    return { ended, redis.call('SCARD', guarantee_prefix_key(P, tenant, row.prefix)) }
  end)
end

register('mc_expire_guaranteed', {}, expire_guaranteed)

-- guarantee_cached: guarantee objects that are already in the store (the pages of a marked
--   request first cached without a guarantee), as a guaranteed put would have.
-- KEYS: P.  ARGV: options ttl_ms (required, 1..max_guaranteed_ttl), tenant; fields key, prefix
--   (the key's prefix hash, computed by the caller with the store's extraction rule; an object
--   that already records one keeps it).
-- Reply: per key the guarantee's deadline after the call (absolute store-clock ms), or an error
--   code: OBJECT_NOT_FOUND (no such object, being evicted, or no live memory replica),
--   REPLICA_IS_NOT_READY (its put is in progress: its put_start decides), GUARANTEED_CAPACITY_EXCEEDED
--   (its live replicas' bytes would pass the shard's or the tenant's limit, as for put_start;
--   nothing written for it). An active guarantee is extended to max(current, now + ttl_ms)
--   without counting its bytes again; a new one counts its live replicas' bytes and takes the
--   object's unit (or its group's, or its radix node's) out of the eviction tiers until then.
-- Reads stay renew-only: this call is the one way, besides a guaranteed put, to start one.
-- Cost: at most MAX_KEYS_PER_CALL keys, about 15 redis.calls each; due guarantees are swept first
--   (at most GUARANTEE_SWEEP), so the limit counts only live ones.
local GUARANTEE_SWEEP = 64
local CACHED_SPEC = { opts = { tenant = 'optional', ttl_ms = 'required' }, fields = { key = 'required', prefix = 'required' },
  max_rows = MAX_KEYS_PER_CALL }

local function live_memory(P, o)
  local live = {}
  for _, r in ipairs(replicas_of(P, o)) do
    if r.live then live[#live + 1] = r end
  end
  return live
end

local function guarantee_one(P, tenant, key, prefix, until_ms, now, cfg)
  local okey = obj_key(P, tenant, key)
  local o = load_object(okey)
  if not o or being_evicted(P, tenant, o) then return E.OBJECT_NOT_FOUND end
  if o.status ~= 'complete' then return E.REPLICA_IS_NOT_READY end
  local cur = tonumber(o.guaranteed_until)
  if cur and cur > now then -- active: extend it, its bytes already count
    if until_ms > cur then renew_guarantee(P, tenant, key, okey, o, until_ms) end
    return math.max(cur, until_ms)
  end
  if cur then -- ran out, not swept yet: end it first
    end_guarantee(P, tenant, key, okey, o, now)
    o = load_object(okey)
  end
  local live = live_memory(P, o)
  if #live == 0 then return E.OBJECT_NOT_FOUND end
  local size = tonumber(o.size) or 0
  if not guarantee_room(P, tenant, size * #live, cfg) then return E.GUARANTEED_CAPACITY_EXCEEDED end
  prefix = o.prefix or prefix
  redis.call('HSET', okey, 'guaranteed_until', S(until_ms), 'prefix', prefix, 'special', '1')
  o.guaranteed_until, o.prefix, o.special = S(until_ms), prefix, '1'
  start_guarantee(P, tenant, key, prefix, until_ms, live, size)
  if o.group then
    redis.call('ZADD', agg_key(P, 'guarantee', group_unit(tenant, o.group)), S(until_ms), key)
    place_group(P, tenant, o.group, now)
  else
    place_object(P, tenant, key, o, now)
  end
  return until_ms
end

local function guarantee_cached(P, args, cfg)
  local call, err = object_call(args, CACHED_SPEC)
  if not call then return err end
  local ttl = int_arg(call.opts.ttl_ms, 1, cfg.max_guaranteed_ttl)
  if not ttl then
    return fail(E.INVALID_PARAMS, 'ttl_ms must be an integer in [1, max_guaranteed_ttl (' .. S(cfg.max_guaranteed_ttl) .. ')]')
  end
  for r = 1, call.rows do
    local row = row_of(args, call, r)
    if not valid_name(row.key, cfg.max_key_length) or not valid_name(row.prefix, 256) then
      return fail(E.INVALID_PARAMS, 'a key must be 1-max_key_length bytes and a prefix hash 1-256 bytes')
    end
  end
  sweep_guarantees(P, now_ms(P), GUARANTEE_SWEEP)
  return per_row(P, args, call, function(_, tenant, row, now)
    return guarantee_one(P, tenant, row.key, row.prefix, now + ttl, now, cfg)
  end)
end

register('mc_guarantee_cached', { 'max_guaranteed_ttl', 'guaranteed_capacity_ratio', 'guaranteed_tenant_ratio',
  'max_key_length' }, guarantee_cached)
