-- The offload queue (SSD offload tier; disk segments and disk replicas are 27_disk.lua).
-- Per shard P and client c (the owner of the segment that holds the object's memory replica,
-- as in Mooncake's master, so a client offloads its own memory):
--   P:offq:<c>     zset "<tenant>:<key>" -> rank * 2^44 + seq: the queue. rank 0 HIGH (an
--                  active guarantee), 1 NORMAL (soft pin or retained group), 2 LOW (others);
--                  seq = HINCRBY P offload_seq, so ZRANGE order is HIGH first, FIFO inside a rank
--   P:offover:<c>  the same for HIGH entries that found the queue full of HIGH entries
--   P:offload_inflight  zset "<tenant>:<key>" -> deadline of its task (one task per object)
-- Bounds (per client, on each shard: this shard's share of offload_queue_limit, shard_share):
-- the queue, the overflow and the tasks in flight each hold at most the share.
-- A task in flight is recorded in its object's hash (offload_client, offload_mount,
-- offload_score: its queue score, so a redelivery keeps its place) and holds one task
-- reference; offload_attempts counts its hand-outs until it succeeds or is dropped.
-- Counters (fields of the shard hash P): offload_enqueued, offload_done, offload_redelivered
-- (tasks that timed out), offload_stale (entries whose object went away or already is on disk),
-- offload_dropped_<high|normal|low> (full queue, displaced by a HIGH entry, retries spent, disk
-- unmounted, NORMAL or LOW larger than the disk's whole share; HIGH only when its overflow was
-- full too or its client's disk went away), offload_deferred (heartbeats that stopped at an
-- entry whose bytes do not fit the disk's room: it stays queued), offload_orphaned (files whose
-- removal could not be queued or was dropped with an unmounted disk: 27_disk.lua).
--
-- Offload on evict (offload_on_evict): eviction queues an evictable ungrouped object without a
-- disk copy here instead of dropping it (queue_on_evict), with the priority rule above:
--   offload_evict  object field: the ms it was queued (with the read mark); unit_rule reads it as
--                  the protection 'offload_pending', so the object sits in no tier meanwhile
--   P:offload_evict  zset "<tenant>:<key>" -> the end of its wait: queued (or queued again after a
--                  failure or timeout) + offload_task_timeout, or its task's deadline while handed out
--   P.offload_evict_bytes  the sizes of the objects in P:offload_evict (eviction counts them as
--                  freed toward its target, so it does not queue everything at once)
-- The wait ends (settle_offload_evict) when a disk copy is recorded (then the memory replica goes
-- and the object stays readable from disk), when the queue drops the entry (retries spent, too
-- large for the disk), or at its end (sweep_offload_evict, run by mc_evict: queue entries lost
-- with an unmounted disk or displaced by a HIGH entry end so): then the object is evicted as it
-- would have been. Either way only if the rule lets it then (a lease or pin taken meanwhile:
-- it is placed instead). Counters: offload_evict_queued, offload_evict_refused (waits that ended
-- without a disk copy).

local K, S, shard_share = Base.K, Base.S, Base.shard_share
local obj_key, obj_id, grp_key, load_object = Object.obj_key, Object.obj_id, Object.grp_key, Object.load_object
local replicas_of = Object.replicas_of
local disk_mount, is_disk_only = Disk.disk_mount, Disk.is_disk_only
local live_disk_replicas, shed_memory = Disk.live_disk_replicas, Disk.shed_memory
local place_object, place_unit_of = Units.place_object, Units.place_unit_of
local being_evicted, leave_group = Units.being_evicted, Units.leave_group
local object_unit, unplace_object, keep_lease = Units.object_unit, Units.unplace_object, Units.keep_lease
local unit_rule, object_facts = Units.unit_rule, Units.object_facts
local drop_object, forget_offload_evict = Units.drop_object, Units.forget_offload_evict

local RANK_SPAN = 17592186044416 -- 2^44: seq stays below it, and rank * 2^44 + seq below 2^53
local RANK_NAMES = { [0] = 'high', [1] = 'normal', [2] = 'low' }

local function offload_rank(score) return math.floor(score / RANK_SPAN) end

-- The priority an object gets when it is queued: decided by its state at that moment.
local function offload_priority(P, tenant, o, now)
  if (tonumber(o.guaranteed_until) or 0) > now then return 0 end
  if (tonumber(o.soft_pin_until) or 0) > now then return 1 end
  if o.group and (tonumber(redis.call('HGET', grp_key(P, tenant, o.group), 'retained_until')) or 0) > now then
    return 1
  end
  return 2
end

-- Change an object's task references by delta (the object is loaded, complete and not being
-- evicted); its unit is re-placed. Returns the new count, or nil if it would go below 0.
local function add_task_refs(P, tenant, key, okey, o, delta, now)
  local refs = (tonumber(o.task_refs) or 0) + delta
  if refs < 0 then return nil end
  if refs == 0 then redis.call('HDEL', okey, 'task_refs') else redis.call('HSET', okey, 'task_refs', S(refs), 'special', '1') end
  o.task_refs = refs
  if o.group then redis.call('HINCRBY', grp_key(P, tenant, o.group), 'task_refs', delta) end
  place_unit_of(P, tenant, key, o, now)
  return refs
end

local function count_dropped(P, rank) redis.call('HINCRBY', P, 'offload_dropped_' .. RANK_NAMES[rank], 1) end

-- Queue an entry for `client` under the bounds. A full queue: a HIGH entry displaces the newest
-- LOW, then NORMAL entry (the queue's highest score), else waits in the overflow, else is
-- dropped and counted; a NORMAL or LOW entry is dropped and counted. An entry already queued
-- keeps its place (it moves up only to a better rank). A HIGH task `returning` from flight
-- (failed or timed out) is never dropped: it goes back to the overflow even past its share.
-- That is bounded: it moves from the in-flight index back to a queue, so it adds no entry, and a
-- client has at most a share in flight (mc_offload_heartbeat's budget): the overflow holds at
-- most a share of entries never handed out plus a share back from flight (fsck counts only the
-- former against the share).
-- Returns what happened.
local function offload_push(P, client, id, score, share, returning)
  local queue, overflow = P .. K.offload_queue .. client, P .. K.offload_overflow .. client
  local rank = offload_rank(score)
  local cur = tonumber(redis.call('ZSCORE', queue, id))
  if cur then
    if offload_rank(cur) > rank then redis.call('ZADD', queue, S(score), id) end
    return 'present'
  end
  if redis.call('ZSCORE', overflow, id) then return 'present' end
  if redis.call('ZCARD', queue) < share then
    redis.call('ZADD', queue, S(score), id)
    return 'queued'
  end
  if rank > 0 then
    count_dropped(P, rank)
    return 'dropped'
  end
  local newest = redis.call('ZRANGE', queue, -1, -1, 'WITHSCORES')
  if newest[1] and offload_rank(tonumber(newest[2])) > 0 then
    redis.call('ZREM', queue, newest[1])
    count_dropped(P, offload_rank(tonumber(newest[2])))
    redis.call('ZADD', queue, S(score), id)
    return 'displaced'
  end
  if returning or redis.call('ZCARD', overflow) < share then
    redis.call('ZADD', overflow, S(score), id)
    return 'overflow'
  end
  count_dropped(P, 0)
  return 'dropped'
end

-- The client whose disk takes the object: the owner of the first live memory replica's
-- segment that has a local disk segment with offloading enabled, or nil.
local function offload_target(P, o)
  for _, r in ipairs(replicas_of(P, o)) do
    if r.live then
      local owner = redis.call('HGET', P .. K.segment .. r.seg, 'client')
      if owner and redis.call('HGET', P .. K.disk .. owner, 'enabled') == '1' then return owner end
    end
  end
  return nil
end

-- Queue a complete object for offload with its priority as of now (put_end with
-- offload_on_put). cfg: offload_queue_limit, shards. Returns what offload_push did, or nil.
local function enqueue_offload(P, tenant, key, o, now, cfg)
  local client = offload_target(P, o)
  if not client then return nil end
  local seq = redis.call('HINCRBY', P, 'offload_seq', 1)
  local score = offload_priority(P, tenant, o, now) * RANK_SPAN + seq
  local what = offload_push(P, client, obj_id(tenant, key), score, shard_share(P, cfg.offload_queue_limit, cfg.shards))
  if what ~= 'present' then redis.call('HINCRBY', P, 'offload_enqueued', 1) end
  return what
end

-- End an object's task in flight (acknowledged, failed or timed out): drop its index entry, the
-- client's in-flight count and bytes (when its disk is still the same mount) and the task reference.
-- Returns the client, the queue score and the hand-outs so far.
local function release_offload_task(P, tenant, key, okey, o, now)
  local client, score, attempts = o.offload_client, tonumber(o.offload_score) or 0, tonumber(o.offload_attempts) or 1
  redis.call('ZREM', P .. K.offload_inflight, obj_id(tenant, key))
  if disk_mount(P, client) == o.offload_mount then
    redis.call('HINCRBY', P .. K.disk .. client, 'inflight', -1)
    redis.call('HINCRBY', P .. K.disk .. client, 'inflight_bytes', S(-(tonumber(o.size) or 0)))
  end
  redis.call('HDEL', okey, 'offload_client', 'offload_mount', 'offload_score')
  o.offload_client, o.offload_mount, o.offload_score = nil, nil, nil
  if (tonumber(o.task_refs) or 0) > 0 and o.status == 'complete' and not being_evicted(P, tenant, o) then
    add_task_refs(P, tenant, key, okey, o, -1, now)
  end
  return client, score, attempts
end

-- After a failure or a timeout: a HIGH task is queued again (in its old place) until it
-- succeeds; NORMAL and LOW ones until offload_max_attempts hand-outs, then dropped and counted.
-- cfg: offload_max_attempts, offload_queue_limit, shards.
local function requeue_offload(P, client, id, score, attempts, cfg)
  local rank = offload_rank(score)
  if (rank > 0 and attempts >= cfg.offload_max_attempts) or not disk_mount(P, client) then
    count_dropped(P, rank)
    return 'dropped'
  end
  return offload_push(P, client, id, score, shard_share(P, cfg.offload_queue_limit, cfg.shards), rank == 0)
end

-- An object that lost its last memory replica but has a live disk replica: it leaves its group
-- (a group is a unit of memory to evict) and its unit goes where the rule says (nowhere).
local function settle_disk_only(P, tenant, key, okey, now)
  local o = load_object(okey)
  if not o or not is_disk_only(o) then return end
  if o.group then
    leave_group(P, tenant, key, o, now)
    redis.call('HDEL', okey, 'group', 'node', 'ugroup') -- a radix node's key leaves its node the same way
    o.group, o.node, o.ugroup = nil, nil, nil
  end
  place_object(P, tenant, key, o, now)
end

-- Eviction picked the object (ungrouped, evictable, no live disk replica; cfg: offload_queue_limit,
-- offload_task_timeout, shards): queue it for offload instead. Returns its size when it waits, or
-- nil when no client's disk takes it or the queue refused it (the caller evicts it outright).
local function queue_on_evict(P, tenant, key, okey, o, now, cfg)
  local what = enqueue_offload(P, tenant, key, o, now, cfg)
  if what == nil or what == 'dropped' then return nil end
  local size = tonumber(o.size) or 0
  o.offload_evict, o.special = S(now), '1'
  redis.call('HSET', okey, 'offload_evict', o.offload_evict, 'special', '1')
  redis.call('ZADD', P .. K.offload_evict, S(now + cfg.offload_task_timeout), obj_id(tenant, key))
  redis.call('HINCRBY', P, 'offload_evict_bytes', S(size))
  redis.call('HINCRBY', P, 'offload_evict_queued', 1)
  return size
end

-- The object's wait ends (it has offload_evict): it is evicted now if the rule lets it (with a
-- live disk replica its memory goes and it stays readable from disk, else it is deleted as
-- 'evicted'), else placed where the rule says. Returns the bytes freed.
local function settle_offload_evict(P, tenant, key, okey, o, now)
  forget_offload_evict(P, tenant, key, o)
  redis.call('HDEL', okey, 'offload_evict')
  local unit = object_unit(tenant, key)
  local on_disk = #live_disk_replicas(P, okey, o) > 0
  if not on_disk then redis.call('HINCRBY', P, 'offload_evict_refused', 1) end
  keep_lease(P, unit, okey, o)
  local f = object_facts(o)
  if unit_rule(f, now) ~= '' or f.lease_until > now then
    place_object(P, tenant, key, o, now)
    return 0
  end
  unplace_object(P, unit, o)
  if on_disk then return shed_memory(P, tenant, key, okey, o) end
  return drop_object(P, tenant, key, okey, o, nil, 'evicted')
end

-- An offload task ended without a copy (failure, timeout) and requeue_offload answered `what`:
-- an object eviction queued waits again, or (dropped) its wait ends. Returns the bytes freed.
local function offload_evict_requeued(P, tenant, key, okey, o, now, what, timeout)
  if not o.offload_evict then return 0 end
  if what == 'dropped' then return settle_offload_evict(P, tenant, key, okey, o, now) end
  redis.call('ZADD', P .. K.offload_evict, 'XX', S(now + timeout), obj_id(tenant, key))
  return 0
end

-- End up to `limit` waits whose end passed (a wait handed out as a task goes on until the task
-- ends: it is given timeout more). Returns the objects and bytes freed.
local function sweep_offload_evict(P, now, limit, timeout)
  local index, objects, bytes = P .. K.offload_evict, 0, 0
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', index, '-inf', S(now), 'LIMIT', 0, limit)) do
    local tenant, key = string.match(id, '^([^:]+):(.*)$')
    local okey = tenant and obj_key(P, tenant, key)
    local o = okey and load_object(okey)
    if not o or not o.offload_evict then
      redis.call('ZREM', index, id) -- a stale entry (fsck reports the drift it leaves)
    elseif o.offload_client then
      redis.call('ZADD', index, S(now + timeout), id)
    else
      local b = settle_offload_evict(P, tenant, key, okey, o, now)
      if b > 0 or redis.call('EXISTS', okey) == 0 then objects = objects + 1 end
      bytes = bytes + b
    end
  end
  return objects, bytes
end

return {
  queue_on_evict = queue_on_evict, settle_offload_evict = settle_offload_evict,
  offload_evict_requeued = offload_evict_requeued, sweep_offload_evict = sweep_offload_evict,
  RANK_SPAN = RANK_SPAN, RANK_NAMES = RANK_NAMES, offload_rank = offload_rank,
  add_task_refs = add_task_refs, count_dropped = count_dropped, enqueue_offload = enqueue_offload,
  release_offload_task = release_offload_task, requeue_offload = requeue_offload,
  settle_disk_only = settle_disk_only,
}
