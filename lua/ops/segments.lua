-- Segments and clients. A segment of `size` bytes at `base` is split into one slice per shard
-- (slice i = [base + floor(i*size/shards), base + floor((i+1)*size/shards)) ); each shard
-- allocates only inside its own slice. P:seg:<name> hash: client, base, size, used, mount,
-- mounted_at. P:segs zset: segment -> free bytes. P:clients zset: client -> last ping ms.

-- mount_segment. KEYS: P. ARGV: name, client_id, slice_base, slice_size. Reply: 0 (OK).
-- Idempotent: mounting the same name again with the same client, base and size is OK.
local function mount_segment(keys, args)
  local P, name, client = keys[1], args[1], args[2]
  local base, size = int_arg(args[3], 0, MAX_INT), int_arg(args[4], 1, MAX_INT)
  if not valid_name(name, 1024) then return fail(E.INVALID_PARAMS, 'segment name must be 1-1024 bytes') end
  if not valid_name(client, 256) then return fail(E.INVALID_PARAMS, 'client_id must be 1-256 bytes') end
  if not base or not size or base + size > MAX_INT then
    return fail(E.INVALID_PARAMS, 'base and size must be integers, size > 0, base + size < 2^53')
  end
  local skey = P .. ':seg:' .. name
  local now = now_ms(P)
  redis.call('ZADD', P .. ':clients', now, client)
  local cur = redis.call('HMGET', skey, 'client', 'base', 'size')
  if cur[1] then
    if cur[1] == client and tonumber(cur[2]) == base and tonumber(cur[3]) == size then return E.OK end
    return fail(E.SEGMENT_ALREADY_EXISTS, 'segment ' .. name .. ' is mounted with other parameters')
  end
  local mount = redis.call('INCR', P .. ':mount_seq')
  redis.call('HSET', skey, 'client', client, 'base', S(base), 'size', S(size), 'used', 0,
    'mount', mount, 'mounted_at', S(now))
  local by_off, by_size = free_keys(P, name)
  add_free(by_off, by_size, base, size)
  redis.call('ZADD', P .. ':segs', size, name)
  redis.call('HINCRBY', P, 'capacity_bytes', size)
  return E.OK
end

-- unmount_segment. KEYS: P. ARGV: name, client_id. Reply: 0 (OK).
-- The segment's replicas become unreadable at once (their mount id no longer matches);
-- sweep_replicas then removes them from the object hashes in bounded batches (the caller, or a
-- worker when P:sweep_pending is set).
local function unmount_segment(keys, args)
  local P, name, client = keys[1], args[1], args[2]
  local owner = redis.call('HGET', P .. ':seg:' .. tostring(name), 'client')
  if not owner then return fail(E.SEGMENT_NOT_FOUND, 'segment ' .. tostring(name) .. ' is not mounted') end
  if owner ~= client then return fail(E.ILLEGAL_CLIENT, 'segment ' .. name .. ' belongs to another client') end
  drop_segment(P, name)
  return E.OK
end

-- sweep_replicas. KEYS: P. ARGV: tenant, key...  Drops replicas on unmounted segments;
-- an object left with no replica is deleted. Reply: number of objects deleted.
local function sweep_replicas(keys, args)
  local P, tenant = keys[1], args[1]
  if not valid_tenant(tenant) then return fail(E.INVALID_PARAMS, 'bad tenant_id') end
  local deleted, now = 0, now_ms(P)
  for i = 2, #args do
    local okey = obj_key(P, tenant, args[i])
    local o = load_object(okey)
    if o and #live_replicas(P, okey, o) == 0 then
      delete_object(P, tenant, args[i], okey, o, nil, now)
      deleted = deleted + 1
    end
  end
  return deleted
end

-- ping. KEYS: P. ARGV: client_id. Reply: 1 if the client is known (has mounted and not
-- expired) and its ping time was recorded, 0 if it must remount.
local function ping(keys, args)
  local P, client = keys[1], args[1]
  if not valid_name(client, 256) then return fail(E.INVALID_PARAMS, 'client_id must be 1-256 bytes') end
  if not redis.call('ZSCORE', P .. ':clients', client) then return 0 end
  redis.call('ZADD', P .. ':clients', now_ms(P), client)
  return 1
end

redis.register_function('mc_mount_segment', mount_segment)
redis.register_function('mc_unmount_segment', unmount_segment)
redis.register_function('mc_sweep_replicas', sweep_replicas)
redis.register_function('mc_ping', ping)
