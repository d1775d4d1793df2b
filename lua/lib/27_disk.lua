-- Local disk segments and disk replicas (the SSD offload tier; the queue is 45_offload.lua).
-- A client's local disk segment on shard P is the hash P:disk:<client> with fields
--   mount (an id from P:mount_seq), enabled (1: it takes offload tasks), capacity_bytes (its
--   last report_ssd_capacity), mounted_at, inflight (its tasks in flight on this shard)
-- and the entry client -> mount in P:disks. A disk replica is the object field
--   disk:<client> = "<mount> <location>"
-- (location: where the client keeps the bytes, e.g. a file path); it is live while
-- P:disk:<client> has that mount, as a memory replica is live while its segment does.
-- An object whose memory replicas are gone but that has a live disk replica ("disk only")
-- stays readable from disk; it is not an eviction unit (unit_rule: 'disk_only'), since
-- evicting it would free no memory.

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
    local client = string.byte(field, 1) == 100 and string.match(field, '^disk:(.*)$') -- 'd': skip the rest cheaply
    if client then
      local mount, location = string.match(value, '^(%d+) (.*)$')
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

local function has_field_prefix(o, prefix)
  for field in pairs(o) do
    if string.find(field, prefix, 1, true) == 1 then return true end -- plain find: no new string
  end
  return false
end

-- No memory replica, at least one disk replica field (the unit_rule fact 'disk_only').
local function is_disk_only(o)
  return not has_field_prefix(o, 'rep:') and has_field_prefix(o, 'disk:')
end

-- Free an object's memory replicas and keep the object (its disk replicas hold the bytes).
-- A guarantee whose deadline passed but was not swept yet is taken off the books with them.
-- Returns the bytes freed.
local function shed_memory(P, tenant, key, okey, o)
  local size, bytes = tonumber(o.size) or 0, 0
  local replicas = replicas_of(P, o)
  if o.guaranteed_until then
    forget_guarantee(P, tenant, key, o, replicas)
    redis.call('HDEL', okey, 'guaranteed_until')
    o.guaranteed_until = nil
  end
  for _, r in ipairs(replicas) do
    if r.live and r.off and free_extent(P, r.seg, r.off, size) then bytes = bytes + size end
    redis.call('HDEL', okey, 'rep:' .. r.seg)
    o['rep:' .. r.seg] = nil
  end
  return bytes
end

-- Unmount a client's local disk segment from this shard: its disk replicas die at once (mount
-- id) and P:sweep_pending asks a worker to sweep them out of the object hashes; its queues go
-- (each at most the shard's share of the queue limit); its tasks in flight end at their deadline
-- (sweep_offload_tasks), which releases their task references. Returns false when none.
local function drop_local_disk(P, client)
  local dkey = P .. K.disk .. client
  if redis.call('EXISTS', dkey) == 0 then return false end
  redis.call('DEL', dkey)
  redis.call('ZREM', P .. K.disks, client)
  redis.call('DEL', P .. K.offload_queue .. client, P .. K.offload_overflow .. client)
  redis.call('INCR', P .. K.sweep_pending)
  return true
end

-- An object with an offload task in flight is deleted: its task leaves the in-flight index and
-- its client's count (its task reference goes with the object hash).
local function forget_offload_task(P, tenant, key, o)
  redis.call('ZREM', P .. K.offload_inflight, obj_id(tenant, key))
  if disk_mount(P, o.offload_client) == o.offload_mount then
    redis.call('HINCRBY', P .. K.disk .. o.offload_client, 'inflight', -1)
  end
end
