-- expire_guaranteed: end at once the guarantees of a tenant's objects, by prefix hash.
-- KEYS: P.  ARGV: options tenant; fields prefix (a prefix hash, 1-256 bytes; a key that has no
--   prefix hash is its own prefix).
-- Reply: one {ended, left} per prefix: ended = objects whose active guarantee ended (each is an
--   ordinary object again at once: eviction may take it), left = keys of that prefix still
--   indexed because the call's budget ran out (call again for that prefix while left > 0).
-- Cost: O(keys of the prefix) through P:gpfx:<tenant>:<prefix>, never a scan; at most
--   EXPIRE_PER_CALL objects a call, shared by its prefixes in order.

local E, fail, valid_name, row_of = Base.E, Base.fail, Base.valid_name, Base.row_of
local register = Base.register
local obj_key, MAX_KEYS_PER_CALL = Object.obj_key, Object.MAX_KEYS_PER_CALL
local object_call, per_row, load_object = Object.object_call, Object.per_row, Object.load_object
local guarantee_prefix_key = Guarantee.guarantee_prefix_key
local end_guarantee = Units.end_guarantee

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
