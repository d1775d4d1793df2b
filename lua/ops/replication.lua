-- Replica copy and move, the three steps of each (lua/lib/47_replication.lua has the rules).
-- replica_start. KEYS: P.  ARGV: options client_id (required), tenant, kind (copy | move,
--   required), source (required: the segment of the replica copied from), target (repeatable,
--   1-64, in order; a move takes exactly one, not its source); field key (one row).
--   Reply: {object size, source segment, source offset, target segment, target offset, ...} (only the targets
--   that had no replica of the object: none when all had one), or a code: OBJECT_NOT_FOUND (no
--   complete object), OBJECT_HAS_REPLICATION_TASK (one is in flight), SEGMENT_NOT_FOUND (a target
--   not mounted), UNAVAILABLE_IN_CURRENT_STATUS (a target being unmounted gracefully),
--   REPLICA_NOT_FOUND (no live replica on source), NO_AVAILABLE_HANDLE (a target has no room:
--   nothing allocated), GUARANTEED_CAPACITY_EXCEEDED (a guaranteed object's new replicas would
--   pass the limit).
-- replica_end / replica_revoke. KEYS: P.  ARGV: options client_id (required), tenant, kind
--   (required); field key.  Reply: a code: OK; OBJECT_NOT_FOUND; OBJECT_NO_REPLICATION_TASK (none
--   in flight, or it passed its deadline and was revoked); ILLEGAL_CLIENT (another client's);
--   INVALID_PARAMS (of the other kind); for end REPLICA_IS_GONE (the source or a target died: what
--   lives is kept, see finish).

local E, fail, valid_name, register = Base.E, Base.fail, Base.valid_name, Base.register
local object_call, per_row = Object.object_call, Object.per_row
local start, finish, cancel, MAX_TARGETS = Replication.start, Replication.finish, Replication.cancel,
  Replication.MAX_TARGETS

local START_SPEC = { opts = { client_id = 'required', tenant = 'optional', kind = 'required', source = 'required',
  target = 'list' }, fields = { key = 'required' }, max_rows = 1 }
local STEP_SPEC = { opts = { client_id = 'required', tenant = 'optional', kind = 'required' },
  fields = { key = 'required' }, max_rows = 1 }

-- The call's options checked, or nil and an error reply.
local function checked(args, spec)
  local call, err = object_call(args, spec)
  if not call then return nil, err end
  local o = call.opts
  if o.kind ~= 'copy' and o.kind ~= 'move' then return nil, fail(E.INVALID_PARAMS, 'kind must be copy or move') end
  if not valid_name(o.client_id, 256) then return nil, fail(E.INVALID_PARAMS, 'client_id must be 1-256 bytes') end
  return call
end

local function replica_start(P, args, cfg)
  local call, err = checked(args, START_SPEC)
  if not call then return err end
  local o, targets = call.opts, call.opts.target or {}
  if not valid_name(o.source, 1024) then return fail(E.INVALID_PARAMS, 'source must be a segment name') end
  if #targets < 1 or #targets > MAX_TARGETS then return fail(E.INVALID_PARAMS, 'expected 1-' .. MAX_TARGETS .. ' targets') end
  if o.kind == 'move' and (#targets ~= 1 or targets[1] == o.source) then
    return fail(E.INVALID_PARAMS, 'a move takes one target, not its source')
  end
  for _, seg in ipairs(targets) do
    if not valid_name(seg, 1024) then return fail(E.INVALID_PARAMS, 'targets must be segment names') end
  end
  return per_row(P, args, call, function(_, tenant, row, now)
    return start(P, tenant, row.key, o.kind, o.client_id, o.source, targets, now, cfg)
  end)
end

local function step(fn)
  return function(P, args)
    local call, err = checked(args, STEP_SPEC)
    if not call then return err end
    return per_row(P, args, call, function(_, tenant, row, now)
      return fn(P, tenant, row.key, call.opts.kind, call.opts.client_id, now)
    end)
  end
end

local CONFIG = { 'put_start_discard_timeout', 'guaranteed_capacity_ratio', 'guaranteed_tenant_ratio', 'kv_events_maxlen' }
register('mc_replica_start', CONFIG, replica_start)
register('mc_replica_end', { 'kv_events_maxlen' }, step(finish))
register('mc_replica_revoke', {}, step(cancel))
