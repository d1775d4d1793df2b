-- get_replica_list / exist_key: reads. Only complete objects with a live replica are readable;
-- a successful read leases the object (or its group) until at least now + default_kv_lease_ttl
-- (renewing it, when it falls short, to that + kv_lease_slack: extend_lease).
-- KEYS: P.  ARGV: options tenant, and for get_replica_list guaranteed_ttl_ms (0 -
--   max_guaranteed_ttl, default 0: renew-only, an object whose guarantee is active gets
--   guaranteed_until = max(guaranteed_until, now + guaranteed_ttl_ms); any other is unchanged);
--   with_disk (0|1, default 0; get_replica_list only), fields key.
-- get_replica_list reply, per key: {lease_ttl_ms, size, segment, offset, segment, offset, ...}
--   or an error code; with with_disk=1 see disk_reply below (disk replicas and the checksum).
-- An object whose memory replicas are gone stays readable while it has a live disk replica
-- (with_disk=0 then answers it with no replica).   exist_key reply, per key: 1 or 0.

local E, fail, S, int_arg, register = Base.E, Base.fail, Base.S, Base.int_arg, Base.register
local FREES = Base.FREES
local obj_key, object_call, per_row = Object.obj_key, Object.object_call, Object.per_row
local keys_spec, load_object = Object.keys_spec, Object.load_object
local live_replicas = Object.live_replicas
local live_disk_replicas = Disk.live_disk_replicas
local being_evicted, extend_lease = Units.being_evicted, Units.extend_lease
local flush_rescore, delete_object = Units.flush_rescore, Units.delete_object
local renew_guarantee = Units.renew_guarantee
local settle_disk_only = Offload.settle_disk_only

local NO_DISKS = {} -- read only

-- Returns the live replicas, or nil and an error code; leases the object on success.
local function read_one(P, tenant, key, now, cfg, guarantee_ttl, mount_cache, rescore, disk_cache)
  local okey = obj_key(P, tenant, key)
  local o = load_object(okey)
  if not o or being_evicted(P, tenant, o) then return nil, E.OBJECT_NOT_FOUND end
  if o.status ~= 'complete' then return nil, E.REPLICA_IS_NOT_READY end
  local live, maybe_disk = live_replicas(P, okey, o, mount_cache)
  local disks = maybe_disk and live_disk_replicas(P, okey, o, disk_cache) or NO_DISKS
  if #live == 0 and #disks == 0 then -- every replica was on unmounted segments: the object is gone
    delete_object(P, tenant, key, okey, o, nil, now)
    return nil, E.OBJECT_NOT_FOUND
  end
  if #live == 0 and o.group then settle_disk_only(P, tenant, key, okey, now) end
  local leased_until = extend_lease(P, tenant, key, okey, o, now + cfg.default_kv_lease_ttl, cfg.kv_lease_slack, rescore)
  local guaranteed = o.guaranteed_until and tonumber(o.guaranteed_until) or 0 -- most objects have none
  if guaranteed > now and now + guarantee_ttl > guaranteed then
    renew_guarantee(P, tenant, key, okey, o, now + guarantee_ttl)
  end
  return live, leased_until - now, o.size, disks, o.checksum -- size as stored: the reply shapes convert it
end

-- with_disk=1: {lease_ttl_ms, size, checksum ("" if none), n_memory, (segment, offset) x n_memory,
-- (client, location) x n_disk}: memory replicas first, then disk replicas.
local function disk_reply(live, ttl_or_code, size, disks, checksum)
  if not live then return ttl_or_code end
  local r = { ttl_or_code, tonumber(size), checksum or '', #live }
  for _, rep in ipairs(live) do
    r[#r + 1] = rep.seg
    r[#r + 1] = rep.off
  end
  for _, d in ipairs(disks) do
    r[#r + 1] = d.client
    r[#r + 1] = d.location
  end
  return r
end

local GET_SPEC, EXIST_SPEC = keys_spec('guaranteed_ttl_ms', 'optional'), keys_spec()
GET_SPEC.opts.with_disk = 'optional'

local function batch_read(P, args, cfg, spec, shape)
  local call, err = object_call(args, spec)
  if not call then return err end
  local guarantee_ttl = int_arg(call.opts.guaranteed_ttl_ms or '0', 0, cfg.max_guaranteed_ttl or 0)
  if not guarantee_ttl then
    return fail(E.INVALID_PARAMS, 'guaranteed_ttl_ms must be an integer in [0, max_guaranteed_ttl ('
      .. S(cfg.max_guaranteed_ttl) .. ')]')
  end
  local with_disk = call.opts.with_disk or '0'
  if with_disk ~= '0' and with_disk ~= '1' then return fail(E.INVALID_PARAMS, 'with_disk must be 0 or 1') end
  local mount_cache, rescore, disk_cache = {}, {}, {}
  local reply = per_row(P, args, call, function(_, tenant, row, now)
    local live, ttl_or_code, size, disks, checksum = read_one(P, tenant, row.key, now, cfg, guarantee_ttl,
      mount_cache, rescore, disk_cache)
    if with_disk == '1' then return disk_reply(live, ttl_or_code, size, disks, checksum) end
    return shape(live, ttl_or_code, size)
  end)
  flush_rescore(P, rescore)
  return reply
end

local function replica_reply(live, ttl_or_code, size)
  if not live then return ttl_or_code end
  local r = { ttl_or_code, tonumber(size) }
  for _, rep in ipairs(live) do
    r[#r + 1] = rep.seg
    r[#r + 1] = rep.off
  end
  return r
end

local function exist_reply(live) return live and 1 or 0 end

register('mc_get_replica_list', { 'default_kv_lease_ttl', 'kv_lease_slack', 'max_guaranteed_ttl' },
  function(P, args, cfg) return batch_read(P, args, cfg, GET_SPEC, replica_reply) end, FREES)
register('mc_exist_key', { 'default_kv_lease_ttl', 'kv_lease_slack' },
  function(P, args, cfg) return batch_read(P, args, cfg, EXIST_SPEC, exist_reply) end, FREES)
