-- Maintenance: the bounded steps the background workers (mooncake_redis/worker.py) drive.
-- Each call does at most `max` items (1-1024) and reports how many it did, so a worker calls
-- again while a count equals `max`.
--
-- discard_puts. KEYS: P. ARGV: max.
--   Puts whose put_start is at least put_start_discard_timeout old (P:processing score <=
--   now - timeout, the same rule put_start uses to preempt) are deleted; their extents stay
--   held until put_started + put_start_release_timeout (the writer may still be writing), or freed
--   at once when the writer was expired by expire_clients (see hold_until).
--   Then revokes up to `max` replica copies and moves past their deadline (sweep_replications,
--   lua/lib/47_replication.lua) and frees up to `max` held extents that are due (release_held).
--   Reply: {discarded, released, replications revoked}.
-- expire_clients. KEYS: P. ARGV: max.
--   Clients are expired only for silence the store and a worker both saw: P.clients_checked_at
--   is the clock of the last expire_clients call and P.clients_watched_since the start of the
--   current unbroken run of calls; a call more than client_ttl / 2 after the previous one (the
--   store was down or stalled, or no worker ran) starts a new run. A client expires when both its
--   last ping (P:clients score) and the start of the run are more than client_ttl old, so after
--   an outage of any length every engine has a full client_ttl to ping again.
--   An expired client loses every segment it mounted on this shard, exactly as unmount_segment
--   does (and its local disk segment, as unmount_local_disk_segment: counted as a segment), and leaves P:clients (its next ping replies 0: remount). Their replicas hide at
--   once (mount id); sweep_replicas then removes them from the object hashes.
--   Cost: one pass over P:segs when any client expired (there is no client -> segments index).
--   When it unmounted anything it INCRs P:sweep_pending, the marker that a dead-replica sweep
--   of this shard is owed (it survives a worker that stops or crashes before sweeping).
--   Reply: {clients_expired, segments_unmounted}.
-- sweep_done. KEYS: P. ARGV: token (the P:sweep_pending value read before the sweep began).
--   Clears the marker unless a newer unmount moved it on. Reply: 1 cleared, 0 sweep again.
-- claim. KEYS: P. ARGV: worker_id, ttl_ms.
--   A shard lease so that several workers do not repeat each other's work. P:worker =
--   "<worker_id> <until_ms>" (store clock, so tests can advance it; no key TTL). Taken when
--   absent, expired (until_ms <= now) or already ours; taking it sets until_ms = now + ttl_ms.
--   Reply: 1 if we hold it now, 0 if another worker does.
-- release_claim. KEYS: P. ARGV: worker_id. Deletes P:worker only if ours. Reply: 1 or 0.

local K, E, fail, S, MAX_INT = Base.K, Base.E, Base.fail, Base.S, Base.MAX_INT
local int_arg, now_ms, valid_name = Base.int_arg, Base.now_ms, Base.valid_name
local register, FREES = Base.register, Base.FREES
local drop_segment, hold_until = Alloc.drop_segment, Alloc.hold_until
local release_held = Alloc.release_held
local obj_key, load_object = Object.obj_key, Object.load_object
local drop_local_disk = Disk.drop_local_disk
local delete_object = Units.delete_object

local MAX_ITEMS = 1024

local function max_arg(s)
  return int_arg(s, 1, MAX_ITEMS)
end

local function discard_puts(P, args, cfg)
  local max = max_arg(args[1])
  if not max then return fail(E.INVALID_PARAMS, 'max must be an integer in [1, 1024]') end
  local now = now_ms(P)
  local due = redis.call('ZRANGEBYSCORE', P .. K.processing, '-inf', S(now - cfg.put_start_discard_timeout),
    'WITHSCORES', 'LIMIT', 0, max)
  local discarded = 0
  for i = 1, #due, 2 do
    local id = due[i]
    local tenant, key = string.match(id, '^([^:]+):(.*)$')
    local okey = tenant and obj_key(P, tenant, key)
    local o = okey and load_object(okey)
    if o and o.status ~= 'complete' then
      -- Object.put_started's rule, with the index's score already at hand
      local started = tonumber(o.put_started) or tonumber(due[i + 1])
      delete_object(P, tenant, key, okey, o, hold_until(P, o.writer, started, cfg.put_start_release_timeout), now)
      discarded = discarded + 1
    else
      redis.call('ZREM', P .. K.processing, id) -- a stale index entry
    end
  end
  local revoked = Replication.sweep_replications(P, now, max)
  local released = release_held(P, now, max, true)
  return { discarded, released, revoked }
end

-- The unmount steps of unmount_segment (segments.lua), which is local to that file: the
-- segment's bytes leave the books, its allocator and its hash go; replicas die by mount id.
local function expire_clients(P, args, cfg)
  local max = max_arg(args[1])
  if not max then return fail(E.INVALID_PARAMS, 'max must be an integer in [1, 1024]') end
  local now = now_ms(P)
  local row = redis.call('HMGET', P, 'clients_checked_at', 'clients_watched_since')
  local checked, since = tonumber(row[1]), tonumber(row[2])
  if not checked or not since or now - checked > cfg.client_ttl / 2 or since > now then
    since = now
    redis.call('HSET', P, 'clients_watched_since', S(now))
  end
  redis.call('HSET', P, 'clients_checked_at', S(now))
  if now - since <= cfg.client_ttl then return { 0, 0 } end
  local dead = redis.call('ZRANGEBYSCORE', P .. K.clients, '-inf', '(' .. S(now - cfg.client_ttl),
    'LIMIT', 0, max)
  if #dead == 0 then return { 0, 0 } end
  local is_dead = {}
  for _, client in ipairs(dead) do is_dead[client] = true end
  local unmounted = 0
  for _, name in ipairs(redis.call('ZRANGE', P .. K.segments, 0, -1)) do
    local owner = redis.call('HGET', P .. K.segment .. name, 'client')
    if owner and is_dead[owner] and drop_segment(P, name) then unmounted = unmounted + 1 end
  end
  for _, client in ipairs(dead) do -- and its local disk segment, with its disk replicas
    if drop_local_disk(P, client) then unmounted = unmounted + 1 end
  end
  redis.call('ZREM', P .. K.clients, unpack(dead))
  -- remembered for put_start_release_timeout: abandoned puts of these writers free at once
  for _, client in ipairs(dead) do redis.call('ZADD', P .. K.expired_clients, S(now), client) end
  redis.call('ZREMRANGEBYSCORE', P .. K.expired_clients, '-inf', '(' .. S(now - cfg.put_start_release_timeout))
  return { #dead, unmounted }
end

local function sweep_done(P, args)
  if type(args[1]) ~= 'string' then return fail(E.INVALID_PARAMS, 'expected the sweep token') end
  local cur = redis.call('GET', P .. K.sweep_pending)
  if cur and cur ~= args[1] then return 0 end
  redis.call('DEL', P .. K.sweep_pending)
  return 1
end

local function parse_claim(value)
  if not value then return nil, 0 end
  local id, until_ms = string.match(value, '^(.*) (%d+)$')
  return id, tonumber(until_ms) or 0
end

local function claim(P, args)
  local worker = args[1]
  if not valid_name(worker, 256) then return fail(E.INVALID_PARAMS, 'worker_id must be 1-256 bytes') end
  local ttl = int_arg(args[2], 1, MAX_INT)
  if not ttl then return fail(E.INVALID_PARAMS, 'ttl_ms must be an integer > 0') end
  local now = now_ms(P)
  local holder, until_ms = parse_claim(redis.call('GET', P .. K.worker))
  if holder and holder ~= worker and until_ms > now then return 0 end
  redis.call('SET', P .. K.worker, worker .. ' ' .. S(now + ttl))
  return 1
end

local function release_claim(P, args)
  local worker = args[1]
  if not valid_name(worker, 256) then return fail(E.INVALID_PARAMS, 'worker_id must be 1-256 bytes') end
  local holder = parse_claim(redis.call('GET', P .. K.worker))
  if holder ~= worker then return 0 end
  redis.call('DEL', P .. K.worker)
  return 1
end

register('mc_discard_puts', { 'put_start_discard_timeout', 'put_start_release_timeout', 'held_due' }, discard_puts, FREES)
register('mc_expire_clients', { 'client_ttl', 'put_start_release_timeout' }, expire_clients, FREES)
register('mc_sweep_done', {}, sweep_done, FREES)
register('mc_claim', {}, claim, FREES)
register('mc_release_claim', {}, release_claim, FREES)
