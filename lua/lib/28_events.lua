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
--   and for stored and updated: size, reps (its live memory replicas, as the object hash's
--   `reps` field holds them: mooncake_redis/layout.py), disk (the clients of its live disk
--   replicas, space-separated #len:name tokens)
-- Only complete objects make events: a put in progress is nobody's cache yet.
-- mooncake_redis/events.py reads the streams; replayed from empty they give the live keys.

local K, S, now_ms, events_maxlen = Base.K, Base.S, Base.now_ms, Base.events_maxlen
local replicas_of, encode_reps = Object.replicas_of, Object.encode_reps
local live_disk_replicas = Disk.live_disk_replicas

-- "#<len>:<name>" tokens: client names may hold spaces.
local function names(list, field)
  local out = {}
  for i, r in ipairs(list) do out[i] = '#' .. #r[field] .. ':' .. r[field] end
  return table.concat(out, ' ')
end

local function live_reps(P, o)
  local live = {}
  for _, r in ipairs(replicas_of(P, o)) do
    if r.live then live[#live + 1] = r end
  end
  return #live > 0 and encode_reps(live) or ''
end

-- Append event `e` for object `o` (its fields as loaded, the change applied) of tenant/key.
local function emit(P, e, tenant, key, okey, o)
  local maxlen = events_maxlen(P)
  if maxlen == 0 or not o or o.status ~= 'complete' then return end
  if e == 'stored' then -- the replicas its put just wrote, as stored; no disk replica yet
    redis.call('XADD', P .. K.events, 'MAXLEN', '~', S(maxlen), '0-*', 'e', e, 'tenant', tenant, 'key', key,
      'ts', S(now_ms(P)), 'size', o.size or '0', 'reps', o.reps or '', 'disk', '')
  elseif e == 'updated' then
    redis.call('XADD', P .. K.events, 'MAXLEN', '~', S(maxlen), '0-*', 'e', e, 'tenant', tenant, 'key', key,
      'ts', S(now_ms(P)), 'size', o.size or '0', 'reps', live_reps(P, o),
      'disk', names(live_disk_replicas(P, okey, o), 'client'))
  else
    redis.call('XADD', P .. K.events, 'MAXLEN', '~', S(maxlen), '0-*', 'e', e, 'tenant', tenant, 'key', key,
      'ts', S(now_ms(P)))
  end
end

return { emit = emit }
