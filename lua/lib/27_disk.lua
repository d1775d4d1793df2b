-- Local disk segments and disk replicas (the SSD offload tier; the queue is 45_offload.lua).
-- A client's local disk segment on shard P is the hash P:disk:<client> with fields
--   mount (an id from P:mount_seq), enabled (1: it takes offload tasks), mounted_at,
--   capacity_bytes (this shard's share of the client's last report_ssd_capacity, split as
--     shard_share splits a store-wide limit; absent until the first report: no bound),
--   used_bytes (the sizes of its live disk replicas on this shard), inflight and
--   inflight_bytes (its tasks in flight on this shard: count and sizes), orphaned (files whose
--   removal found its removal queue full)
-- and the entry client -> mount in P:disks. A disk replica is the object field
--   disk:<client> = "<mount> <location>" (and its object has the read mark: 20_object.lua)
-- (location: where the client keeps the bytes, e.g. a file path); it is live while
-- P:disk:<client> has that mount, as a memory replica is live while its segment does.
-- An object whose memory replicas are gone but that has a live disk replica ("disk only")
-- stays readable from disk; it is not an eviction unit (unit_rule: 'disk_only'), since
-- evicting it would free no memory.
-- When a live disk replica goes (its object is deleted, or a new success replaces its location)
-- its file's removal is queued for the client:
--   P:diskrm:<client>  zset "<tenant> <#key> <key> <location>" -> due ms (queued: when queued;
--                      handed out: until when the agent has to acknowledge it, then due again)
-- bounded by this shard's share of disk_removal_queue_limit; a removal that finds it full is
-- counted (P:disk:<client>.orphaned, P.offload_orphaned) and left to the agent's garbage
-- collection. Dead replicas (disk unmounted) queue nothing: their files are the client's to
-- collect. A removal is never handed out while a live disk replica points at its location.

local tonumber_, find_, sub_, byte_, match_ -- (bound at the first call: Base.on_first_call)
Base.on_first_call(function() tonumber_, find_, sub_, byte_, match_ = tonumber, string.find, string.sub, string.byte, string.match end)
local K, S, now_ms, config_value = Base.K, Base.S, Base.now_ms, Base.config_value
local shard_share = Base.shard_share
local free_extent = Alloc.free_extent
local SCALAR_FIELDS, obj_id, replicas_of = Object.SCALAR_FIELDS, Object.obj_id, Object.replicas_of
local write_reps = Object.write_reps
local forget_guarantee = Guarantee.forget_guarantee

local function disk_mount(P, client, cache)
  if cache and cache[client] ~= nil then return cache[client] or nil end
  local mount = redis.call('HGET', P .. K.disk .. client, 'mount')
  if cache then cache[client] = mount or false end
  return mount
end

-- Disk replicas as a list of {client=, mount=, location=, live=}, in client order.
local function disk_replicas_of(P, o, cache)
  local list = {}
  for field, value in pairs(o) do
    local client = not SCALAR_FIELDS[field] and byte_(field, 1) == 100 and match_(field, '^disk:(.*)$') -- 'd': skip the rest cheaply
    if client then
      local mount, location = match_(value, '^(%d+) (.*)$')
      list[#list + 1] = { client = client, mount = mount, location = location,
        live = mount ~= nil and disk_mount(P, client, cache) == mount }
    end
  end
  if #list > 1 then table.sort(list, function(a, b) return a.client < b.client end) end
  return list
end

-- Live disk replicas; dead ones (disk segment unmounted) are dropped from the hash on the way.
local function live_disk_replicas(P, okey, o, cache)
  local live = {}
  for _, r in ipairs(disk_replicas_of(P, o, cache)) do
    if r.live then
      live[#live + 1] = r
    else
      redis.call('HDEL', okey, 'disk:' .. r.client)
      o['disk:' .. r.client] = nil
    end
  end
  return live
end

-- Whether an object has a memory replica field, and whether it has a disk replica field, in
-- one pass over its fields.
local function replica_kinds(o)
  local memory, disk = o.reps ~= nil, false
  for field in pairs(o) do
    if not SCALAR_FIELDS[field] then
      local b = byte_(field, 1) -- plain find below: no new string
      if b == 100 and find_(field, 'disk:', 1, true) == 1 then disk = true end
    end
  end
  return memory, disk
end

-- No memory replica, at least one disk replica field (the unit_rule fact 'disk_only'); the
-- second result: whether it has a disk replica field at all.
local function is_disk_only(o)
  local memory, disk = replica_kinds(o)
  return disk and not memory, disk
end

-- A removal entry: tenant (no spaces), the key's length, the key, the location.
local function removal_entry(tenant, key, location)
  return tenant .. ' ' .. #key .. ' ' .. key .. ' ' .. location
end

-- tenant, key, location of a removal entry, or nil when malformed.
local function parse_removal(entry)
  local tenant, n, at = match_(entry, '^([^ ]+) (%d+) ()')
  if not tenant or #n > 7 then return nil end
  local stop = at + tonumber_(n)
  if sub_(entry, stop, stop) ~= ' ' or stop >= #entry then return nil end
  return tenant, sub_(entry, at, stop - 1), sub_(entry, stop + 1)
end

-- This shard's share of disk_removal_queue_limit, read when a removal is queued (the paths that
-- drop replicas do not all read the configuration); a missing or bad value is a share of 0.
local function removal_share(P)
  local c = redis.call('HMGET', P .. K.config, 'disk_removal_queue_limit', 'shards')
  local limit = c[1] and config_value('disk_removal_queue_limit', c[1])
  if not limit then return 0 end
  return shard_share(P, limit, tonumber_(c[2]))
end

-- Queue the removal of a client's file (its disk is mounted); full: counted as orphaned.
local function queue_disk_removal(P, client, tenant, key, location)
  local queue, entry = P .. K.disk_removals .. client, removal_entry(tenant, key, location)
  if redis.call('ZSCORE', queue, entry) then return end
  if redis.call('ZCARD', queue) >= removal_share(P) then
    redis.call('HINCRBY', P .. K.disk .. client, 'orphaned', 1)
    redis.call('HINCRBY', P, 'offload_orphaned', 1)
    return
  end
  redis.call('ZADD', queue, S(now_ms(P)), entry)
end

-- An object's live disk replicas go (the object is deleted): their bytes leave their disks'
-- used_bytes and their files are queued for removal.
local function drop_disk_replicas(P, tenant, key, o)
  local size = tonumber_(o.size) or 0
  for _, r in ipairs(disk_replicas_of(P, o)) do
    if r.live then
      redis.call('HINCRBY', P .. K.disk .. r.client, 'used_bytes', S(-size))
      queue_disk_removal(P, r.client, tenant, key, r.location)
    end
  end
end

-- Free an object's memory replicas and keep the object (its disk replicas hold the bytes).
-- A guarantee whose deadline passed but was not swept yet is taken off the books with them.
-- Returns the bytes freed.
local function shed_memory(P, tenant, key, okey, o)
  local size, bytes = tonumber_(o.size) or 0, 0
  local replicas = replicas_of(P, o)
  if o.guaranteed_until then
    forget_guarantee(P, tenant, key, o, replicas)
    redis.call('HDEL', okey, 'guaranteed_until')
    o.guaranteed_until = nil
  end
  for _, r in ipairs(replicas) do
    if r.live and r.off and free_extent(P, r.seg, r.off, size) then bytes = bytes + size end
  end
  write_reps(okey, o, {})
  Events.emit(P, 'updated', tenant, key, okey, o)
  return bytes
end

-- Unmount a client's local disk segment from this shard: its disk replicas die at once (mount
-- id; its used_bytes go with its hash) and P:sweep_pending asks a worker to sweep them out of
-- the object hashes; its queues and its removal queue go (each at most the shard's share of
-- its limit; removals not handed out are counted in offload_orphaned); its tasks in flight end
-- at their deadline (sweep_offload_tasks), which releases their task references. Returns false
-- when none.
local function drop_local_disk(P, client)
  local dkey = P .. K.disk .. client
  if redis.call('EXISTS', dkey) == 0 then return false end
  redis.call('DEL', dkey)
  redis.call('ZREM', P .. K.disks, client)
  redis.call('DEL', P .. K.offload_queue .. client, P .. K.offload_overflow .. client)
  local removals = redis.call('ZCARD', P .. K.disk_removals .. client)
  if removals > 0 then -- files nobody will be told to remove: counted, left to garbage collection
    redis.call('HINCRBY', P, 'offload_orphaned', removals)
    redis.call('DEL', P .. K.disk_removals .. client)
  end
  redis.call('INCR', P .. K.sweep_pending)
  return true
end

-- An object with an offload task in flight is deleted: its task leaves the in-flight index and
-- its client's count (its task reference goes with the object hash).
local function forget_offload_task(P, tenant, key, o)
  redis.call('ZREM', P .. K.offload_inflight, obj_id(tenant, key))
  if disk_mount(P, o.offload_client) == o.offload_mount then
    local dkey = P .. K.disk .. o.offload_client
    redis.call('HINCRBY', dkey, 'inflight', -1)
    redis.call('HINCRBY', dkey, 'inflight_bytes', S(-(tonumber_(o.size) or 0)))
  end
end

return {
  disk_mount = disk_mount, live_disk_replicas = live_disk_replicas, is_disk_only = is_disk_only,
  removal_entry = removal_entry, parse_removal = parse_removal,
  queue_disk_removal = queue_disk_removal, drop_disk_replicas = drop_disk_replicas,
  shed_memory = shed_memory, drop_local_disk = drop_local_disk,
  forget_offload_task = forget_offload_task,
}
