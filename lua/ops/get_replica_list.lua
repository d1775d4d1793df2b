-- get_replica_list / exist_key: reads. Only complete objects with a live replica are readable;
-- a successful read leases the object (or its group) until now + default_kv_lease_ttl.
-- KEYS: P.  ARGV: options tenant, and for get_replica_list guaranteed_ttl_ms (0 -
--   max_guaranteed_ttl, default 0: renew-only, an object whose guarantee is active gets
--   guaranteed_until = max(guaranteed_until, now + guaranteed_ttl_ms); any other is unchanged);
--   fields key.
-- get_replica_list reply, per key: {lease_ttl_ms, size, segment, offset, segment, offset, ...}
--   or an error code.   exist_key reply, per key: 1 or 0.

-- Returns the live replicas, or nil and an error code; leases the object on success.
local function read_one(P, tenant, key, now, lease_ttl, guarantee_ttl, mount_cache, rescore)
  local okey = obj_key(P, tenant, key)
  local o = load_object(okey)
  if not o or being_evicted(P, tenant, o) then return nil, E.OBJECT_NOT_FOUND end
  if o.status ~= 'complete' then return nil, E.REPLICA_IS_NOT_READY end
  local live = live_replicas(P, okey, o, mount_cache)
  if #live == 0 then -- every replica was on unmounted segments: the object is gone
    delete_object(P, tenant, key, okey, o, nil, now)
    return nil, E.OBJECT_NOT_FOUND
  end
  local leased_until = extend_lease(P, tenant, key, okey, o, now + lease_ttl, rescore)
  local guaranteed = tonumber(o.guaranteed_until) or 0
  if guaranteed > now and now + guarantee_ttl > guaranteed then
    renew_guarantee(P, tenant, key, okey, o, now + guarantee_ttl)
  end
  return live, leased_until - now, tonumber(o.size)
end

local GET_SPEC, EXIST_SPEC = keys_spec('guaranteed_ttl_ms', 'optional'), keys_spec()

local function batch_read(P, args, cfg, spec, shape)
  local call, err = object_call(args, spec)
  if not call then return err end
  local guarantee_ttl = int_arg(call.opts.guaranteed_ttl_ms or '0', 0, cfg.max_guaranteed_ttl or 0)
  if not guarantee_ttl then
    return fail(E.INVALID_PARAMS, 'guaranteed_ttl_ms must be an integer in [0, max_guaranteed_ttl ('
      .. S(cfg.max_guaranteed_ttl) .. ')]')
  end
  local mount_cache, rescore = {}, {}
  local reply = per_row(P, args, call, function(_, tenant, row, now)
    return shape(read_one(P, tenant, row.key, now, cfg.default_kv_lease_ttl, guarantee_ttl, mount_cache, rescore))
  end)
  flush_rescore(P, rescore)
  return reply
end

local function replica_reply(live, ttl_or_code, size)
  if not live then return ttl_or_code end
  local r = { ttl_or_code, size }
  for _, rep in ipairs(live) do
    r[#r + 1] = rep.seg
    r[#r + 1] = rep.off
  end
  return r
end

local function exist_reply(live) return live and 1 or 0 end

register('mc_get_replica_list', { 'default_kv_lease_ttl', 'max_guaranteed_ttl' },
  function(P, args, cfg) return batch_read(P, args, cfg, GET_SPEC, replica_reply) end)
register('mc_exist_key', { 'default_kv_lease_ttl' },
  function(P, args, cfg) return batch_read(P, args, cfg, EXIST_SPEC, exist_reply) end)
