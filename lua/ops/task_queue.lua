-- Mooncake's task queue (CreateCopyTask, CreateMoveTask, FetchTasks, MarkTaskToComplete,
-- QueryTask): a task asks the client that owns a replica's segment to run a replica copy or
-- move (lua/lib/47_replication.lua). A task lives on its key's shard:
--   P:task:<id> hash: type (copy | move), tenant, key, source, targets (each "<length>:<name>"),
--     client (the source segment's owner), status (pending | processing | failed | success),
--     created, updated (ms), attempts (hand-outs so far), message
--   P:taskq:<client> zset id -> created: the client's pending tasks, oldest first
--   P:tasks_due zset id -> when the task times out: pending ones TASK_PENDING_TIMEOUT after they
--     were queued, processing ones TASK_PROCESSING_TIMEOUT after their hand-out
--   P:tasks_done zset id -> when it finished; the oldest beyond MAX_FINISHED go with their records
-- Delivery is at least once: a task handed out and not completed in time is queued again, up to
-- MAX_ATTEMPTS hand-outs, then fails ("processing timeout"); one never handed out in time fails
-- ("pending timeout"). P.tasks_pending counts the shard's pending tasks (at most MAX_PENDING).
--
-- task_create. KEYS: P.  ARGV: options id (required: 1-64 bytes, chosen by the caller, which
--   routes by it), type (copy | move, required), tenant, source (a move's, required; a copy's is
--   the object's first live replica), target (repeatable: a copy's 1-64, a move's one); field key.
--   Reply: {code} or {0, source, client}: OBJECT_NOT_FOUND (no complete object), INVALID_PARAMS
--   (a target not mounted, a move's source without a replica or equal to its target, an id
--   taken), UNAVAILABLE_IN_CURRENT_STATUS (a target being unmounted gracefully),
--   TASK_PENDING_LIMIT_EXCEEDED.
-- task_fetch. KEYS: P.  ARGV: options client_id (required), max (1-64, required).  Times out up to
--   SWEEP due tasks of the shard first. Reply: up to max of the client's pending tasks, now
--   processing: {{id, type, tenant, key, source, created, attempts, target, ...}, ...}.
-- task_complete. KEYS: P.  ARGV: options client_id, id, status (success | failed), message
--   (optional, at most 4096 bytes).  Reply: OK (also for a task already finished),
--   TASK_NOT_FOUND, ILLEGAL_CLIENT (not the task's client).
-- task_query. KEYS: P.  ARGV: options id.  Reply: {type, status, created, updated, client,
--   message, attempts} or TASK_NOT_FOUND.

local K, E, fail, S, now_ms = Base.K, Base.E, Base.fail, Base.S, Base.now_ms
local valid_name, parse_call, register = Base.valid_name, Base.parse_call, Base.register
local object_call, per_row, obj_key, load_object = Object.object_call, Object.per_row, Object.obj_key,
  Object.load_object
local live_replicas, mount_of, draining = Object.live_replicas, Alloc.mount_of, Alloc.draining
local being_evicted = Units.being_evicted

local TASK_PENDING_TIMEOUT, TASK_PROCESSING_TIMEOUT = 300000, 300000 -- ms, Mooncake's defaults
local MAX_ATTEMPTS, MAX_PENDING, MAX_FINISHED, SWEEP = 10, 10000, 10000, 16
local MAX_TARGETS = 64

local function task_key(P, id) return P .. K.task .. id end
local function queue_key(P, client) return P .. K.task_queue .. client end

local function encode_names(list)
  local parts = {}
  for i, name in ipairs(list) do parts[i] = #name .. ':' .. name end
  return table.concat(parts)
end

local function decode_names(s)
  local list, at = {}, 1
  while at <= #s do
    local len, from = string.match(s, '^(%d+):()', at)
    if not len then break end
    list[#list + 1] = string.sub(s, from, from + tonumber(len) - 1)
    at = from + tonumber(len)
  end
  return list
end

-- A task ends: it leaves the due index, joins the finished ones, and the oldest beyond the
-- bound go (two a call, so that the bound holds while each call stays short).
local function finish_task(P, id, tkey, status, message, now)
  redis.call('HSET', tkey, 'status', status, 'message', message, 'updated', S(now))
  redis.call('ZREM', P .. K.tasks_due, id)
  redis.call('ZADD', P .. K.tasks_done, S(now), id)
  local over = redis.call('ZCARD', P .. K.tasks_done) - MAX_FINISHED
  if over > 0 then
    for _, old in ipairs(redis.call('ZRANGE', P .. K.tasks_done, 0, math.min(over, 2) - 1)) do
      redis.call('DEL', task_key(P, old))
      redis.call('ZREM', P .. K.tasks_done, old)
    end
  end
end

local function sweep_tasks(P, now)
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', P .. K.tasks_due, '-inf', S(now), 'LIMIT', 0, SWEEP)) do
    local tkey = task_key(P, id)
    local t = redis.call('HMGET', tkey, 'status', 'client', 'created', 'attempts')
    if t[1] == 'pending' then
      redis.call('ZREM', queue_key(P, t[2]), id)
      redis.call('HINCRBY', P, 'tasks_pending', -1)
      finish_task(P, id, tkey, 'failed', 'pending timeout', now)
    elseif t[1] == 'processing' and (tonumber(t[4]) or 0) < MAX_ATTEMPTS then
      redis.call('HSET', tkey, 'status', 'pending', 'updated', S(now))
      redis.call('ZADD', queue_key(P, t[2]), t[3], id)
      redis.call('ZADD', P .. K.tasks_due, S(now + TASK_PENDING_TIMEOUT), id)
      redis.call('HINCRBY', P, 'tasks_pending', 1)
    elseif t[1] == 'processing' then
      finish_task(P, id, tkey, 'failed', 'processing timeout', now)
    else
      redis.call('ZREM', P .. K.tasks_due, id) -- finished, or gone
    end
  end
end

local CREATE_SPEC = { opts = { id = 'required', type = 'required', tenant = 'optional', source = 'optional',
  target = 'list' }, fields = { key = 'required' }, max_rows = 1 }

-- The source of the task and its client, or nil and a code.
local function task_source(P, tenant, key, o, kind, source)
  local list = live_replicas(P, obj_key(P, tenant, key), o)
  if kind == 'copy' and not source then source = list[1] and list[1].seg end
  local found = false
  for _, r in ipairs(list) do if r.seg == source then found = true end end
  if not found then return nil, kind == 'copy' and E.INTERNAL_ERROR or E.INVALID_PARAMS end
  local client = redis.call('HGET', P .. K.segment .. source, 'client')
  if not client then return nil, E.INTERNAL_ERROR end
  return source, client
end

local function create_one(P, tenant, key, o, opts, targets, now)
  if not o or o.status ~= 'complete' or being_evicted(P, tenant, o) then return { E.OBJECT_NOT_FOUND } end
  if opts.type == 'move' and targets[1] == opts.source then return { E.INVALID_PARAMS } end
  for _, seg in ipairs(targets) do
    if not mount_of(P, seg) then return { E.INVALID_PARAMS } end
    if draining(P, seg) then return { E.UNAVAILABLE_IN_CURRENT_STATUS } end
  end
  local source, client = task_source(P, tenant, key, o, opts.type, opts.source)
  if not source then return { client } end
  if (tonumber(redis.call('HGET', P, 'tasks_pending')) or 0) >= MAX_PENDING then return { E.TASK_PENDING_LIMIT_EXCEEDED } end
  local tkey = task_key(P, opts.id)
  if redis.call('HGET', tkey, 'type') then return { E.INVALID_PARAMS } end
  redis.call('HSET', tkey, 'type', opts.type, 'tenant', tenant, 'key', key, 'source', source,
    'targets', encode_names(targets), 'client', client, 'status', 'pending', 'created', S(now), 'updated', S(now),
    'attempts', '0', 'message', '')
  redis.call('ZADD', queue_key(P, client), S(now), opts.id)
  redis.call('ZADD', P .. K.tasks_due, S(now + TASK_PENDING_TIMEOUT), opts.id)
  redis.call('HINCRBY', P, 'tasks_pending', 1)
  return { 0, source, client }
end

local function task_create(P, args)
  local call, err = object_call(args, CREATE_SPEC)
  if not call then return err end
  local opts, targets = call.opts, call.opts.target or {}
  if not valid_name(opts.id, 64) then return fail(E.INVALID_PARAMS, 'id must be 1-64 bytes') end
  if opts.type ~= 'copy' and opts.type ~= 'move' then return fail(E.INVALID_PARAMS, 'type must be copy or move') end
  if #targets < 1 or #targets > MAX_TARGETS or (opts.type == 'move' and #targets ~= 1) then
    return fail(E.INVALID_PARAMS, 'a copy takes 1-' .. MAX_TARGETS .. ' targets, a move one')
  end
  if opts.type == 'move' and not valid_name(opts.source, 1024) then return fail(E.INVALID_PARAMS, 'a move needs its source') end
  for _, seg in ipairs(targets) do
    if not valid_name(seg, 1024) then return fail(E.INVALID_PARAMS, 'targets must be segment names') end
  end
  return per_row(P, args, call, function(_, tenant, row, now)
    sweep_tasks(P, now)
    return create_one(P, tenant, row.key, load_object(obj_key(P, tenant, row.key)), opts, targets, now)
  end)
end

local FETCH_SPEC = { opts = { client_id = 'required', max = 'required' } }

local function task_fetch(P, args)
  local call, err = parse_call(args, FETCH_SPEC)
  if not call then return fail(E.INVALID_PARAMS, err) end
  local client, max = call.opts.client_id, Base.int_arg(call.opts.max, 1, 64)
  if not valid_name(client, 256) or not max then return fail(E.INVALID_PARAMS, 'expected client_id and max 1-64') end
  local now = now_ms(P)
  sweep_tasks(P, now)
  local out = {}
  for _, id in ipairs(redis.call('ZRANGE', queue_key(P, client), 0, max - 1)) do
    local tkey = task_key(P, id)
    redis.call('ZREM', queue_key(P, client), id)
    redis.call('HINCRBY', P, 'tasks_pending', -1)
    local attempts = redis.call('HINCRBY', tkey, 'attempts', 1)
    redis.call('HSET', tkey, 'status', 'processing', 'updated', S(now))
    redis.call('ZADD', P .. K.tasks_due, S(now + TASK_PROCESSING_TIMEOUT), id)
    local t = redis.call('HMGET', tkey, 'type', 'tenant', 'key', 'source', 'created', 'targets')
    local entry = { id, t[1], t[2], t[3], t[4], tonumber(t[5]), attempts }
    for _, seg in ipairs(decode_names(t[6] or '')) do entry[#entry + 1] = seg end
    out[#out + 1] = entry
  end
  return out
end

local COMPLETE_SPEC = { opts = { client_id = 'required', id = 'required', status = 'required', message = 'optional' } }

local function task_complete(P, args)
  local call, err = parse_call(args, COMPLETE_SPEC)
  if not call then return fail(E.INVALID_PARAMS, err) end
  local o = call.opts
  if o.status ~= 'success' and o.status ~= 'failed' then return fail(E.INVALID_PARAMS, 'status must be success or failed') end
  if o.message and #o.message > 4096 then return fail(E.INVALID_PARAMS, 'message must be at most 4096 bytes') end
  local tkey = task_key(P, o.id)
  local t = redis.call('HMGET', tkey, 'status', 'client')
  if not t[1] then return E.TASK_NOT_FOUND end
  if t[2] ~= o.client_id then return E.ILLEGAL_CLIENT end
  if t[1] == 'success' or t[1] == 'failed' then return E.OK end
  if t[1] == 'pending' then -- completed after its hand-out timed out and it was queued again
    redis.call('ZREM', queue_key(P, t[2]), o.id)
    redis.call('HINCRBY', P, 'tasks_pending', -1)
  end
  finish_task(P, o.id, tkey, o.status, o.message or '', now_ms(P))
  return E.OK
end

local QUERY_SPEC = { opts = { id = 'required' } }

local function task_query(P, args)
  local call, err = parse_call(args, QUERY_SPEC)
  if not call then return fail(E.INVALID_PARAMS, err) end
  local t = redis.call('HMGET', task_key(P, call.opts.id), 'type', 'status', 'created', 'updated', 'client', 'message',
    'attempts')
  if not t[1] then return E.TASK_NOT_FOUND end
  return { t[1], t[2], tonumber(t[3]), tonumber(t[4]), t[5], t[6] or '', tonumber(t[7]) or 0 }
end

register('mc_task_create', {}, task_create)
register('mc_task_fetch', {}, task_fetch)
register('mc_task_complete', {}, task_complete)
register('mc_task_query', {}, task_query, { 'no-writes' })
