-- The SSD offload tier's functions (state: lua/lib/27_disk.lua and 45_offload.lua).
--
-- mc_mount_local_disk. KEYS: P. ARGV: options client_id (required), enable_offloading (0|1,
--   default 1). Mounts (or, when mounted, switches offloading of) the client's local disk
--   segment on this shard; counts as a ping of a known client. Reply: 0 (OK).
-- mc_unmount_local_disk. KEYS: P. ARGV: option client_id. Its disk replicas die at once, its
--   queues go, its tasks in flight end at their deadline (drop_local_disk). Reply: 0, or
--   SEGMENT_NOT_FOUND (error) when none is mounted.
-- mc_report_ssd_capacity. KEYS: P. ARGV: options client_id, capacity_bytes. Reply: 0, or
--   SEGMENT_NOT_FOUND (error).
-- mc_offload_heartbeat. KEYS: P. ARGV: options client_id, max_tasks (1-1024), max_rank (0-2,
--   default 2: hand out only priorities up to it; 0 HIGH, 1 NORMAL, 2 LOW).
--   Hands out up to max_tasks of the client's queued entries (fewer when its tasks in flight
--   would pass this shard's share of offload_queue_limit), HIGH first (queue and overflow
--   merged in arrival order), then NORMAL, then LOW; looks at most 2 x max_tasks entries
--   (stale ones are dropped and counted). Each task takes a task reference on its object and
--   runs until acknowledged or now + offload_task_timeout. Counts as a ping.
--   Reply: {{key, tenant, size, priority, segment, offset, attempt}, ...}; SEGMENT_NOT_FOUND (error)
--   when the client has no disk segment here; {} while its offloading is disabled.
-- mc_offload_done. KEYS: P. ARGV: options client_id, tenant, result (success | failure);
--   fields key, location (success: required, 1-4096 bytes). Per key:
--   success: the disk replica disk:<client> = "<mount> <location>" is recorded (replacing the
--     client's earlier one), the client's task (if any) ends; idempotent.
--   failure: the client's task (if any) ends and is queued again or dropped (requeue_offload).
--   Reply: one code per key: OK, OBJECT_NOT_FOUND, REPLICA_IS_NOT_READY, SEGMENT_NOT_FOUND
--   (the client's disk is not mounted), INVALID_PARAMS (bad location).
-- mc_offload_sweep. KEYS: P. ARGV: max (1-1024). Tasks whose deadline passed end as failures
--   (requeue_offload); entries of objects that went away are dropped.
--   Reply: {timed_out, requeued, dropped}.

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
    redis.call('HSET', dkey, 'mount', mount, 'mounted_at', S(now), 'capacity_bytes', 0, 'inflight', 0)
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

local function report_ssd_capacity(P, args)
  local call, err = parse_call(args, CAPACITY_SPEC)
  if not call then return fail(E.INVALID_PARAMS, err) end
  local client, capacity = client_opt(call), int_arg(call.opts.capacity_bytes, 0, MAX_INT)
  if not client or not capacity then return fail(E.INVALID_PARAMS, 'client_id must be 1-256 bytes, capacity_bytes an integer >= 0') end
  local dkey = P .. K.disk .. client
  if not redis.call('HGET', dkey, 'mount') then return fail(E.SEGMENT_NOT_FOUND, 'client ' .. client .. ' has no local disk segment') end
  redis.call('HSET', dkey, 'capacity_bytes', S(capacity))
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

-- Hand out one entry as a task, or nil (stale: counted). A task is copied from the client's own
-- memory replica when it has one (else from any live one: on one host any segment is readable).
local function hand_out(P, client, mount, id, score, now, cfg)
  local tenant, key = string.match(id, '^([^:]+):(.*)$')
  local okey = tenant and obj_key(P, tenant, key)
  local o = okey and load_object(okey)
  if not o or o.status ~= 'complete' or being_evicted(P, tenant, o) or o.offload_client
    or #live_disk_replicas(P, okey, o) > 0 then
    redis.call('HINCRBY', P, 'offload_stale', 1)
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
    return nil
  end
  add_task_refs(P, tenant, key, okey, o, 1, now)
  local attempts = redis.call('HINCRBY', okey, 'offload_attempts', 1)
  redis.call('HSET', okey, 'offload_client', client, 'offload_mount', mount, 'offload_score', S(score))
  redis.call('ZADD', P .. K.offload_inflight, S(now + cfg.offload_task_timeout), id)
  redis.call('HINCRBY', P .. K.disk .. client, 'inflight', 1)
  return { key, tenant, tonumber(o.size), RANK_NAMES[offload_rank(score)], pick.seg, pick.off, attempts }
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
  local d = redis.call('HMGET', P .. K.disk .. client, 'mount', 'enabled', 'inflight')
  if not d[1] then return fail(E.SEGMENT_NOT_FOUND, 'client ' .. client .. ' has no local disk segment') end
  local now = now_ms(P)
  seen(P, client, now)
  if d[2] ~= '1' then return {} end
  local share = shard_share(P, cfg.offload_queue_limit, cfg.shards)
  local budget = math.min(max_tasks, share - (tonumber(d[3]) or 0))
  local queue, overflow = P .. K.offload_queue .. client, P .. K.offload_overflow .. client
  local tasks, looked = {}, 0
  while #tasks < budget and looked < 2 * max_tasks do
    local from, id, score = next_entry(queue, overflow, (max_rank + 1) * RANK_SPAN)
    if not from then break end
    redis.call('ZREM', from, id)
    looked = looked + 1
    local task = hand_out(P, client, d[1], id, score, now, cfg)
    if task then tasks[#tasks + 1] = task end
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
    redis.call('HSET', okey, 'disk:' .. client, mount .. ' ' .. row.location)
    if ours then
      release_offload_task(P, tenant, row.key, okey, o, now)
      redis.call('HDEL', okey, 'offload_attempts')
      redis.call('HINCRBY', P, 'offload_done', 1)
    end
  elseif ours then
    local _, score, attempts = release_offload_task(P, tenant, row.key, okey, o, now)
    requeue_offload(P, client, obj_id(tenant, row.key), score, attempts, cfg)
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
      if requeue_offload(P, client, id, score, attempts, cfg) == 'dropped' then
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

-- mc_fsck_offload_inflight. KEYS: P. ARGV: client, expected, value. Compare-and-set of the
--   client's P:disk:<client>.inflight. Reply: 1 applied, 0 it moved (or no disk segment).
local function fsck_offload_inflight(P, args)
  local client, expected, value = args[1], int_arg(args[2], 0, MAX_INT), int_arg(args[3], 0, MAX_INT)
  if not valid_name(client, 256) or not expected or not value then
    return fail(E.INVALID_PARAMS, 'expected client, expected count, new count')
  end
  local dkey = P .. K.disk .. client
  local cur = redis.call('HGET', dkey, 'inflight')
  if not cur or (tonumber(cur) or -1) ~= expected then return 0 end
  redis.call('HSET', dkey, 'inflight', S(value))
  return 1
end

local OFFLOAD_CFG = { 'offload_queue_limit', 'offload_task_timeout', 'offload_max_attempts' }
register('mc_mount_local_disk', {}, mount_local_disk)
register('mc_unmount_local_disk', {}, unmount_local_disk)
register('mc_report_ssd_capacity', {}, report_ssd_capacity)
register('mc_offload_heartbeat', OFFLOAD_CFG, heartbeat)
register('mc_offload_done', OFFLOAD_CFG, offload_done)
register('mc_offload_sweep', OFFLOAD_CFG, sweep_offload_tasks)
register('mc_fsck_offload_task', {}, fsck_offload_task)
register('mc_fsck_offload_inflight', {}, fsck_offload_inflight)
