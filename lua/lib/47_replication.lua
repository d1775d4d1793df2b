-- Replica copy and move (Mooncake's CopyStart/End/Revoke, MoveStart/End/Revoke): a client adds
-- memory replicas of a complete object on named segments (copy), or puts its replica on one
-- segment onto another (move), in three steps: start allocates the targets, the client writes
-- the bytes, end makes them replicas (revoke gives them back). One replication per object at a
-- time. While it runs the object has the fields
--   repl_kind (copy | move), repl_client, repl_source (the segment copied from), repl_until (ms:
--   past it the replication is abandoned), repl_reps (the targets, encoded as `reps`; absent
--   when every target already had a replica)
-- and one task reference (the object, or its unit, is protected from eviction and from remove
-- without force). The targets' extents are held extents (P:held, due at repl_until), so readers
-- never see them before end, fsck counts them as allocated, and the bytes of an abandoned one
-- come back by themselves (release_held). P:repl_due (zset "<tenant>:<key>" -> repl_until)
-- lists them for sweep_replications. An added replica changes no lease, pin, guarantee
-- deadline or group retention; a guaranteed object's new replicas count in its guaranteed
-- bytes. Deadline: put_start_discard_timeout after start (a replication as old as an abandoned
-- put is abandoned).

local K, E, S = Base.K, Base.E, Base.S
local alloc_extent, free_extent, hold_extent, mount_of = Alloc.alloc_extent, Alloc.free_extent, Alloc.hold_extent,
  Alloc.mount_of
local draining = Alloc.draining
local obj_key, obj_id, load_object = Object.obj_key, Object.obj_id, Object.load_object
local decode_reps, write_reps, live_replicas = Object.decode_reps, Object.write_reps, Object.live_replicas
local guarantee_room, count_guaranteed = Guarantee.guarantee_room, Guarantee.count_guaranteed
local being_evicted, lease_of = Units.being_evicted, Units.lease_of
local add_task_refs = Offload.add_task_refs

local REPL_FIELDS = { 'repl_kind', 'repl_client', 'repl_source', 'repl_until', 'repl_reps' }
local MAX_TARGETS = 64

local function held_member(r, size) return Alloc.held_member(r.mount, r.off, size, r.seg) end

-- The replication in flight on `o`, or nil.
local function replication_of(o)
  if not o.repl_kind then return nil end
  return { kind = o.repl_kind, client = o.repl_client, source = o.repl_source, until_ms = tonumber(o.repl_until) or 0,
    targets = o.repl_reps and decode_reps(o.repl_reps) or {} }
end

-- The replication's fields and index entry go, and its task reference.
local function clear(P, tenant, key, okey, o, now)
  redis.call('HDEL', okey, unpack(REPL_FIELDS))
  for _, f in ipairs(REPL_FIELDS) do o[f] = nil end
  redis.call('ZREM', P .. K.repl_due, obj_id(tenant, key))
  if (tonumber(o.task_refs) or 0) > 0 then add_task_refs(P, tenant, key, okey, o, -1, now) end
end

-- Give the targets' extents back (those still held: an abandoned one's may have been released).
local function free_targets(P, targets, size)
  for _, r in ipairs(targets) do
    if redis.call('ZREM', P .. K.held, held_member(r, size)) == 1 and mount_of(P, r.seg) == r.mount then
      free_extent(P, r.seg, r.off, size)
    end
  end
end

local function revoke(P, tenant, key, okey, o, now)
  free_targets(P, replication_of(o).targets, tonumber(o.size) or 0)
  clear(P, tenant, key, okey, o, now)
end

-- The object and its live replication for a step of `client`; a replication past its deadline
-- is revoked on the way (then there is none). Returns o, repl, okey or nil and a code.
local function current(P, tenant, key, now)
  local okey = obj_key(P, tenant, key)
  local o = load_object(okey)
  if not o or o.status ~= 'complete' or being_evicted(P, tenant, o) then return nil, E.OBJECT_NOT_FOUND end
  local repl = replication_of(o)
  if repl and repl.until_ms <= now then
    revoke(P, tenant, key, okey, o, now)
    repl = nil
  end
  return o, repl, okey
end

-- Start a replication: allocate the targets that have no replica of the object yet.
-- Returns {size, source segment, source offset, target segment, target offset, ...} or a code.
local function start(P, tenant, key, kind, client, source, targets, now, cfg)
  local o, repl, okey = current(P, tenant, key, now)
  if not o then return repl end
  if repl then return E.OBJECT_HAS_REPLICATION_TASK end
  for _, seg in ipairs(targets) do
    if not mount_of(P, seg) then return E.SEGMENT_NOT_FOUND end
    if draining(P, seg) then return E.UNAVAILABLE_IN_CURRENT_STATUS end
  end
  local have, src = {}, nil
  for _, r in ipairs(live_replicas(P, okey, o)) do
    have[r.seg] = true
    if r.seg == source then src = r end
  end
  if not src then return E.REPLICA_NOT_FOUND end
  local size, want = tonumber(o.size), {}
  for _, seg in ipairs(targets) do
    if not have[seg] then have[seg] = true; want[#want + 1] = seg end
  end
  if o.guaranteed_until and not guarantee_room(P, tenant, size * #want, cfg) then
    return E.GUARANTEED_CAPACITY_EXCEEDED
  end
  local until_ms, got = now + cfg.put_start_discard_timeout, {}
  for _, seg in ipairs(want) do
    local off = alloc_extent(P, seg, size)
    if not off then
      for _, r in ipairs(got) do free_extent(P, r.seg, r.off, size) end
      return E.NO_AVAILABLE_HANDLE
    end
    got[#got + 1] = { seg = seg, off = off, mount = mount_of(P, seg) }
  end
  local reply = { size, src.seg, src.off }
  for _, r in ipairs(got) do
    hold_extent(P, r.seg, r.mount, r.off, size, until_ms)
    reply[#reply + 1] = r.seg
    reply[#reply + 1] = r.off
  end
  local fields = { 'repl_kind', kind, 'repl_client', client, 'repl_source', source, 'repl_until', S(until_ms) }
  if #got > 0 then fields[#fields + 1] = 'repl_reps'; fields[#fields + 1] = Object.encode_reps(got) end
  redis.call('HSET', okey, unpack(fields))
  for i = 1, #fields, 2 do o[fields[i]] = fields[i + 1] end
  redis.call('ZADD', P .. K.repl_due, S(until_ms), obj_id(tenant, key))
  add_task_refs(P, tenant, key, okey, o, 1, now)
  return reply
end

-- The object and replication for end or revoke by `client` of a replication of `kind`.
local function owned(P, tenant, key, kind, client, now)
  local o, repl, okey = current(P, tenant, key, now)
  if not o then return nil, repl end
  if not repl then return nil, E.OBJECT_NO_REPLICATION_TASK end
  if repl.client ~= client then return nil, E.ILLEGAL_CLIENT end
  if repl.kind ~= kind then return nil, E.INVALID_PARAMS end
  return o, repl, okey
end

-- A moved-away extent stays allocated while the object's lease runs (readers that hold the
-- replica keep reading it), as upsert's replaced extents do.
local function retire_extent(P, tenant, key, o, r, size, now)
  local lease = lease_of(P, tenant, key, o)
  if lease > now then hold_extent(P, r.seg, r.mount, r.off, size, lease) else free_extent(P, r.seg, r.off, size) end
end

-- End a replication: the targets still held on a live mount become replicas; a move then drops
-- its source. Returns OK, or REPLICA_IS_GONE when the source or a target died meanwhile (the
-- live targets are kept for a copy; a move whose target died keeps its source).
local function finish(P, tenant, key, kind, client, now)
  local o, repl, okey = owned(P, tenant, key, kind, client, now)
  if not o then return repl end
  local size = tonumber(o.size)
  local list = live_replicas(P, okey, o)
  local src_at = nil
  for i, r in ipairs(list) do if r.seg == repl.source then src_at = i end end
  if not src_at then
    revoke(P, tenant, key, okey, o, now)
    return E.REPLICA_IS_GONE
  end
  local gone, added = false, 0
  for _, r in ipairs(repl.targets) do
    if redis.call('ZREM', P .. K.held, held_member(r, size)) == 1 and mount_of(P, r.seg) == r.mount then
      list[#list + 1] = r
      added = added + 1
      if o.guaranteed_until then count_guaranteed(P, tenant, r.seg, size) end
    else
      gone = true
    end
  end
  -- a move drops its source once the target is a live replica (one that had a replica already
  -- at start counts, while it lives)
  local moved = kind == 'move' and not gone and #list > 1
  if moved then
    local src = table.remove(list, src_at)
    if o.guaranteed_until then count_guaranteed(P, tenant, src.seg, 0 - size) end
    retire_extent(P, tenant, key, o, src, size, now)
  end
  write_reps(okey, o, list)
  clear(P, tenant, key, okey, o, now)
  if moved or added > 0 then Events.emit(P, 'updated', tenant, key, okey, o) end
  return gone and E.REPLICA_IS_GONE or E.OK
end

local function cancel(P, tenant, key, kind, client, now)
  local o, repl, okey = owned(P, tenant, key, kind, client, now)
  if not o then return repl end
  revoke(P, tenant, key, okey, o, now)
  return E.OK
end

-- Revoke up to `limit` replications past their deadline (a stale index entry is dropped).
local function sweep_replications(P, now, limit)
  local index, n = P .. K.repl_due, 0
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', index, '-inf', S(now), 'LIMIT', 0, limit)) do
    local tenant, key = string.match(id, '^([^:]+):(.*)$')
    local okey = tenant and obj_key(P, tenant, key)
    local o = okey and load_object(okey)
    local repl = o and replication_of(o)
    if repl and repl.until_ms <= now then
      revoke(P, tenant, key, okey, o, now)
      n = n + 1
    elseif repl then
      redis.call('ZADD', index, S(repl.until_ms), id)
    else
      redis.call('ZREM', index, id)
    end
  end
  return n
end

return {
  MAX_TARGETS = MAX_TARGETS, start = start, finish = finish, cancel = cancel,
  sweep_replications = sweep_replications,
}
