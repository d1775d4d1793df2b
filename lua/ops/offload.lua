-- The SSD offload tier's functions (state: lua/lib/27_disk.lua and 45_offload.lua).
--
-- mc_mount_local_disk. KEYS: P. ARGV: options client_id (required), enable_offloading (0|1,
--   default 1). Mounts (or, when mounted, switches offloading of) the client's local disk
--   segment on this shard; counts as a ping of a known client. Reply: 0 (OK).
-- mc_unmount_local_disk. KEYS: P. ARGV: option client_id. Its disk replicas die at once, its
--   queues go, its tasks in flight end at their deadline (drop_local_disk). Reply: 0, or
--   SEGMENT_NOT_FOUND (error) when none is mounted.
-- mc_report_ssd_capacity. KEYS: P. ARGV: options client_id, capacity_bytes (the client's whole
--   disk). Records this shard's share of it (shard_share: capacity / shards, the first
--   capacity mod shards shards one byte more) as capacity_bytes. Reply: 0, or
--   SEGMENT_NOT_FOUND (error).
-- mc_offload_heartbeat. KEYS: P. ARGV: options client_id, max_tasks (1-1024), max_rank (0-2,
--   default 2: hand out only priorities up to it; 0 HIGH, 1 NORMAL, 2 LOW).
--   Hands out up to max_tasks of the client's queued entries (fewer when its tasks in flight
--   would pass this shard's share of offload_queue_limit), HIGH first (queue and overflow
--   merged in arrival order), then NORMAL, then LOW; looks at most 2 x max_tasks entries
--   (stale ones are dropped and counted). With a reported capacity, used_bytes + inflight_bytes
--   + the task's size stays within capacity_bytes: the first entry that does not fit stops the
--   hand-out and stays queued in its place (offload_deferred), so nothing overtakes it; a NORMAL
--   or LOW entry larger than the whole capacity_bytes is dropped and counted instead (HIGH
--   waits for a larger report). Each task takes a task reference on its object and runs until
--   acknowledged or now + offload_task_timeout. Counts as a ping.
--   An entry of an object eviction queued (offload_on_evict) that is stale or dropped ends its
--   wait (settle_offload_evict: evicted, or its memory freed when a disk copy exists).
--   Reply: {{key, tenant, size, priority, segment, offset, attempt}, ...}; SEGMENT_NOT_FOUND (error)
--   when the client has no disk segment here; {} while its offloading is disabled.
-- mc_offload_done. KEYS: P. ARGV: options client_id, tenant, result (success | failure);
--   fields key, location (success: required, 1-4096 bytes). Per key:
--   success: the disk replica disk:<client> = "<mount> <location>" is recorded (replacing the
--     client's earlier one, whose file is queued for removal when its location differs), its
--     bytes count in used_bytes (once per object), a queued removal of that very location is
--     withdrawn, the client's task (if any) ends; idempotent.
--   failure: the client's task (if any) ends and is queued again or dropped (requeue_offload).
--   An object eviction queued (offload_on_evict) loses its memory replica with a success, and is
--   evicted when its entry is dropped (unless a lease or pin taken meanwhile keeps it).
--   Reply: one code per key: OK, OBJECT_NOT_FOUND, REPLICA_IS_NOT_READY, SEGMENT_NOT_FOUND
--   (the client's disk is not mounted), INVALID_PARAMS (bad location).
-- mc_offload_sweep. KEYS: P. ARGV: max (1-1024). Tasks whose deadline passed end as failures
--   (requeue_offload; an object eviction queued is evicted when its entry is dropped); entries
--   of objects that went away are dropped.
--   Reply: {timed_out, requeued, dropped}.
-- mc_disk_removal_heartbeat. KEYS: P. ARGV: options client_id, max_items (1-1024). Hands out up
--   to max_items of the client's due file removals (P:diskrm:<client>), oldest first; each is
--   due again at now + offload_task_timeout unless acknowledged. An entry whose location a live
--   disk replica of the client points at again is dropped, never handed out. Counts as a ping.
--   Reply: {{key, tenant, location}, ...}; SEGMENT_NOT_FOUND (error) without a disk segment.
-- mc_disk_removal_ack. KEYS: P. ARGV: options client_id, tenant; fields key, location.
--   Per row: 0 (the removal is done and forgotten), OBJECT_NOT_FOUND (no such removal: already
--   acknowledged, or its queue went with an unmount), INVALID_PARAMS (location not 1-4096 bytes).
-- mc_disk_referenced. KEYS: P. ARGV: options client_id, tenant; fields key, location. Read-only.
--   Per row: 1 when a live disk replica of the client points at that location, else 0 (the
--   agent's garbage collection removes only files answered 0).

local K, E, fail, S, MAX_INT = Base.K, Base.E, Base.fail, Base.S, Base.MAX_INT
local int_arg, now_ms, shard_share = Base.int_arg, Base.now_ms, Base.shard_share
local valid_tenant, valid_name, parse_call = Base.valid_tenant, Base.valid_name, Base.parse_call
local row_of, register, FREES = Base.row_of, Base.register, Base.FREES
local obj_key, obj_id, MAX_KEYS_PER_CALL = Object.obj_key, Object.obj_id, Object.MAX_KEYS_PER_CALL
local object_call, per_row, load_object = Object.object_call, Object.per_row, Object.load_object
local live_replicas = Object.live_replicas
local disk_mount, live_disk_replicas = Disk.disk_mount, Disk.live_disk_replicas
local removal_entry, parse_removal = Disk.removal_entry, Disk.parse_removal
local queue_disk_removal, drop_local_disk = Disk.queue_disk_removal, Disk.drop_local_disk
local being_evicted = Units.being_evicted
local RANK_SPAN, RANK_NAMES = Offload.RANK_SPAN, Offload.RANK_NAMES
local offload_rank, add_task_refs = Offload.offload_rank, Offload.add_task_refs
local count_dropped, release_offload_task = Offload.count_dropped, Offload.release_offload_task
local requeue_offload = Offload.requeue_offload
local settle_offload_evict, offload_evict_requeued = Offload.settle_offload_evict, Offload.offload_evict_requeued

local MAX_TASKS = 1024

local function client_opt(call)
  local client = call.opts.client_id
  if not valid_name(client, 256) then return nil end
  return client
end

local function seen(P, client, now)
  if redis.call('ZSCORE', P .. K.clients, client) then redis.call('ZADD', P .. K.clients, S(now), client) end
end

local MOUNT_DISK_SPEC = { opts = { client_id = 'required', enable_offloading = 'optional' } }

local function mount_local_disk(P, args)
  local call, err = parse_call(args, MOUNT_DISK_SPEC)
  if not call then return fail(E.INVALID_PARAMS, err) end
  local client, enabled = client_opt(call), call.opts.enable_offloading or '1'
  if not client then return fail(E.INVALID_PARAMS, 'client_id must be 1-256 bytes') end
  if enabled ~= '0' and enabled ~= '1' then return fail(E.INVALID_PARAMS, 'enable_offloading must be 0 or 1') end
  local now = now_ms(P)
  local dkey = P .. K.disk .. client
  if not redis.call('HGET', dkey, 'mount') then
    local mount = redis.call('INCR', P .. K.mount_seq)
    redis.call('HSET', dkey, 'mount', mount, 'mounted_at', S(now), 'used_bytes', 0, 'inflight', 0, 'inflight_bytes', 0)
    redis.call('ZADD', P .. K.disks, mount, client)
  end
  redis.call('HSET', dkey, 'enabled', enabled)
  seen(P, client, now)
  return E.OK
end

local CLIENT_SPEC = { opts = { client_id = 'required' } }

local function unmount_local_disk(P, args)
  local call, err = parse_call(args, CLIENT_SPEC)
  if not call then return fail(E.INVALID_PARAMS, err) end
  local client = client_opt(call)
  if not client then return fail(E.INVALID_PARAMS, 'client_id must be 1-256 bytes') end
  if not drop_local_disk(P, client) then return fail(E.SEGMENT_NOT_FOUND, 'client ' .. client .. ' has no local disk segment') end
  return E.OK
end

local CAPACITY_SPEC = { opts = { client_id = 'required', capacity_bytes = 'required' } }

local function report_ssd_capacity(P, args, cfg)
  local call, err = parse_call(args, CAPACITY_SPEC)
  if not call then return fail(E.INVALID_PARAMS, err) end
  local client, capacity = client_opt(call), int_arg(call.opts.capacity_bytes, 0, MAX_INT)
  if not client or not capacity then return fail(E.INVALID_PARAMS, 'client_id must be 1-256 bytes, capacity_bytes an integer >= 0') end
  local dkey = P .. K.disk .. client
  if not redis.call('HGET', dkey, 'mount') then return fail(E.SEGMENT_NOT_FOUND, 'client ' .. client .. ' has no local disk segment') end
  redis.call('HSET', dkey, 'capacity_bytes', S(shard_share(P, capacity, cfg.shards)))
  seen(P, client, now_ms(P))
  return E.OK
end

-- The next entry to hand out: the lower score of the queue's and the overflow's heads, or nil.
local function next_entry(queue, overflow, max_score)
  local q = redis.call('ZRANGE', queue, 0, 0, 'WITHSCORES')
  local o = redis.call('ZRANGE', overflow, 0, 0, 'WITHSCORES')
  local qs, os = tonumber(q[2]), tonumber(o[2])
  local key, id, score = queue, q[1], qs
  if os and (not qs or os < qs) then key, id, score = overflow, o[1], os end
  if not id or score >= max_score then return nil end
  return key, id, score
end

-- Hand out one entry as a task, or nil (stale or too large: counted), or nil, true when its
-- bytes do not fit the disk's `room` now (nil: no capacity reported). A task is copied from the
-- client's own memory replica when it has one (else from any live one: on one host any segment
-- is readable).
local function hand_out(P, client, mount, id, score, now, cfg, room, capacity)
  local tenant, key = string.match(id, '^([^:]+):(.*)$')
  local okey = tenant and obj_key(P, tenant, key)
  local o = okey and load_object(okey)
  if not o or o.status ~= 'complete' or being_evicted(P, tenant, o) or o.offload_client
    or #live_disk_replicas(P, okey, o) > 0 then
    redis.call('HINCRBY', P, 'offload_stale', 1)
    if o and o.offload_evict and not o.offload_client then settle_offload_evict(P, tenant, key, okey, o, now) end
    return nil
  end
  local live = live_replicas(P, okey, o)
  local pick = live[1]
  for _, r in ipairs(live) do
    if redis.call('HGET', P .. K.segment .. r.seg, 'client') == client then
      pick = r
      break
    end
  end
  if not pick then
    redis.call('HINCRBY', P, 'offload_stale', 1)
    if o.offload_evict then settle_offload_evict(P, tenant, key, okey, o, now) end
    return nil
  end
  local size = tonumber(o.size)
  if room and size > room then
    if size <= capacity or offload_rank(score) == 0 then return nil, true end
    count_dropped(P, offload_rank(score)) -- it could never fit
    if o.offload_evict then settle_offload_evict(P, tenant, key, okey, o, now) end
    return nil
  end
  add_task_refs(P, tenant, key, okey, o, 1, now)
  local attempts = redis.call('HINCRBY', okey, 'offload_attempts', 1)
  redis.call('HSET', okey, 'offload_client', client, 'offload_mount', mount, 'offload_score', S(score))
  redis.call('ZADD', P .. K.offload_inflight, S(now + cfg.offload_task_timeout), id)
  if o.offload_evict then redis.call('ZADD', P .. K.offload_evict, 'XX', S(now + cfg.offload_task_timeout), id) end
  redis.call('HINCRBY', P .. K.disk .. client, 'inflight', 1)
  redis.call('HINCRBY', P .. K.disk .. client, 'inflight_bytes', S(size))
  return { key, tenant, size, RANK_NAMES[offload_rank(score)], pick.seg, pick.off, attempts }
end

local HEARTBEAT_SPEC = { opts = { client_id = 'required', max_tasks = 'required', max_rank = 'optional' } }

local function heartbeat(P, args, cfg)
  local call, err = parse_call(args, HEARTBEAT_SPEC)
  if not call then return fail(E.INVALID_PARAMS, err) end
  local client, max_tasks = client_opt(call), int_arg(call.opts.max_tasks, 1, MAX_TASKS)
  local max_rank = int_arg(call.opts.max_rank or '2', 0, 2)
  if not client or not max_tasks or not max_rank then
    return fail(E.INVALID_PARAMS, 'client_id must be 1-256 bytes, max_tasks an integer in [1, 1024], max_rank 0-2')
  end
  local d = redis.call('HMGET', P .. K.disk .. client, 'mount', 'enabled', 'inflight', 'capacity_bytes', 'used_bytes',
    'inflight_bytes')
  if not d[1] then return fail(E.SEGMENT_NOT_FOUND, 'client ' .. client .. ' has no local disk segment') end
  local now = now_ms(P)
  seen(P, client, now)
  if d[2] ~= '1' then return {} end
  local share = shard_share(P, cfg.offload_queue_limit, cfg.shards)
  local budget = math.min(max_tasks, share - (tonumber(d[3]) or 0))
  local capacity = tonumber(d[4])
  local room = capacity and capacity - (tonumber(d[5]) or 0) - (tonumber(d[6]) or 0)
  local queue, overflow = P .. K.offload_queue .. client, P .. K.offload_overflow .. client
  local tasks, looked = {}, 0
  while #tasks < budget and looked < 2 * max_tasks do
    local from, id, score = next_entry(queue, overflow, (max_rank + 1) * RANK_SPAN)
    if not from then break end
    redis.call('ZREM', from, id)
    looked = looked + 1
    local task, wait = hand_out(P, client, d[1], id, score, now, cfg, room, capacity)
    if wait then -- no room for it yet: it keeps its place and nothing overtakes it
      redis.call('ZADD', from, S(score), id)
      redis.call('HINCRBY', P, 'offload_deferred', 1)
      break
    end
    if task then
      tasks[#tasks + 1] = task
      if room then room = room - task[3] end
    end
  end
  return tasks
end

local DONE_SPEC = { opts = { client_id = 'required', tenant = 'optional', result = 'required' },
  fields = { key = 'required', location = 'optional' }, max_rows = MAX_KEYS_PER_CALL }

local function done_one(P, tenant, row, now, client, mount, success, cfg)
  local okey = obj_key(P, tenant, row.key)
  local o = load_object(okey)
  if not o or being_evicted(P, tenant, o) then return E.OBJECT_NOT_FOUND end
  if o.status ~= 'complete' then return E.REPLICA_IS_NOT_READY end
  if not mount then return E.SEGMENT_NOT_FOUND end
  if success and not valid_name(row.location, 4096) then return E.INVALID_PARAMS end
  local ours = o.offload_client == client
  if success then
    local field = 'disk:' .. client
    local old_mount, old_location = string.match(o[field] or '', '^(%d+) (.*)$')
    if old_mount ~= mount then -- a new replica on this disk (an old one of a past mount was dead)
      redis.call('HINCRBY', P .. K.disk .. client, 'used_bytes', S(tonumber(o.size) or 0))
    elseif old_location ~= row.location then -- the client's replica moves: its old file goes
      queue_disk_removal(P, client, tenant, row.key, old_location)
    end
    redis.call('HSET', okey, field, mount .. ' ' .. row.location, 'special', '1') -- the read mark
    o[field] = mount .. ' ' .. row.location
    redis.call('ZREM', P .. K.disk_removals .. client, removal_entry(tenant, row.key, row.location))
    if ours then
      release_offload_task(P, tenant, row.key, okey, o, now)
      redis.call('HDEL', okey, 'offload_attempts')
      redis.call('HINCRBY', P, 'offload_done', 1)
    end
    Events.emit(P, 'updated', tenant, row.key, okey, o)
    if o.offload_evict then settle_offload_evict(P, tenant, row.key, okey, o, now) end -- its memory goes
  elseif ours then
    local _, score, attempts = release_offload_task(P, tenant, row.key, okey, o, now)
    local what = requeue_offload(P, client, obj_id(tenant, row.key), score, attempts, cfg)
    offload_evict_requeued(P, tenant, row.key, okey, o, now, what, cfg.offload_task_timeout)
  end
  return E.OK
end

local function offload_done(P, args, cfg)
  local call, err = object_call(args, DONE_SPEC)
  if not call then return err end
  local client, result = client_opt(call), call.opts.result
  if not client then return fail(E.INVALID_PARAMS, 'client_id must be 1-256 bytes') end
  if result ~= 'success' and result ~= 'failure' then return fail(E.INVALID_PARAMS, 'result must be success or failure') end
  local mount = disk_mount(P, client)
  return per_row(P, args, call, function(_, tenant, row, now)
    return done_one(P, tenant, row, now, client, mount, result == 'success', cfg)
  end)
end

local function sweep_offload_tasks(P, args, cfg)
  local max = int_arg(args[1], 1, MAX_TASKS)
  if not max then return fail(E.INVALID_PARAMS, 'max must be an integer in [1, 1024]') end
  local now = now_ms(P)
  local due = redis.call('ZRANGEBYSCORE', P .. K.offload_inflight, '-inf', S(now), 'LIMIT', 0, max)
  local requeued, dropped = 0, 0
  for _, id in ipairs(due) do
    redis.call('ZREM', P .. K.offload_inflight, id)
    local tenant, key = string.match(id, '^([^:]+):(.*)$')
    local okey = tenant and obj_key(P, tenant, key)
    local o = okey and load_object(okey)
    if o and o.offload_client then
      local client, score, attempts = release_offload_task(P, tenant, key, okey, o, now)
      redis.call('HINCRBY', P, 'offload_redelivered', 1)
      local what = requeue_offload(P, client, id, score, attempts, cfg)
      offload_evict_requeued(P, tenant, key, okey, o, now, what, cfg.offload_task_timeout)
      if what == 'dropped' then
        dropped = dropped + 1
      else
        requeued = requeued + 1
      end
    else
      redis.call('HINCRBY', P, 'offload_stale', 1)
    end
  end
  return { #due, requeued, dropped }
end

local REMOVAL_SPEC = { opts = { client_id = 'required', max_items = 'required' } }

local function removal_heartbeat(P, args, cfg)
  local call, err = parse_call(args, REMOVAL_SPEC)
  if not call then return fail(E.INVALID_PARAMS, err) end
  local client, max_items = client_opt(call), int_arg(call.opts.max_items, 1, MAX_TASKS)
  if not client or not max_items then
    return fail(E.INVALID_PARAMS, 'client_id must be 1-256 bytes, max_items an integer in [1, 1024]')
  end
  local mount = disk_mount(P, client)
  if not mount then return fail(E.SEGMENT_NOT_FOUND, 'client ' .. client .. ' has no local disk segment') end
  local now = now_ms(P)
  seen(P, client, now)
  local queue, out = P .. K.disk_removals .. client, {}
  for _, entry in ipairs(redis.call('ZRANGEBYSCORE', queue, '-inf', S(now), 'LIMIT', 0, max_items)) do
    local tenant, key, location = parse_removal(entry)
    if not tenant or redis.call('HGET', obj_key(P, tenant, key), 'disk:' .. client) == mount .. ' ' .. location then
      redis.call('ZREM', queue, entry) -- malformed, or a live replica points at the file again: keep it
    else
      redis.call('ZADD', queue, S(now + cfg.offload_task_timeout), entry)
      out[#out + 1] = { key, tenant, location }
    end
  end
  return out
end

local REMOVAL_ROWS_SPEC = { opts = { client_id = 'required', tenant = 'optional' },
  fields = { key = 'required', location = 'required' }, max_rows = MAX_KEYS_PER_CALL }

local function removal_ack(P, args)
  local call, err = object_call(args, REMOVAL_ROWS_SPEC)
  if not call then return err end
  local client = client_opt(call)
  if not client then return fail(E.INVALID_PARAMS, 'client_id must be 1-256 bytes') end
  local queue = P .. K.disk_removals .. client
  return per_row(P, args, call, function(_, tenant, row)
    if not valid_name(row.location, 4096) then return E.INVALID_PARAMS end
    if redis.call('ZREM', queue, removal_entry(tenant, row.key, row.location)) == 1 then return E.OK end
    return E.OBJECT_NOT_FOUND
  end)
end

local function disk_referenced(P, args)
  local call, err = object_call(args, REMOVAL_ROWS_SPEC)
  if not call then return err end
  local client = client_opt(call)
  if not client then return fail(E.INVALID_PARAMS, 'client_id must be 1-256 bytes') end
  local mount = disk_mount(P, client)
  local reply = {}
  for r = 1, call.rows do
    local row = row_of(args, call, r)
    local replica = mount and redis.call('HGET', obj_key(P, call.tenant, row.key), 'disk:' .. client)
    reply[r] = (replica and replica == mount .. ' ' .. row.location) and 1 or 0
  end
  return reply
end

-- mc_fsck_offload_task. KEYS: P. ARGV: tenant, key. An object with a task in flight but no
--   P:offload_inflight entry gets one with deadline now: the next mc_offload_sweep ends the task
--   (releasing its reference). Reply: 1 indexed, 0 nothing to do.
local function fsck_offload_task(P, args)
  local tenant, key = args[1], args[2]
  if not valid_tenant(tenant) or type(key) ~= 'string' then return fail(E.INVALID_PARAMS, 'expected tenant, key') end
  local id = obj_id(tenant, key)
  if not redis.call('HGET', obj_key(P, tenant, key), 'offload_client') then return 0 end
  if redis.call('ZSCORE', P .. K.offload_inflight, id) then return 0 end
  redis.call('ZADD', P .. K.offload_inflight, S(now_ms(P)), id)
  return 1
end

-- mc_fsck_offload_inflight. KEYS: P. ARGV: client, expected, value [, expected_bytes,
--   value_bytes]. Compare-and-set of the client's P:disk:<client>.inflight (and inflight_bytes,
--   missing = 0: both or neither). Reply: 1 applied, 0 one moved (or no disk segment).
local function fsck_offload_inflight(P, args)
  local client, expected, value = args[1], int_arg(args[2], 0, MAX_INT), int_arg(args[3], 0, MAX_INT)
  local expected_bytes, value_bytes = int_arg(args[4] or '0', 0, MAX_INT), int_arg(args[5] or '0', 0, MAX_INT)
  if not valid_name(client, 256) or not expected or not value or not expected_bytes or not value_bytes
    or (#args ~= 3 and #args ~= 5) then
    return fail(E.INVALID_PARAMS, 'expected client, expected count, new count [, expected bytes, new bytes]')
  end
  local dkey = P .. K.disk .. client
  local cur = redis.call('HMGET', dkey, 'mount', 'inflight', 'inflight_bytes')
  if not cur[1] or (tonumber(cur[2]) or 0) ~= expected then return 0 end
  if #args == 5 and (tonumber(cur[3]) or 0) ~= expected_bytes then return 0 end
  redis.call('HSET', dkey, 'inflight', S(value))
  if #args == 5 then redis.call('HSET', dkey, 'inflight_bytes', S(value_bytes)) end
  return 1
end

local OFFLOAD_CFG = { 'offload_queue_limit', 'offload_task_timeout', 'offload_max_attempts' }
register('mc_mount_local_disk', {}, mount_local_disk)
register('mc_unmount_local_disk', {}, unmount_local_disk, FREES)
register('mc_report_ssd_capacity', {}, report_ssd_capacity)
register('mc_offload_heartbeat', OFFLOAD_CFG, heartbeat)
register('mc_offload_done', { 'offload_queue_limit', 'offload_task_timeout', 'offload_max_attempts', 'kv_events_maxlen' },
  offload_done)
register('mc_offload_sweep', OFFLOAD_CFG, sweep_offload_tasks, FREES)
register('mc_disk_removal_heartbeat', { 'offload_task_timeout' }, removal_heartbeat)
register('mc_disk_removal_ack', {}, removal_ack)
register('mc_disk_referenced', {}, disk_referenced, { 'no-writes' })
register('mc_fsck_offload_task', {}, fsck_offload_task)
register('mc_fsck_offload_inflight', {}, fsck_offload_inflight)
