-- task_ref: replication and offload tasks reference the objects they copy; a referenced object
-- (or the group it belongs to) is protected from eviction, and remove without force answers
-- OBJECT_HAS_REPLICATION_TASK. The task takes a reference before it starts and drops it when it
-- ends (or fails).
-- KEYS: P.  ARGV: options tenant, delta (1 | -1, required); fields key.
-- Reply: per key, the object's reference count after the change, or a code:
--   OBJECT_NOT_FOUND, REPLICA_IS_NOT_READY (put in progress), INVALID_PARAMS (would go below 0,
--   or below the one reference an offload task in flight holds: only the task itself, through
--   mc_offload_done or the sweep of its deadline, releases that one).
-- The count is returned as an array {count} so that 0 is not mistaken for the OK code.

local E, fail, register = Base.E, Base.fail, Base.register
local obj_key, object_call, per_row = Object.obj_key, Object.object_call, Object.per_row
local keys_spec, load_object = Object.keys_spec, Object.load_object
local being_evicted = Units.being_evicted
local add_task_refs = Offload.add_task_refs

local function task_ref_one(P, tenant, key, delta, now)
  local okey = obj_key(P, tenant, key)
  local o = load_object(okey)
  if not o or being_evicted(P, tenant, o) then return E.OBJECT_NOT_FOUND end
  if o.status ~= 'complete' then return E.REPLICA_IS_NOT_READY end
  local held = o.offload_client and 1 or 0 -- the reference of the offload task in flight
  if delta < 0 and (tonumber(o.task_refs) or 0) + delta < held then return E.INVALID_PARAMS end
  local refs = add_task_refs(P, tenant, key, okey, o, delta, now)
  if not refs then return E.INVALID_PARAMS end
  return { refs }
end

local TASK_SPEC = keys_spec('delta', 'required')

local function task_ref(P, args)
  local call, err = object_call(args, TASK_SPEC)
  if not call then return err end
  local delta = call.opts.delta
  if delta ~= '1' and delta ~= '-1' then return fail(E.INVALID_PARAMS, 'delta must be 1 or -1') end
  return per_row(P, args, call, function(_, tenant, row, now)
    return task_ref_one(P, tenant, row.key, tonumber(delta), now)
  end)
end

register('mc_task_ref', {}, task_ref)
