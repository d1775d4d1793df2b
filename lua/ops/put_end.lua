-- put_end / put_revoke: the writer finishes or abandons its puts.
-- KEYS: P.  ARGV: options client_id (required), tenant; fields key, and for put_end optionally
--   checksum (1-128 bytes, else INVALID_PARAMS for that key: stored as the object's field
--   checksum when it becomes readable).  Reply: one code per key (0 = OK).
-- With offload_on_put, the first readable put_end queues the object for offload
-- (enqueue_offload, lua/lib/45_offload.lua) with its priority as of that moment. A put_end that
-- makes an object readable is a KV event `stored` (lua/lib/28_events.lua).

local tonumber_, max_ -- (bound at the first call: Base.on_first_call)
Base.on_first_call(function() tonumber_, max_ = tonumber, math.max end)
local K, E, fail, S, valid_name = Base.K, Base.E, Base.fail, Base.S, Base.valid_name
local register, FREES = Base.register, Base.FREES
local obj_key, obj_id, object_call = Object.obj_key, Object.obj_id, Object.object_call
local per_row, keys_spec, load_object = Object.per_row, Object.keys_spec, Object.load_object
local ever_soft_pinned, place_object = Units.ever_soft_pinned, Units.place_object
local group_member_completed, delete_object = Units.group_member_completed, Units.delete_object
local enqueue_offload = Offload.enqueue_offload
local with_ledger, defer_zrem = Ledger.with_ledger, Ledger.defer_zrem
local GROUP_FIELDS = Units.GROUP_FIELDS

-- A radix key's node record as put_end reads it: its unit's fields, its listed child (kid, as
-- Units.group_facts reads it), then link_pending.
local NODE_END_FIELDS = {}
for i = 1, #GROUP_FIELDS do NODE_END_FIELDS[i] = GROUP_FIELDS[i] end
NODE_END_FIELDS[#GROUP_FIELDS + 1], NODE_END_FIELDS[#GROUP_FIELDS + 2] = 'kid', 'link_pending'

local function check_writer(o, client)
  if not o then return E.OBJECT_NOT_FOUND end
  if o.writer ~= client then return E.ILLEGAL_CLIENT end
  return E.OK
end

-- The soft pin is committed once, when the object first becomes readable.
local function commit_soft_pin(o, now)
  if o.soft_pin_action == 'enable' then
    local ttl = tonumber_(o.soft_pin_ttl)
    return ttl > 0 and S(now + ttl) or '0'
  elseif o.soft_pin_action == 'disable' then
    return '0'
  end
  return o.soft_pin_until -- preserve
end

local function end_one(P, tenant, key, now, client, cfg, checksum)
  if checksum ~= nil and not valid_name(checksum, 128) then return E.INVALID_PARAMS end
  local okey = obj_key(P, tenant, key)
  local o = load_object(okey)
  local code = check_writer(o, client)
  if code ~= E.OK or o.status == 'complete' then return code end -- a retried put_end is OK
  -- a radix child completes only after its parent on another shard lists it (32_radix.lua);
  -- its node's record, read for that, serves the placement too
  local g
  if o.node then
    g = redis.call('HMGET', P .. K.radix_node .. tenant .. ':' .. o.node, unpack(NODE_END_FIELDS))
    if g[#NODE_END_FIELDS] then return E.RADIX_LINK_PENDING end
  end
  -- the lease becomes max(lease, now); it goes into the hash unless the unit lands in a tier,
  -- whose score then holds it (the lease lives where the rule needs it: 30_units.lua)
  o.status, o.lease_until = 'complete', S(max_(tonumber_(o.lease_until) or 0, now))
  o.soft_pin_until = commit_soft_pin(o, now)
  local fields = {}
  if ever_soft_pinned(o) then -- and the read mark
    fields[1], fields[2], fields[3], fields[4] = 'soft_pin_until', o.soft_pin_until, 'special', '1'
  end
  if checksum then fields[#fields + 1] = 'checksum'; fields[#fields + 1] = checksum end
  if fields[1] then redis.call('HSET', okey, unpack(fields)) end
  -- what only a put in progress needs goes, its status first (a complete object has none, and
  -- keeps its writer: put_end and put_revoke answer by it); a put_start of default options
  -- wrote none of the others
  if o.soft_pin_action or o.soft_pin_ttl or o.put_started then
    redis.call('HDEL', okey, 'status', 'soft_pin_action', 'soft_pin_ttl', 'put_started')
  else
    redis.call('HDEL', okey, 'status')
  end
  defer_zrem(P .. K.processing, obj_id(tenant, key)) -- (a batch drops its entries in one ZREM)
  local in_tier = false
  if o.group then
    group_member_completed(P, tenant, key, o.group, o.soft_pin_until, now, g)
  else
    in_tier = place_object(P, tenant, key, o, now, true) == '' -- its put was in progress: in no tier before
  end
  -- (a member's lease is its group's, which is now at least as late)
  if not in_tier and not o.group then redis.call('HSET', okey, 'lease_until', o.lease_until) end
  if cfg.offload_on_put == 1 then enqueue_offload(P, tenant, key, o, now, cfg) end
  Events.emit(P, 'stored', tenant, key, okey, o)
  return E.OK
end

local function revoke_one(P, tenant, key, now, client)
  local okey = obj_key(P, tenant, key)
  local o = load_object(okey)
  local code = check_writer(o, client)
  if code ~= E.OK then return code end
  if o.status == 'complete' then return E.INVALID_WRITE end
  delete_object(P, tenant, key, okey, o, nil, now)
  return E.OK
end

local WRITER_SPEC = keys_spec('client_id', 'required')
local END_SPEC = keys_spec('client_id', 'required')
END_SPEC.fields.checksum = 'optional'

local function batch_writer_op(P, args, one, cfg, spec)
  local call, err = object_call(args, spec or WRITER_SPEC)
  if not call then return err end
  local client = call.opts.client_id
  if not valid_name(client, 256) then return fail(E.INVALID_PARAMS, 'client_id must be 1-256 bytes') end
  local function each(_, tenant, row, now) return one(P, tenant, row.key, now, client, cfg, row.checksum) end
  if call.rows == 1 then return per_row(P, args, call, each) end
  return with_ledger(P, per_row, args, call, each) -- a batch: one ZREM, one ZADD a tier, its frees at once
end

register('mc_put_end', { 'offload_on_put', 'offload_queue_limit', 'kv_events_maxlen' },
  function(P, args, cfg) return batch_writer_op(P, args, end_one, cfg, END_SPEC) end)
register('mc_put_revoke', {}, function(P, args) return batch_writer_op(P, args, revoke_one) end, FREES)
