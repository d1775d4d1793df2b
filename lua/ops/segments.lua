-- Segments and clients. A segment of `size` bytes at `base` is split into one slice per shard
-- (slice i = [base + floor(i*size/shards), base + floor((i+1)*size/shards)) ); each shard
-- allocates only inside its own slice. P:seg:<name> hash: client, base, size, used, mount,
-- mounted_at, host (when mounted with one), and draining_until while the segment is unmounted
-- gracefully (below). P:hsegs:<host> set: the segments mounted with that host. P:segs zset:
-- segment -> free bytes. P:segs_draining zset: segment -> its drain deadline. P:clients zset:
-- client -> last ping ms.

local K, E, fail, S, MAX_INT = Base.K, Base.E, Base.fail, Base.S, Base.MAX_INT
local int_arg, now_ms, valid_name = Base.int_arg, Base.now_ms, Base.valid_name
local parse_call, register, FREES = Base.parse_call, Base.register, Base.FREES
local new_mount_epoch = Base.new_mount_epoch
local free_keys, add_free, drop_segment = Alloc.free_keys, Alloc.add_free, Alloc.drop_segment
local host_key, MAX_HOST_SEGMENTS = Alloc.host_key, Alloc.MAX_HOST_SEGMENTS
local obj_key, object_call, per_row = Object.obj_key, Object.object_call, Object.per_row
local keys_spec, load_object = Object.keys_spec, Object.load_object
local live_replicas = Object.live_replicas
local live_disk_replicas = Disk.live_disk_replicas
local delete_object = Units.delete_object
local settle_disk_only = Offload.settle_disk_only

-- mount_segment. KEYS: P. ARGV: options name, client_id, base (the slice base), size (the slice size),
-- all required; path (optional, 1-4096 bytes: where a same-host reader finds the segment's bytes,
-- e.g. the data plane's memory-mapped file; stored as the field path); host (optional, 1-256
-- bytes: the node the segment is on, as Mooncake names one; the segment joins P:hsegs:<host>).
-- Reply: 0 (OK); HOST_SEGMENTS_EXCEEDED when the host has MAX_HOST_SEGMENTS (64) segments here.
-- Idempotent: mounting the same name again with the same client, base and size is OK (and counts
-- as a ping); a host given then that differs from the recorded one replaces it. A refused mount
-- writes nothing.
local MOUNT_SPEC = { opts = { name = 'required', client_id = 'required', base = 'required', size = 'required',
  path = 'optional', host = 'optional' } }

-- May `name` join P:hsegs:<host>? (Already a member, or the host has room.)
local function host_room(P, host, name)
  local hkey = host_key(P, host)
  return redis.call('SISMEMBER', hkey, name) == 1 or redis.call('SCARD', hkey) < MAX_HOST_SEGMENTS
end

local function host_full(host)
  return fail(E.HOST_SEGMENTS_EXCEEDED, 'host ' .. host .. ' has ' .. MAX_HOST_SEGMENTS .. ' segments mounted')
end

-- A remount of a mounted segment: the same parameters (a ping, and a new host recorded), else
-- SEGMENT_ALREADY_EXISTS.
local function remount(P, skey, name, client, base, size, host, cur, now)
  if cur[1] ~= client or tonumber(cur[2]) ~= base or tonumber(cur[3]) ~= size then
    return fail(E.SEGMENT_ALREADY_EXISTS, 'segment ' .. name .. ' is mounted with other parameters')
  end
  if host and host ~= cur[4] then
    if not host_room(P, host, name) then return host_full(host) end
    if cur[4] then redis.call('SREM', host_key(P, cur[4]), name) end
    redis.call('SADD', host_key(P, host), name)
    redis.call('HSET', skey, 'host', host)
  end
  redis.call('ZADD', P .. K.clients, S(now), client)
  redis.call('ZREM', P .. K.expired_clients, client)
  return E.OK
end

local function mount_segment(P, args)
  local call, err = parse_call(args, MOUNT_SPEC)
  if not call then return fail(E.INVALID_PARAMS, err) end
  local name, client = call.opts.name, call.opts.client_id
  local base, size = int_arg(call.opts.base, 0, MAX_INT), int_arg(call.opts.size, 1, MAX_INT)
  if not valid_name(name, 1024) then return fail(E.INVALID_PARAMS, 'segment name must be 1-1024 bytes') end
  if not valid_name(client, 256) then return fail(E.INVALID_PARAMS, 'client_id must be 1-256 bytes') end
  local path, host = call.opts.path, call.opts.host
  if path ~= nil and not valid_name(path, 4096) then return fail(E.INVALID_PARAMS, 'path must be 1-4096 bytes') end
  if host ~= nil and not valid_name(host, 256) then return fail(E.INVALID_PARAMS, 'host must be 1-256 bytes') end
  if not base or not size or base + size > MAX_INT then
    return fail(E.INVALID_PARAMS, 'base and size must be integers, size > 0, base + size < 2^53')
  end
  local skey = P .. K.segment .. name
  local cur = redis.call('HMGET', skey, 'client', 'base', 'size', 'host')
  local now = now_ms(P)
  if cur[1] then return remount(P, skey, name, client, base, size, host, cur, now) end
  local capacity = tonumber(redis.call('HGET', P, 'capacity_bytes')) or 0
  if capacity + size > MAX_INT then
    return fail(E.INVALID_PARAMS, 'the shard\'s capacity would pass 2^53 bytes')
  end
  if host and not host_room(P, host, name) then return host_full(host) end
  -- every check is done: from here on the call only writes
  redis.call('ZADD', P .. K.clients, S(now), client)
  redis.call('ZREM', P .. K.expired_clients, client)
  local mount = redis.call('INCR', P .. K.mount_seq)
  redis.call('HSET', skey, 'client', client, 'base', S(base), 'size', S(size), 'used', 0,
    'mount', mount, 'mounted_at', S(now))
  if path then redis.call('HSET', skey, 'path', path) end
  if host then
    redis.call('HSET', skey, 'host', host)
    redis.call('SADD', host_key(P, host), name)
  end
  local by_off, by_size = free_keys(P, name)
  add_free(by_off, by_size, base, size)
  redis.call('ZADD', P .. K.segments, S(size), name)
  redis.call('HINCRBY', P, 'capacity_bytes', S(size))
  new_mount_epoch(P)
  return E.OK
end

-- unmount_segment. KEYS: P. ARGV: options name, client_id. Reply: 0 (OK).
-- The segment's replicas become unreadable at once (their mount id no longer matches);
-- sweep_replicas then removes them from the object hashes in bounded batches (the caller, or a
-- worker when P:sweep_pending is set).
local UNMOUNT_SPEC = { opts = { name = 'required', client_id = 'required' } }

local function unmount_segment(P, args)
  local call, err = parse_call(args, UNMOUNT_SPEC)
  if not call then return fail(E.INVALID_PARAMS, err) end
  local name, client = call.opts.name, call.opts.client_id
  if not valid_name(name, 1024) then return fail(E.INVALID_PARAMS, 'segment name must be 1-1024 bytes') end
  local owner = redis.call('HGET', P .. K.segment .. name, 'client')
  if not owner then return fail(E.SEGMENT_NOT_FOUND, 'segment ' .. name .. ' is not mounted') end
  if owner ~= client then return fail(E.ILLEGAL_CLIENT, 'segment ' .. name .. ' belongs to another client') end
  drop_segment(P, name)
  redis.call('ZREM', P .. K.segments_draining, name)
  return E.OK
end

-- graceful_unmount_segment. KEYS: P. ARGV: options name, client_id, grace_ms (0 - 10^15), all
-- required. Reply: 0 (OK). From now on the slice takes no new extent (10_alloc.lua: draining)
-- and its replicas stay readable; its hash gets draining_until = now + grace_ms (a second call
-- keeps the earlier deadline) and P:segs_draining lists it with that deadline. The worker then
-- drops the segment on every shard at once, when every slice is empty or past its deadline
-- (finish_drain, SegmentsApi.finish_drains). SEGMENT_NOT_FOUND, ILLEGAL_CLIENT as unmount_segment.
local GRACEFUL_SPEC = { opts = { name = 'required', client_id = 'required', grace_ms = 'required' } }
local MAX_GRACE = 1000000000000000 -- 10^15 ms: now + it stays far below 2^53

local function graceful_unmount_segment(P, args)
  local call, err = parse_call(args, GRACEFUL_SPEC)
  if not call then return fail(E.INVALID_PARAMS, err) end
  local name, client = call.opts.name, call.opts.client_id
  local grace = int_arg(call.opts.grace_ms, 0, MAX_GRACE)
  if not valid_name(name, 1024) then return fail(E.INVALID_PARAMS, 'segment name must be 1-1024 bytes') end
  if not grace then return fail(E.INVALID_PARAMS, 'grace_ms must be an integer in [0, 10^15]') end
  local skey = P .. K.segment .. name
  local cur = redis.call('HMGET', skey, 'client', 'draining_until')
  if not cur[1] then return fail(E.SEGMENT_NOT_FOUND, 'segment ' .. name .. ' is not mounted') end
  if cur[1] ~= client then return fail(E.ILLEGAL_CLIENT, 'segment ' .. name .. ' belongs to another client') end
  local due, old = now_ms(P) + grace, tonumber(cur[2])
  if old and old <= due then return E.OK end
  redis.call('HSET', skey, 'draining_until', S(due))
  redis.call('ZADD', P .. K.segments_draining, S(due), name)
  if not old then new_mount_epoch(P) end -- calls that remembered the slice as allocatable forget it
  return E.OK
end

-- finish_drain. KEYS: P. ARGV: options name (required), op (check | drop | relist, default check).
-- check writes nothing and replies the slice's state: 'gone' (not mounted here), 'mounted'
-- (mounted, not draining), 'wait' (draining, bytes still in use and its deadline ahead) or
-- 'done' (draining, and empty or past its deadline).
-- drop: a draining slice is unmounted as unmount_segment unmounts (its replicas hide at once,
-- the worker sweeps them), whatever its state; a slice that is not draining is left alone; the
-- name leaves P:segs_draining either way. Reply 1 if a slice was dropped, else 0.
-- relist (fsck's repair): P:segs_draining is made to agree with the slice: a draining one is
-- listed with its deadline, any other name leaves it. Reply 1 if listed, else 0.
local FINISH_SPEC = { opts = { name = 'required', op = 'optional' } }

local function finish_drain(P, args)
  local call, err = parse_call(args, FINISH_SPEC)
  if not call then return fail(E.INVALID_PARAMS, err) end
  local name, op = call.opts.name, call.opts.op or 'check'
  if not valid_name(name, 1024) then return fail(E.INVALID_PARAMS, 'segment name must be 1-1024 bytes') end
  if op ~= 'check' and op ~= 'drop' and op ~= 'relist' then
    return fail(E.INVALID_PARAMS, 'op must be check, drop or relist')
  end
  local cur = redis.call('HMGET', P .. K.segment .. name, 'size', 'used', 'draining_until')
  local due = cur[1] and int_arg(cur[3] or '', 0, MAX_INT)
  if op == 'relist' then
    if due then redis.call('ZADD', P .. K.segments_draining, S(due), name) return 1 end
    redis.call('ZREM', P .. K.segments_draining, name)
    return 0
  end
  if op == 'drop' then
    redis.call('ZREM', P .. K.segments_draining, name)
    if cur[3] and drop_segment(P, name) then return 1 end
    return 0
  end
  if not cur[1] then return 'gone' end
  if not cur[3] then return 'mounted' end
  if (tonumber(cur[2]) or 0) == 0 or now_ms(P) >= (due or 0) then return 'done' end
  return 'wait'
end

-- sweep_replicas. KEYS: P. ARGV: options tenant; fields key.  Drops replicas on unmounted segments
-- and disk replicas on unmounted disk segments; an object left with no replica of either kind is
-- deleted, one left with only disk replicas stays (readable from disk). Reply: number of objects deleted.
local SWEEP_SPEC = keys_spec()

local function sweep_replicas(P, args)
  local call, err = object_call(args, SWEEP_SPEC)
  if not call then return err end
  local deleted = 0
  per_row(P, args, call, function(_, tenant, row, now)
    local key = row.key
    local okey = obj_key(P, tenant, key)
    local o = load_object(okey)
    if o then
      local memory, disks = #live_replicas(P, okey, o), #live_disk_replicas(P, okey, o)
      if memory == 0 and disks == 0 then
        delete_object(P, tenant, key, okey, o, nil, now)
        deleted = deleted + 1
      else
        if memory == 0 then settle_disk_only(P, tenant, key, okey, now) end
        Events.emit(P, 'updated', tenant, key, okey, o) -- its replicas on the unmounted segment went
      end
    end
    return 0
  end)
  return deleted
end

-- ping. KEYS: P. ARGV: option client_id. Reply: 1 if the client is known (has mounted and not
-- expired) and its ping time was recorded, 0 if it must remount.
local PING_SPEC = { opts = { client_id = 'required' } }

local function ping(P, args)
  local call, err = parse_call(args, PING_SPEC)
  if not call then return fail(E.INVALID_PARAMS, err) end
  local client = call.opts.client_id
  if not valid_name(client, 256) then return fail(E.INVALID_PARAMS, 'client_id must be 1-256 bytes') end
  if not redis.call('ZSCORE', P .. K.clients, client) then return 0 end
  redis.call('ZADD', P .. K.clients, S(now_ms(P)), client)
  return 1
end

register('mc_mount_segment', {}, mount_segment)
register('mc_unmount_segment', {}, unmount_segment, FREES)
register('mc_graceful_unmount_segment', {}, graceful_unmount_segment)
register('mc_finish_drain', {}, finish_drain, FREES)
register('mc_sweep_replicas', { 'kv_events_maxlen' }, sweep_replicas, FREES)
register('mc_ping', {}, ping, FREES)
