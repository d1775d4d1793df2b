-- KV events, for KV-aware routers: with kv_events_maxlen > 0 (P:config), every change to the set
-- of stored objects of the shard, or to where their bytes are, appends one entry to the stream
-- P:events (XADD MAXLEN ~ kv_events_maxlen), in the same call that makes the change: an event is
-- never lost, nor written for a change that did not happen. Entry ids are 0-1, 0-2, ... (id
-- "0-*"): the shard's event sequence, so a reader sees a gap where trimming took entries it
-- had not read. Entry fields:
--   e       stored (put_end made the object readable), removed (remove, revoke of nothing
--           readable is no event, discard, the sweep of dead replicas, a put over it),
--           evicted (eviction took the object), updated (its replicas changed and it stays
--           readable: a disk replica added, its memory replicas evicted, dead replicas swept)
--   tenant, key, ts (the store clock, ms)
--   and for stored and updated: size, mem (its live memory replicas' segments, space-separated
--   #len:name tokens), disk (the clients of its live disk replicas, the same form)
-- Only complete objects make events: a put in progress is nobody's cache yet.
-- mooncake_redis/events.py reads the streams; replayed from empty they give the live keys.

local K, S, now_ms, events_maxlen = Base.K, Base.S, Base.now_ms, Base.events_maxlen
local replicas_of = Object.replicas_of
local live_disk_replicas = Disk.live_disk_replicas

-- "#<len>:<name>" tokens: segment and client names may hold spaces.
local function names(list, field)
  local out = {}
  for _, r in ipairs(list) do
    if r.live ~= false then out[#out + 1] = '#' .. #r[field] .. ':' .. r[field] end
  end
  return table.concat(out, ' ')
end

-- Append event `e` for object `o` (its fields as loaded, the change applied) of tenant/key.
local function emit(P, e, tenant, key, okey, o)
  local maxlen = events_maxlen()
  if maxlen == 0 or not o or o.status ~= 'complete' then return end
  local fields = { 'e', e, 'tenant', tenant, 'key', key, 'ts', S(now_ms(P)) }
  if e == 'stored' or e == 'updated' then
    fields[#fields + 1] = 'size'; fields[#fields + 1] = o.size or '0'
    fields[#fields + 1] = 'mem'; fields[#fields + 1] = names(replicas_of(P, o), 'seg')
    fields[#fields + 1] = 'disk'; fields[#fields + 1] = names(live_disk_replicas(P, okey, o), 'client')
  end
  redis.call('XADD', P .. K.events, 'MAXLEN', '~', S(maxlen), '0-*', unpack(fields))
end

return { emit = emit }
