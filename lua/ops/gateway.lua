-- The Mooncake wire gateway's state (mooncake_redis/gateway): what Mooncake's protocol needs
-- beyond the store, kept on shard 0 so that any number of gateways share it and none holds any.
--   P:gwseg:<name> hash: uuid, client, endpoint, protocol, base, size of a segment mounted
--     through a gateway (the client addresses segments by UUID and reads the transfer
--     endpoint from the replica descriptors); P:gwsegids hash: segment uuid -> name;
--     P:gwsegs zset: name -> when gw_reap looks at it next.
--   P:gwmeta hash: the transfer engine's HTTP metadata (key -> value, opaque to the store).
--   P:gateways zset: gateway id -> heartbeat deadline ms; P:gateway:<id> hash: rpc, metadata.
-- Clients without a segment (readers) register on every shard with gw_register_client.
-- fsck audits the segment keys (mooncake_redis/fsck/gateway.py) and repairs them with
-- mc_fsck_gateway (below).

local K, E, fail, S, MAX_INT = Base.K, Base.E, Base.fail, Base.S, Base.MAX_INT
local int_arg, now_ms, valid_name = Base.int_arg, Base.now_ms, Base.valid_name
local parse_call, register, FREES = Base.parse_call, Base.register, Base.FREES

-- gw_segment_record. KEYS: P (shard 0). ARGV: options uuid, name, client_id, endpoint, protocol,
-- base, size (all required). Reply: 0. Called after the segment is mounted; a new uuid for the
-- name replaces the old one.
local GW_SEGMENT_SPEC = { opts = { uuid = 'required', name = 'required', client_id = 'required',
  endpoint = 'required', protocol = 'required', base = 'required', size = 'required' } }

local function gw_segment_record(P, args)
  local call, err = parse_call(args, GW_SEGMENT_SPEC)
  if not call then return fail(E.INVALID_PARAMS, err) end
  local o = call.opts
  if not valid_name(o.name, 1024) or not valid_name(o.uuid, 64) or not valid_name(o.client_id, 256)
      or not valid_name(o.endpoint, 1024) or not valid_name(o.protocol, 64) then
    return fail(E.INVALID_PARAMS, 'uuid, name, client_id, endpoint and protocol must be non-empty and bounded')
  end
  local base, size = int_arg(o.base, 0, MAX_INT), int_arg(o.size, 1, MAX_INT)
  if not base or not size or base + size > MAX_INT then
    return fail(E.INVALID_PARAMS, 'base and size must be integers, size > 0, base + size < 2^53')
  end
  local skey = P .. K.gw_segment .. o.name
  local old = redis.call('HGET', skey, 'uuid')
  if old and old ~= o.uuid then redis.call('HDEL', P .. K.gw_segment_ids, old) end
  redis.call('HSET', skey, 'uuid', o.uuid, 'client', o.client_id, 'endpoint', o.endpoint,
    'protocol', o.protocol, 'base', S(base), 'size', S(size))
  redis.call('HSET', P .. K.gw_segment_ids, o.uuid, o.name)
  redis.call('ZADD', P .. K.gw_segments, S(now_ms(P)), o.name)
  return E.OK
end

-- Drop a recorded segment's facts (and with `with_metadata`, its transfer-engine metadata).
local function gw_drop_segment(P, name, with_metadata)
  local skey = P .. K.gw_segment .. name
  local uuid = redis.call('HGET', skey, 'uuid')
  if uuid then redis.call('HDEL', P .. K.gw_segment_ids, uuid) end
  redis.call('DEL', skey)
  redis.call('ZREM', P .. K.gw_segments, name)
  if with_metadata then
    redis.call('HDEL', P .. K.gw_metadata, 'mooncake/ram/' .. name, 'mooncake/rpc_meta/' .. name)
  end
  return uuid and 1 or 0
end

-- gw_segment_forget. KEYS: P (shard 0). ARGV: option name. Reply: 1 if it was recorded, else 0.
-- After an unmount by the client itself (which then deletes its own metadata).
local GW_FORGET_SPEC = { opts = { name = 'required' } }

local function gw_segment_forget(P, args)
  local call, err = parse_call(args, GW_FORGET_SPEC)
  if not call then return fail(E.INVALID_PARAMS, err) end
  if not valid_name(call.opts.name, 1024) then return fail(E.INVALID_PARAMS, 'name must be 1-1024 bytes') end
  return gw_drop_segment(P, call.opts.name, false)
end

-- The rule gw_reap and fsck share: a recorded segment is mounted while its P:seg:<name> exists
-- on shard 0.
local function gw_mounted(P, name)
  return redis.call('EXISTS', P .. K.segment .. name) == 1
end

-- gw_reap. KEYS: P (shard 0). ARGV: max (1-1024). Looks at up to `max` recorded segments, the
-- least recently looked at first: one no longer mounted (its client expired, or a crash between
-- an unmount and its forget) loses its facts and its transfer-engine metadata
-- (mooncake/ram/<name>, mooncake/rpc_meta/<name>), so a new client on the same address is not
-- refused as a duplicate; a mounted one is looked at again later. Reply: segments reaped.
local function gw_reap(P, args)
  local max = int_arg(args[1], 1, 1024)
  if not max then return fail(E.INVALID_PARAMS, 'max must be an integer in [1, 1024]') end
  local now = now_ms(P)
  local reaped = 0
  for _, name in ipairs(redis.call('ZRANGEBYSCORE', P .. K.gw_segments, '-inf', S(now), 'LIMIT', 0, max)) do
    if gw_mounted(P, name) then
      redis.call('ZADD', P .. K.gw_segments, S(now + 1), name)
    else
      reaped = reaped + gw_drop_segment(P, name, true)
    end
  end
  return reaped
end

-- gw_metadata_put. KEYS: P (shard 0). ARGV: options key (1-1024 bytes), value (at most 1 MiB).
-- Reply: 'updated', 'unchanged' (the same value again), or 'duplicate' for a key with
-- "rpc_meta" whose stored value differs (Mooncake's metadata server refuses those: two
-- transfer engines must not claim one address; the newcomer picks another port).
local GW_META_PUT_SPEC = { opts = { key = 'required', value = 'required' } }

local function gw_metadata_put(P, args)
  local call, err = parse_call(args, GW_META_PUT_SPEC)
  if not call then return fail(E.INVALID_PARAMS, err) end
  local key, value = call.opts.key, call.opts.value
  if not valid_name(key, 1024) then return fail(E.INVALID_PARAMS, 'key must be 1-1024 bytes') end
  if #value > 1048576 then return fail(E.INVALID_PARAMS, 'value must be at most 1 MiB') end
  local old = redis.call('HGET', P .. K.gw_metadata, key)
  if old == value then return 'unchanged' end
  if old and string.find(key, 'rpc_meta', 1, true) then return 'duplicate' end
  redis.call('HSET', P .. K.gw_metadata, key, value)
  return 'updated'
end

-- gw_metadata_delete. KEYS: P (shard 0). ARGV: option key. Reply: 1 if it existed, else 0.
local GW_META_DEL_SPEC = { opts = { key = 'required' } }

local function gw_metadata_delete(P, args)
  local call, err = parse_call(args, GW_META_DEL_SPEC)
  if not call then return fail(E.INVALID_PARAMS, err) end
  if not valid_name(call.opts.key, 1024) then return fail(E.INVALID_PARAMS, 'key must be 1-1024 bytes') end
  return redis.call('HDEL', P .. K.gw_metadata, call.opts.key)
end

-- gw_register_client. KEYS: P (any shard; the gateway calls every shard). ARGV: option
-- client_id. Reply: 0. Makes a client without a segment known, as a mount does for a client
-- with one: its pings then answer OK, and the worker expires it when they stop.
local GW_CLIENT_SPEC = { opts = { client_id = 'required' } }

local function gw_register_client(P, args)
  local call, err = parse_call(args, GW_CLIENT_SPEC)
  if not call then return fail(E.INVALID_PARAMS, err) end
  local client = call.opts.client_id
  if not valid_name(client, 256) then return fail(E.INVALID_PARAMS, 'client_id must be 1-256 bytes') end
  redis.call('ZADD', P .. K.clients, S(now_ms(P)), client)
  redis.call('ZREM', P .. K.expired_clients, client)
  return E.OK
end

-- gw_heartbeat. KEYS: P (shard 0). ARGV: options id (1-256 bytes), rpc, metadata (addresses,
-- at most 256 bytes; metadata may be ''), ttl_ms (0-3600000; 0: the gateway leaves); optional
-- reads and read_hits (integers >= 0, default 0): the GetReplicaList keys the gateway served
-- since its last heartbeat, and those it answered with a replica, added to P.gw_reads and
-- P.gw_read_hits (CalcCacheStats). Reply: 0. Also drops up to 16 gateways whose heartbeat
-- deadline passed.
local GW_HEARTBEAT_SPEC = { opts = { id = 'required', rpc = 'required', metadata = 'required', ttl_ms = 'required',
  reads = 'optional', read_hits = 'optional' } }

local function gw_heartbeat(P, args)
  local call, err = parse_call(args, GW_HEARTBEAT_SPEC)
  if not call then return fail(E.INVALID_PARAMS, err) end
  local o = call.opts
  local ttl = int_arg(o.ttl_ms, 0, 3600000)
  if not valid_name(o.id, 256) or not valid_name(o.rpc, 256) or #o.metadata > 256 or not ttl then
    return fail(E.INVALID_PARAMS, 'id and rpc must be 1-256 bytes, metadata at most 256, ttl_ms in [0, 3600000]')
  end
  local reads, hits = int_arg(o.reads or '0', 0, MAX_INT), int_arg(o.read_hits or '0', 0, MAX_INT)
  if not reads or not hits or hits > reads then
    return fail(E.INVALID_PARAMS, 'reads and read_hits must be integers >= 0, read_hits at most reads')
  end
  if reads > 0 then redis.call('HINCRBY', P, 'gw_reads', S(reads)) end
  if hits > 0 then redis.call('HINCRBY', P, 'gw_read_hits', S(hits)) end
  local now = now_ms(P)
  for _, gone in ipairs(redis.call('ZRANGEBYSCORE', P .. K.gateways, '-inf', '(' .. S(now), 'LIMIT', 0, 16)) do
    redis.call('DEL', P .. K.gateway .. gone)
    redis.call('ZREM', P .. K.gateways, gone)
  end
  if ttl == 0 then
    redis.call('DEL', P .. K.gateway .. o.id)
    redis.call('ZREM', P .. K.gateways, o.id)
    return E.OK
  end
  redis.call('HSET', P .. K.gateway .. o.id, 'rpc', o.rpc, 'metadata', o.metadata, 'seen_at', S(now))
  redis.call('ZADD', P .. K.gateways, S(now + ttl), o.id)
  return E.OK
end

-- mc_fsck_gateway. KEYS: P (shard 0). ARGV: op, then its arguments; every argument is checked
-- before anything is written, and each op re-derives what it writes from the keys it reads:
--   'segment', name: from P:gwseg:<name> as it is now: with a record, P:gwsegids maps its uuid
--     to name and P:gwsegs lists name (added with score now, so gw_reap looks at it soon); a
--     uuid that P:gwsegids maps to another segment whose record holds that uuid too is left
--     alone (reply 'conflict'). Without a record, name leaves P:gwsegs. Reply: writes done.
--   'uuid', uuid: a P:gwsegids entry whose segment has no record, or a record with another uuid,
--     is deleted. Reply: 1 deleted, 0 left alone.
--   'reap', name: gw_reap's rule for one segment: not mounted, it is forgotten with its
--     transfer-engine metadata. Reply: 1 reaped, 0 left alone (mounted, or not recorded).
--   'unmounted', name...: (1-256 names) writes nothing; reply: the names that are not mounted
--     (gw_mounted), so fsck asks the rule instead of re-deriving it.
local function fsck_gateway(P, args)
  local op, n = args[1], #args
  if op == 'unmounted' then
    if n < 2 or n > 257 then return fail(E.INVALID_PARAMS, "'unmounted' takes 1-256 names") end
    for i = 2, n do
      if not valid_name(args[i], 1024) then return fail(E.INVALID_PARAMS, 'name must be 1-1024 bytes') end
    end
    local out = {}
    for i = 2, n do
      if not gw_mounted(P, args[i]) then out[#out + 1] = args[i] end
    end
    return out
  end
  if n ~= 2 then return fail(E.INVALID_PARAMS, 'expected op and one argument') end
  local arg = args[2]
  if op == 'uuid' then
    if not valid_name(arg, 64) then return fail(E.INVALID_PARAMS, 'uuid must be 1-64 bytes') end
    local name = redis.call('HGET', P .. K.gw_segment_ids, arg)
    if not name or redis.call('HGET', P .. K.gw_segment .. name, 'uuid') == arg then return 0 end
    return redis.call('HDEL', P .. K.gw_segment_ids, arg)
  end
  if not valid_name(arg, 1024) then return fail(E.INVALID_PARAMS, 'name must be 1-1024 bytes') end
  if op == 'reap' then
    if gw_mounted(P, arg) then return 0 end
    return gw_drop_segment(P, arg, true)
  end
  if op ~= 'segment' then return fail(E.INVALID_PARAMS, "op must be 'segment', 'uuid', 'reap' or 'unmounted'") end
  local uuid = redis.call('HGET', P .. K.gw_segment .. arg, 'uuid')
  if not uuid then return redis.call('ZREM', P .. K.gw_segments, arg) end
  local writes = 0
  local holder = redis.call('HGET', P .. K.gw_segment_ids, uuid)
  if holder ~= arg then
    if holder and redis.call('HGET', P .. K.gw_segment .. holder, 'uuid') == uuid then return 'conflict' end
    redis.call('HSET', P .. K.gw_segment_ids, uuid, arg)
    writes = 1
  end
  if not redis.call('ZSCORE', P .. K.gw_segments, arg) then
    redis.call('ZADD', P .. K.gw_segments, S(now_ms(P)), arg)
    writes = writes + 1
  end
  return writes
end

register('mc_gw_segment_record', {}, gw_segment_record)
register('mc_gw_segment_forget', {}, gw_segment_forget, FREES)
register('mc_gw_reap', {}, gw_reap, FREES)
register('mc_gw_metadata_put', {}, gw_metadata_put)
register('mc_gw_metadata_delete', {}, gw_metadata_delete, FREES)
register('mc_gw_register_client', {}, gw_register_client)
register('mc_gw_heartbeat', {}, gw_heartbeat)
register('mc_fsck_gateway', {}, fsck_gateway)
