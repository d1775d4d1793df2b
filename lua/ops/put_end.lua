-- put_end / put_revoke: the writer finishes or abandons its puts.
-- KEYS: P.  ARGV: options client_id (required), tenant; fields key.  Reply: one code per key (0 = OK).

local function check_writer(o, client)
  if not o then return E.OBJECT_NOT_FOUND end
  if o.writer ~= client then return E.ILLEGAL_CLIENT end
  return E.OK
end

-- The soft pin is committed once, when the object first becomes readable.
local function commit_soft_pin(o, now)
  if o.soft_pin_action == 'enable' then
    local ttl = tonumber(o.soft_pin_ttl)
    return ttl > 0 and S(now + ttl) or '0'
  elseif o.soft_pin_action == 'disable' then
    return '0'
  end
  return o.soft_pin_until -- preserve
end

local function end_one(P, tenant, key, now, client)
  local okey = obj_key(P, tenant, key)
  local o = load_object(okey)
  local code = check_writer(o, client)
  if code ~= E.OK or o.status == 'complete' then return code end -- a retried put_end is OK
  -- a radix child completes only after its parent on another shard lists it (32_radix.lua)
  if o.node and redis.call('HGET', P .. K.radix_node .. tenant .. ':' .. o.node, 'link_pending') then
    return E.RADIX_LINK_PENDING
  end
  o.status, o.lease_until = 'complete', S(math.max(tonumber(o.lease_until), now))
  o.soft_pin_until = commit_soft_pin(o, now)
  redis.call('HSET', okey, 'status', o.status, 'lease_until', o.lease_until, 'soft_pin_until', o.soft_pin_until)
  redis.call('HDEL', okey, 'soft_pin_action', 'soft_pin_ttl')
  redis.call('ZREM', P .. K.processing, obj_id(tenant, key))
  if o.group then
    group_member_completed(P, tenant, key, o.group, o.soft_pin_until, now)
  else
    place_object(P, tenant, key, o, now)
  end
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

local function batch_writer_op(P, args, one)
  local call, err = object_call(args, WRITER_SPEC)
  if not call then return err end
  local client = call.opts.client_id
  if not valid_name(client, 256) then return fail(E.INVALID_PARAMS, 'client_id must be 1-256 bytes') end
  return per_row(P, args, call, function(_, tenant, row, now) return one(P, tenant, row.key, now, client) end)
end

register('mc_put_end', {}, function(P, args) return batch_writer_op(P, args, end_one) end)
register('mc_put_revoke', {}, function(P, args) return batch_writer_op(P, args, revoke_one) end)
