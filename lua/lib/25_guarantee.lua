-- Explicit context caching: an object's guarantee. An object whose hash has the field
-- guaranteed_until (ms) is guaranteed until then: no eviction path takes it, or the unit it
-- belongs to, before that moment (unit_rule in 30_units.lua). While the field is present:
--   its live replicas' bytes are counted in P.guaranteed_bytes, in P:gtenants (tenant -> bytes)
--   and in its segment's hash (P:seg:<seg> field g:<tenant>), so that an unmount takes the
--   segment's share off the books at once (drop_segment);
--   P:guaranteed (zset "<tenant>:<key>" -> guaranteed_until) lists it for the expiry sweep;
--   P:gpfx:<tenant>:<prefix> (set of keys) lists it under its prefix hash (the object's `prefix`
--   field, or the key itself when it has none) for expire_guaranteed.
-- The field, the counts and the entries go together, when the guarantee ends (the sweep after
-- the deadline, expire_guaranteed) or the object goes (remove, revoke, discard, eviction of an
-- object whose guarantee ran out, the sweep of dead replicas). Until the sweep has processed a
-- due guarantee, its bytes still count, but it protects nothing (unit_rule compares with now).

local tonumber_, floor_ -- (bound at the first call: Base.on_first_call)
Base.on_first_call(function() tonumber_, floor_ = tonumber, math.floor end)
local K, S = Base.K, Base.S
local obj_id = Object.obj_id

local function guarantee_prefix_key(P, tenant, prefix) return P .. K.guarantee_prefix .. tenant .. ':' .. prefix end

local function count_guaranteed(P, tenant, seg, delta)
  redis.call('HINCRBY', P, 'guaranteed_bytes', S(delta))
  redis.call('HINCRBY', P .. K.guaranteed_tenants, tenant, S(delta))
  redis.call('HINCRBY', P .. K.segment .. seg, 'g:' .. tenant, S(delta))
end

-- May `bytes` more be guaranteed on this shard, by this tenant? The shard's limit is
-- guaranteed_capacity_ratio of its capacity; a tenant's, guaranteed_tenant_ratio of that.
local function guarantee_room(P, tenant, bytes, cfg)
  local row = redis.call('HMGET', P, 'capacity_bytes', 'guaranteed_bytes')
  local limit = floor_((tonumber_(row[1]) or 0) * cfg.guaranteed_capacity_ratio)
  if (tonumber_(row[2]) or 0) + bytes > limit then return false end
  local mine = tonumber_(redis.call('HGET', P .. K.guaranteed_tenants, tenant)) or 0
  return mine + bytes <= floor_(limit * cfg.guaranteed_tenant_ratio)
end

-- Count and index the guarantee of an object just written with the field (all replicas live).
local function start_guarantee(P, tenant, key, prefix, until_ms, replicas, size)
  for _, r in ipairs(replicas) do count_guaranteed(P, tenant, r.seg, size) end
  redis.call('ZADD', P .. K.guaranteed, S(until_ms), obj_id(tenant, key))
  redis.call('SADD', guarantee_prefix_key(P, tenant, prefix or key), key)
end

-- Take an object's guarantee off the books and out of its indexes (`replicas`: replicas_of(o));
-- the caller removes the field or the whole object.
local function forget_guarantee(P, tenant, key, o, replicas)
  local size = tonumber_(o.size) or 0
  for _, r in ipairs(replicas) do
    if r.live then count_guaranteed(P, tenant, r.seg, 0 - size) end
  end
  redis.call('ZREM', P .. K.guaranteed, obj_id(tenant, key))
  redis.call('SREM', guarantee_prefix_key(P, tenant, o.prefix or key), key)
end

return {
  guarantee_prefix_key = guarantee_prefix_key, guarantee_room = guarantee_room, count_guaranteed = count_guaranteed,
  start_guarantee = start_guarantee, forget_guarantee = forget_guarantee,
}
