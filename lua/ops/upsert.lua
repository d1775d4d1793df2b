-- upsert_start: the first step of Mooncake's Upsert (insert or replace an object's bytes).
-- KEYS: P.  ARGV: options client_id (required), tenant, group (optional: the group the caller
--   names; an existing object of another group is refused), soft_pin_action
--   (enable|preserve|disable, default preserve) and soft_pin_ttl_ms (only with enable; default
--   default_kv_soft_pin_ttl, at most max_kv_soft_pin_ttl) as put_start's; fields key, size.
-- Reply, per key, one of:
--   {'inplace', segment, offset, ...}: the object is complete, of the same size, unleased, every
--     replica live and none on disk: it becomes a put in progress again by this writer, at the
--     same addresses (readers get REPLICA_IS_NOT_READY until put_end; put_revoke or an
--     abandoned upsert drops it, as a put). Its guarantee, pins, lease, group and radix
--     membership stay; its checksum goes (put_end may send the new one). A KV event `removed`
--     (its put_end is `stored` again).
--   {'allocate', hard_pin, group, soft_pin_ms, guaranteed_ms}: there is no object now (none
--     was there, or the old one was deleted here: another size, leased, a dead or disk replica,
--     queued for offload by eviction,
--     or a put in progress, which is preempted at once); the caller then runs put_start with
--     the old object's hard pin and group and what is left of its soft pin and guarantee (ms
--     from now; '0' and '' when none). The old object's extents stay allocated until its lease ends (readers
--     holding replicas keep reading the old bytes), a preempted put's until its release timeout.
--   an error code: OBJECT_HAS_REPLICATION_TASK (a task reference or an offload in flight),
--     INVALID_PARAMS (another group, a bad key or size).
-- Bounds: at most MAX_ROWS keys a call; per key one object and its unit.

local K, E, fail, S, MAX_INT = Base.K, Base.E, Base.fail, Base.S, Base.MAX_INT
local int_arg, valid_name, register = Base.int_arg, Base.valid_name, Base.register
local hold_until = Alloc.hold_until
local obj_key, obj_id, grp_key, put_started = Object.obj_key, Object.obj_id, Object.grp_key, Object.put_started
local object_call, per_row, load_object, replicas_of = Object.object_call, Object.per_row, Object.load_object,
  Object.replicas_of
local being_evicted, delete_object, lease_of = Units.being_evicted, Units.delete_object, Units.lease_of
local place_object, place_group = Units.place_object, Units.place_group

local MAX_ROWS = 32
local UPSERT_SPEC = {
  opts = { client_id = 'required', tenant = 'optional', group = 'optional', soft_pin_action = 'optional',
    soft_pin_ttl_ms = 'optional' },
  fields = { key = 'required', size = 'required' },
  max_rows = MAX_ROWS,
}

-- The soft pin fields an in-place upsert leaves for put_end to commit (as put_start writes them).
local function pin_fields(o, cfg)
  local action, ttl = o.soft_pin_action or 'preserve', o.soft_pin_ttl_ms
  if action ~= 'enable' and action ~= 'preserve' and action ~= 'disable' then
    return nil, 'soft_pin_action must be enable, preserve or disable'
  end
  if ttl and action ~= 'enable' then return nil, 'soft_pin_ttl_ms is only valid with soft_pin_action enable' end
  if action ~= 'enable' then return { 'soft_pin_action', action } end
  local n = int_arg(ttl or S(cfg.default_kv_soft_pin_ttl), 0, cfg.max_kv_soft_pin_ttl)
  if not n then return nil, 'soft_pin_ttl_ms must be an integer in [0, max_kv_soft_pin_ttl]' end
  return { 'soft_pin_action', 'enable', 'soft_pin_ttl', S(n) }
end

-- May the object be rewritten where it is? Same size, no active lease, every replica live, none on
-- disk, not queued for offload by eviction (offload_on_evict: it is replaced instead).
local function fits_in_place(P, tenant, key, o, size, now)
  if tonumber(o.size) ~= size or o.offload_evict or lease_of(P, tenant, key, o) > now then return false end
  local list, maybe_disk = replicas_of(P, o)
  if maybe_disk or #list == 0 then return false end
  for i = 1, #list do
    if not list[i].live then return false end
  end
  return list
end

local function in_place(P, tenant, key, okey, o, list, client, pins, now)
  Events.emit(P, 'removed', tenant, key, okey, o) -- unreadable until its upsert ends (stored again)
  o.status, o.writer, o.put_started = 'processing', client, nil
  redis.call('HSET', okey, 'status', 'processing', 'writer', client, unpack(pins))
  redis.call('HDEL', okey, 'checksum', 'put_started')
  redis.call('ZADD', P .. K.processing, S(now), obj_id(tenant, key))
  if o.group then
    redis.call('HINCRBY', grp_key(P, tenant, o.group), 'processing', 1)
    place_group(P, tenant, o.group, now)
  else
    place_object(P, tenant, key, o, now) -- a put in progress: out of every tier (its lease kept in the hash)
  end
  local reply = { 'inplace' }
  for i = 1, #list do
    reply[#reply + 1] = list[i].seg
    reply[#reply + 1] = list[i].off
  end
  return reply
end

local function left(deadline, now)
  local d = tonumber(deadline) or 0
  return d > now and S(d - now) or '0'
end

local function upsert_one(P, tenant, row, now, a, cfg)
  local key, size = row.key, int_arg(row.size, 1, MAX_INT)
  if not valid_name(key, cfg.max_key_length) or not size then return E.INVALID_PARAMS end
  local okey = obj_key(P, tenant, key)
  local o = load_object(okey)
  if not o then return { 'allocate', '0', '', '0', '0' } end
  if being_evicted(P, tenant, o) then -- gone for readers: finish it, as put_start does
    delete_object(P, tenant, key, okey, o, nil, now)
    return { 'allocate', '0', '', '0', '0' }
  end
  if (tonumber(o.task_refs) or 0) > 0 or o.offload_client then return E.OBJECT_HAS_REPLICATION_TASK end
  local group = o.node and '' or (o.group or '')
  if a.group and a.group ~= group then return E.INVALID_PARAMS end -- group membership is immutable
  if o.status ~= 'complete' then -- a put in progress: preempted at once (its writer may still write)
    delete_object(P, tenant, key, okey, o,
      hold_until(P, o.writer, put_started(P, tenant, key, o, now), cfg.put_start_release_timeout), now)
    return { 'allocate', '0', group, '0', '0' }
  end
  local list = fits_in_place(P, tenant, key, o, size, now)
  if list then return in_place(P, tenant, key, okey, o, list, a.client, a.pins, now) end
  local lease = lease_of(P, tenant, key, o)
  local kept = { 'allocate', o.hard_pin == '1' and '1' or '0', group, left(o.soft_pin_until, now),
    left(o.guaranteed_until, now) }
  delete_object(P, tenant, key, okey, o, lease > now and lease or nil, now)
  return kept
end

local function upsert_start(P, args, cfg)
  local call, err = object_call(args, UPSERT_SPEC)
  if not call then return err end
  local o = call.opts
  if not valid_name(o.client_id, 256) then return fail(E.INVALID_PARAMS, 'client_id must be 1-256 bytes') end
  if o.group and (not valid_name(o.group, 256) or string.byte(o.group, 1) == 0) then
    return fail(E.INVALID_PARAMS, 'group_id must be 1-256 bytes, not starting with a NUL byte')
  end
  local pins, perr = pin_fields(o, cfg)
  if not pins then return fail(E.INVALID_PARAMS, perr) end
  local a = { client = o.client_id, group = o.group, pins = pins }
  return per_row(P, args, call, function(_, tenant, row, now) return upsert_one(P, tenant, row, now, a, cfg) end)
end

register('mc_upsert_start', { 'put_start_release_timeout', 'default_kv_soft_pin_ttl', 'max_kv_soft_pin_ttl',
  'max_key_length', 'kv_events_maxlen' }, upsert_start)
