-- remove: delete objects. Leased objects, and objects referenced by a replication/offload task,
-- are kept unless force=1; objects whose put is still in progress are never removed here
-- (put_revoke or the discard timeout handles them).
-- KEYS: P.  ARGV: options tenant, force (0|1, default 0); fields key.
-- Reply: one code per key (0 = removed).

local tonumber_ -- (bound at the first call: Base.on_first_call)
Base.on_first_call(function() tonumber_ = tonumber end)
local E, fail, register, FREES = Base.E, Base.fail, Base.register, Base.FREES
local obj_key, object_call, per_row = Object.obj_key, Object.object_call, Object.per_row
local keys_spec, load_object, lease_of = Object.keys_spec, Object.load_object, Units.lease_of
local delete_object, with_ledger = Units.delete_object, Ledger.with_ledger

local function remove_one(P, tenant, key, force, now)
  local okey = obj_key(P, tenant, key)
  local o = load_object(okey)
  if not o then return E.OBJECT_NOT_FOUND end
  if o.status ~= 'complete' then return E.REPLICA_IS_NOT_READY end
  if not force and lease_of(P, tenant, key, o) > now then return E.OBJECT_HAS_LEASE end
  if not force and (tonumber_(o.task_refs) or 0) > 0 then return E.OBJECT_HAS_REPLICATION_TASK end
  delete_object(P, tenant, key, okey, o, nil, now)
  return E.OK
end

local REMOVE_SPEC = keys_spec('force', 'optional')

local function remove(P, args)
  local call, err = object_call(args, REMOVE_SPEC)
  if not call then return err end
  local force = call.opts.force or '0'
  if force ~= '0' and force ~= '1' then return fail(E.INVALID_PARAMS, 'force must be 0 or 1') end
  local function each(_, tenant, row, now) return remove_one(P, tenant, row.key, force == '1', now) end
  if call.rows == 1 then return per_row(P, args, call, each) end
  -- A radix parent left without children is placed at the end of the batch (Radix.place_node,
  -- the ledger's end), unless its own last key goes first: a chain removed leaf first then
  -- costs no ZADD, HSET and ZREM a parent.
  Base.CALL.noting = 'defer'
  return with_ledger(P, per_row, args, call, each) -- (no counter read between keys)
end

register('mc_remove', { 'kv_events_maxlen' }, remove, FREES)
