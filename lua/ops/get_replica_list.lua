-- get_replica_list / exist_key: reads. Only complete objects with a live replica are readable;
-- a successful read leases the object (or its group) until at least now + default_kv_lease_ttl
-- (renewing it, when it falls short, to that rounded up to a multiple of kv_lease_slack:
-- extend_lease).
-- KEYS: P.  ARGV: options tenant, and for get_replica_list guaranteed_ttl_ms (0 -
--   max_guaranteed_ttl, default 0: renew-only, an object whose guarantee is active gets
--   guaranteed_until = max(guaranteed_until, now + guaranteed_ttl_ms); any other is unchanged);
--   with_disk (0|1, default 0; get_replica_list only), fields key.
-- get_replica_list reply, per key: {lease_ttl_ms, size, segment, offset, segment, offset, ...}
--   or an error code; with with_disk=1 see disk_reply below (disk replicas and the checksum).
-- An object whose memory replicas are gone stays readable while it has a live disk replica
-- (with_disk=0 then answers it with no replica).   exist_key reply, per key: 1 or 0.

local E, fail, S, int_arg, register, now_ms = Base.E, Base.fail, Base.S, Base.int_arg, Base.register, Base.now_ms
local FREES = Base.FREES
local obj_key, object_call = Object.obj_key, Object.object_call
local keys_spec, load_object = Object.keys_spec, Object.load_object
local live_replicas = Object.live_replicas
local live_disk_replicas = Disk.live_disk_replicas
local being_evicted, extend_lease = Units.being_evicted, Units.extend_lease
local flush_rescore, delete_object = Units.flush_rescore, Units.delete_object
local renew_guarantee = Units.renew_guarantee
local settle_disk_only = Offload.settle_disk_only

local NO_DISKS = {} -- read only
local lease_plain_object, object_unit = Units.lease_plain_object, Units.object_unit
local lease_group, group_unit, group_tiers = Units.lease_group, Units.group_unit, Units.group_tiers
local grp_key, RADIX_MARK = Object.grp_key, Object.RADIX_MARK
local mount_of, decode_reps = Alloc.mount_of, Object.decode_reps

-- The fields of an object hash a read takes first (one HMGET): enough to answer a plain object
-- (complete, no guarantee, hard pin, task, soft pin or disk replica, every replica live) without
-- more calls but, for a group member (or a radix node's key), one HMGET of its group's record;
-- any other object goes through read_one, which loads the whole hash.
local READ_FIELDS = { 'status', 'size', 'reps', 'group', 'node', 'special', 'checksum' }
local GENERAL = {} -- plain_read's answer for an object that needs read_one

-- A read's reply for a plain object, or GENERAL (and an error code for a missing or unfinished
-- one). `kind`: 'exist', 'get' or 'disk' (get_replica_list with with_disk=1). The replicas are
-- walked in place (plain finds, no pattern, no table per replica): this is every read's path.
local function plain_read(P, tenant, key, now, cfg, rescore, mount_cache, kind)
  local v = redis.call('HMGET', obj_key(P, tenant, key), unpack(READ_FIELDS))
  local status, reps = v[1], v[3]
  if not status then return E.OBJECT_NOT_FOUND end
  if not reps or v[6] then return GENERAL end -- no memory replica field, or the read mark (20_object.lua)
  local group, gkey, group_lease, retained_until = v[4] or (v[5] and RADIX_MARK .. v[5])
  if group then -- a group member (or a radix node's key): the group is the unit
    gkey = grp_key(P, tenant, group)
    local g = redis.call('HMGET', gkey, 'draining', 'lease_until', 'retained_until')
    if g[1] == '1' then return E.OBJECT_NOT_FOUND end -- being evicted: gone for readers
    group_lease, retained_until = tonumber(g[2]) or 0, g[3]
  end
  if status ~= 'complete' then return E.REPLICA_IS_NOT_READY end
  local r, at, n = nil, 1, #reps
  if kind == 'get' then r = { 0, tonumber(v[2]) } elseif kind == 'disk' then r = { 0, tonumber(v[2]), v[7] or '', 0 } end
  while at <= n do
    local s1 = string.find(reps, ' ', at, true)
    local s2 = s1 and string.find(reps, ' ', s1 + 1, true)
    local s3 = s2 and string.find(reps, ' ', s2 + 1, true)
    local len = s3 and tonumber(string.sub(reps, s2 + 1, s3 - 1))
    if not len or len < 1 or s3 + len > n then return GENERAL end -- malformed: read_one's rules
    local seg = string.sub(reps, s3 + 1, s3 + len)
    if mount_of(P, seg, mount_cache) ~= string.sub(reps, s1 + 1, s2 - 1) then return GENERAL end -- dead: read_one drops it
    if r then
      r[#r + 1] = seg
      r[#r + 1] = tonumber(string.sub(reps, at, s1 - 1))
      if kind == 'disk' then r[4] = r[4] + 1 end
    end
    at = s3 + len + 1
  end
  local until_ms
  if gkey then
    until_ms = lease_group(gkey, group_unit(tenant, group), group_lease,
      now + cfg.default_kv_lease_ttl, cfg.kv_lease_slack, rescore, group_tiers(retained_until, now))
  else
    until_ms = lease_plain_object(rescore, object_unit(tenant, key), now + cfg.default_kv_lease_ttl,
      cfg.kv_lease_slack, now)
  end
  if not r then return 1 end
  r[1] = until_ms - now
  return r
end

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
  local leased_until = extend_lease(P, tenant, key, okey, o, now + cfg.default_kv_lease_ttl, cfg.kv_lease_slack, rescore, now)
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
  local kind = (shape == exist_reply and 'exist') or (with_disk == '1' and 'disk') or 'get'
  local mount_cache, rescore = {}, {}
  local now, tenant, reply, stride = now_ms(P), call.tenant, {}, call.stride -- rows of one field: key
  for i = 1, call.rows do
    local key = args[call.first + (i - 1) * stride]
    local got = plain_read(P, tenant, key, now, cfg, rescore, mount_cache, kind)
    if kind == 'exist' and got ~= GENERAL then
      got = got == 1 and 1 or 0 -- an error code: it does not exist (for readers)
    elseif got == GENERAL then
      local live, ttl_or_code, size, disks, checksum = read_one(P, tenant, key, now, cfg, guarantee_ttl,
        mount_cache, rescore, {})
      if kind == 'disk' then got = disk_reply(live, ttl_or_code, size, disks, checksum) else got = shape(live, ttl_or_code, size) end
    end
    reply[i] = got
  end
  flush_rescore(P, rescore)
  return reply
end

register('mc_get_replica_list', { 'default_kv_lease_ttl', 'kv_lease_slack', 'max_guaranteed_ttl' },
  function(P, args, cfg) return batch_read(P, args, cfg, GET_SPEC, replica_reply) end, FREES)
register('mc_exist_key', { 'default_kv_lease_ttl', 'kv_lease_slack' },
  function(P, args, cfg) return batch_read(P, args, cfg, EXIST_SPEC, exist_reply) end, FREES)
