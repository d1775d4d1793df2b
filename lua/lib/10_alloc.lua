-- Extent allocator, one per (shard, segment). Free extents live in two sorted sets:
--   P:free:<seg>:by_off   member = offset, score = offset   (neighbour lookup for coalescing)
--   P:free:<seg>:by_size  member = offset, score = length   (best fit)
-- (within a batch, the extent it carves or grows is written back when the batch ends:
-- settle_carve, settle_grown; its counters are the ledger's, lua/lib/05_ledger.lua)
-- Byte accounting is kept in three places that fsck can recompute:
--   P:seg:<seg>.used, P:segs (score = free bytes of the segment), P.used_bytes
-- and a segment mounted with a host is a member of P:hsegs:<host> while it is mounted.

local tonumber_, match_, huge_ -- (bound at the first call: Base.on_first_call)
Base.on_first_call(function() tonumber_, match_, huge_ = tonumber, string.match, math.huge end)
local K, S, HEAD_CACHE_MAX = Base.K, Base.S, Base.HEAD_CACHE_MAX
local mount_table, new_mount_epoch = Base.mount_table, Base.new_mount_epoch
local held_due, set_held_due = Base.held_due, Base.set_held_due
local CALL, account = Base.CALL, Ledger.account

-- The two keys of a segment's free lists, memoised per shard and segment: every allocation and
-- free needs them, and building them is three new strings. Bounded like HEAD_CACHE.
local FREE_KEYS, free_keys_seen = {}, 0
local function free_keys(P, seg)
  local pair = FREE_KEYS[P] and FREE_KEYS[P][seg]
  if not pair then
    if free_keys_seen >= HEAD_CACHE_MAX then FREE_KEYS, free_keys_seen = {}, 0 end
    FREE_KEYS[P] = FREE_KEYS[P] or {}
    local base = P .. K.free .. seg
    pair = { base .. K.free_by_off, base .. K.free_by_size }
    FREE_KEYS[P][seg], free_keys_seen = pair, free_keys_seen + 1
  end
  return pair[1], pair[2]
end

local function add_free(by_off, by_size, off, len)
  local m = S(off)
  redis.call('ZADD', by_off, off, m)
  redis.call('ZADD', by_size, len, m)
end

-- A batch's carving (within with_ledger): the free extent of a segment its allocations took
-- from and has not written back. The free lists still list it by its first offset `orig` with
-- the length it had; its free part is now [off, off + len). It was found by a best-fit query
-- for `least` bytes, and no extent of the segment has been freed since (free_extent settles it
-- first), so for any size from `least` to len no other extent fits better: such allocations
-- take from it with no command, and the free lists get one update when the call ends.
local function settle_carve(P, l, seg)
  local c = l.carve[seg]
  if not c then return end
  l.carve[seg] = nil
  local by_off, by_size = free_keys(P, seg)
  redis.call('ZREM', by_off, c.orig)
  redis.call('ZREM', by_size, c.orig)
  if c.len > 0 then add_free(by_off, by_size, c.off, c.len) end
end

-- A batch's growing free extent (within with_ledger): the one its last free on a segment made or
-- grew. The free lists list it at its offset `orig` (by_off is exact) with the length it had
-- then (by_size lags); its length is now `len`. A free that starts where it ends grows it with
-- one query (for the neighbour after), as frees in address order do (LRU eviction of a fill);
-- an allocation, another free on the segment or the call's end writes its length.
local function settle_grown(P, l, seg)
  local g = l.grown[seg]
  if not g then return end
  l.grown[seg] = nil
  local _, by_size = free_keys(P, seg)
  redis.call('ZADD', by_size, g.len, g.orig)
end

-- The free lists of `seg` as they are, for a query of them.
local function settle_segment(P, l, seg)
  if l.carve[seg] then settle_carve(P, l, seg) end
  if l.grown[seg] then settle_grown(P, l, seg) end
end

-- When a ledger ends: every segment with a carving or a grown extent (l.pending, in order).
Ledger.at_end(function(P, l)
  for i = 1, #l.pending do settle_segment(P, l, l.pending[i]) end
end)

-- Is the segment's slice being unmounted gracefully (field draining_until: lua/ops/segments.lua)?
-- Such a slice takes no new extent. Remembered with the mount ids (a drain's start changes the
-- shard's mount epoch).
local function draining(P, seg)
  local known = mount_table(P)
  if known then
    known.drain = known.drain or {}
    if known.drain[seg] ~= nil then return known.drain[seg] end
  end
  local d = redis.call('HGET', P .. K.segment .. seg, 'draining_until') ~= false
  if known then known.drain[seg], known.n = d, known.n + 1 end
  return d
end

-- The size of a segment's slice on this shard (0: not mounted), remembered with the mount ids.
local function slice_size(P, seg)
  local known = mount_table(P)
  if known then
    known.size = known.size or {}
    local n = known.size[seg]
    if n then return n end
  end
  local n = tonumber_(redis.call('HGET', P .. K.segment .. seg, 'size')) or 0
  if known then known.size[seg], known.n = n, known.n + 1 end
  return n
end

-- P:hsegs:<host>: the set of the segments mounted on this shard with that host (mount_segment's
-- option host), at most MAX_HOST_SEGMENTS; what put_start's prefer_same_host tries first.
local MAX_HOST_SEGMENTS = 64
local function host_key(P, host) return P .. K.host_segments .. host end

-- Best fit: the smallest free extent that holds `size`; returns the offset or nil (none, or
-- the slice is draining). Within a batch (with_ledger) the extent a put carves from stays the
-- batch's carving (settle_carve) until an allocation it cannot serve, a free, or the call's end.
local function alloc_extent(P, seg, size)
  if draining(P, seg) then return nil end
  local l = CALL.ledger
  local c = l and l.carve[seg]
  if c then
    if size >= c.least and size <= c.len then
      local off = c.off
      c.off, c.len = off + size, c.len - size
      account(P, seg, size)
      return off
    end
  end
  if l then settle_segment(P, l, seg) end -- the free lists as they are, for the query
  local by_off, by_size = free_keys(P, seg)
  local hit = redis.call('ZRANGEBYSCORE', by_size, size, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if #hit == 0 then return nil end
  local off, len = tonumber_(hit[1]), tonumber_(hit[2])
  if l and len > size then
    l.carve[seg] = { orig = hit[1], off = off + size, len = len - size, least = size }
    l.pending[#l.pending + 1] = seg
  else
    redis.call('ZREM', by_off, hit[1])
    redis.call('ZREM', by_size, hit[1])
    if len > size then add_free(by_off, by_size, off + size, len - size) end
  end
  account(P, seg, size)
  return off
end

-- Return an extent to the free lists, merging it with free neighbours on both sides. Everything
-- is read before anything is written: an extent that overlaps a free one (a double free: drift
-- that fsck reports) is left alone and false is returned, so a caller never half-frees, never
-- subtracts bytes twice, and never makes allocated bytes allocatable again.
local function free_extent(P, seg, off, size)
  local l = CALL.ledger
  local by_off, by_size = free_keys(P, seg)
  local stop = off + size
  local g = l and l.grown[seg]
  if g and g.off + g.len == off then -- it grows the batch's free extent (settle_grown)
    local nxt = redis.call('ZRANGEBYSCORE', by_off, S(off), S(stop), 'LIMIT', 0, 1)[1]
    if nxt and (tonumber_(nxt) or -1) < stop then return false end
    local nlen = nxt and (tonumber_(redis.call('ZSCORE', by_size, nxt)) or 0) or 0
    account(P, seg, 0 - size)
    g.len = g.len + size + nlen
    if nxt then
      redis.call('ZREM', by_off, nxt)
      redis.call('ZREM', by_size, nxt)
    end
    return true
  end
  if g and stop == g.off then -- it grows it from the front (frees in falling address order)
    if redis.call('ZRANGEBYSCORE', by_off, S(off), '(' .. S(stop), 'LIMIT', 0, 1)[1] then return false end
    local prev = redis.call('ZREVRANGEBYSCORE', by_off, '(' .. S(off), '-inf', 'LIMIT', 0, 1)[1]
    local plen = prev and tonumber_(redis.call('ZSCORE', by_size, prev))
    local poff = plen and tonumber_(prev)
    if plen and poff + plen > off then return false end
    account(P, seg, 0 - size)
    redis.call('ZREM', by_off, g.orig)
    redis.call('ZREM', by_size, g.orig)
    if plen and poff + plen == off then
      g.orig, g.off, g.len = prev, poff, plen + size + g.len
    else
      redis.call('ZADD', by_off, off, S(off)) -- (by_size gets it from settle_grown)
      g.orig, g.off, g.len = S(off), off, size + g.len
    end
    return true
  end
  if l then settle_segment(P, l, seg) end -- its neighbours as the lists say
  local prev = redis.call('ZREVRANGEBYSCORE', by_off, '(' .. S(off), '-inf', 'LIMIT', 0, 1)[1]
  -- the first free extent starting in [off, stop]: inside the extent is a double free, at stop
  -- it is the next neighbour (a member is its offset, as is its score)
  local nxt = redis.call('ZRANGEBYSCORE', by_off, S(off), S(stop), 'LIMIT', 0, 1)[1]
  if nxt and (tonumber_(nxt) or -1) < stop then return false end -- (a member not a number: drift, refuse)
  local plen, nlen -- the neighbours' lengths: one read for both
  if prev and nxt then
    local lens = redis.call('ZMSCORE', by_size, prev, nxt)
    plen, nlen = tonumber_(lens[1]), tonumber_(lens[2])
  elseif prev then
    plen = tonumber_(redis.call('ZSCORE', by_size, prev))
  elseif nxt then
    nlen = tonumber_(redis.call('ZSCORE', by_size, nxt))
  end
  local poff = plen and tonumber_(prev) -- (a member is its offset)
  if plen and poff + plen > off then return false end
  account(P, seg, 0 - size)
  if nlen then
    stop = stop + nlen
    redis.call('ZREM', by_off, nxt)
    redis.call('ZREM', by_size, nxt)
  end
  if plen and poff + plen == off then
    -- merged into the free extent before it, which keeps its offset (its member and by_off
    -- score): only its length grows. Frees in address order (LRU eviction of a fill) mostly
    -- end here, with one write instead of four (in a batch, none: settle_grown).
    if l then
      l.grown[seg] = { orig = prev, off = poff, len = stop - poff }
      l.pending[#l.pending + 1] = seg
    else
      redis.call('ZADD', by_size, stop - poff, prev)
    end
  elseif l then
    redis.call('ZADD', by_off, off, S(off)) -- (by_size gets it from settle_grown)
    l.grown[seg] = { orig = S(off), off = off, len = stop - off }
    l.pending[#l.pending + 1] = seg
  else
    add_free(by_off, by_size, off, stop - off)
  end
  return true
end

-- An unmounted segment's guaranteed bytes (its fields g:<tenant>, see 25_guarantee.lua) leave
-- the shard's and the tenants' counts. `fields` is the segment hash as a flat HGETALL.
local function forget_segment_guarantees(P, fields)
  for i = 1, #fields, 2 do
    local tenant = match_(fields[i], '^g:(.*)$')
    local bytes = tonumber_(fields[i + 1]) or 0
    if tenant and bytes ~= 0 then
      redis.call('HINCRBY', P, 'guaranteed_bytes', S(0 - bytes))
      redis.call('HINCRBY', P .. K.guaranteed_tenants, tenant, S(0 - bytes))
    end
  end
end

-- Unmount a segment from this shard: its bytes leave the books and its replicas become
-- unreadable at once (their mount id no longer matches). P:sweep_pending is bumped so that a
-- worker removes the dead replicas from the object hashes even if the caller dies first.
-- Returns false when the segment is not mounted here.
local function drop_segment(P, name)
  local l = CALL.ledger
  if l then -- it reads the segment's counters and drops its free lists
    settle_segment(P, l, name)
    Ledger.settle_counters(P)
  end
  local skey = P .. K.segment .. name
  local cur = redis.call('HMGET', skey, 'size', 'used', 'host')
  if not cur[1] then return false end
  if cur[3] then redis.call('SREM', host_key(P, cur[3]), name) end
  forget_segment_guarantees(P, redis.call('HGETALL', skey))
  redis.call('HINCRBY', P, 'capacity_bytes', S(0 - tonumber_(cur[1])))
  redis.call('HINCRBY', P, 'used_bytes', S(0 - (tonumber_(cur[2]) or 0)))
  local by_off, by_size = free_keys(P, name)
  redis.call('DEL', skey, by_off, by_size)
  redis.call('ZREM', P .. K.segments, name)
  redis.call('INCR', P .. K.sweep_pending)
  new_mount_epoch(P)
  return true
end

-- The mount id of a mounted segment, or nil. Remembered between calls while the shard's mount
-- epoch holds (Base.mount_table); `cache` (optional, one per call) memoises it for a store
-- without an epoch yet.
local function mount_of(P, seg, cache)
  local known = mount_table(P)
  local memo = known and known.seg or cache
  if memo then
    local m = memo[seg]
    if m ~= nil then return m or nil end
  end
  local mount = redis.call('HGET', P .. K.segment .. seg, 'mount')
  if memo then memo[seg] = mount or false end
  if known then known.n = known.n + 1 end
  return mount
end

-- Extents of preempted puts stay allocated until their release deadline (the old writer may
-- still be writing into them). P:held: member "<mount> <offset> <size> <segment>", score = due ms.
-- A held extent's member of P:held: "<mount id> <offset> <size> <segment>".
local function held_member(mount, off, size, seg) return mount .. ' ' .. S(off) .. ' ' .. S(size) .. ' ' .. seg end

-- P:config's held_due bounds P:held from below (Base.held_due), so that put_start sweeps only
-- when an entry may be due: a new entry lowers it, a sweep that found every due entry sets it to
-- the next one's deadline ('none': no entry). Entries removed otherwise (a replication that ends)
-- leave it low, which costs one sweep that finds nothing. Absent (a store written before it, or
-- fsck dropped it): the next sweep finds out.
local function hold_extent(P, seg, mount, off, size, due)
  redis.call('ZADD', P .. K.held, due, held_member(mount, off, size, seg))
  local bound = held_due(P) -- as the call read it with its configuration, else read now
  if not bound then
    local raw = redis.call('HGET', P .. K.config, 'held_due')
    bound = raw == 'none' and huge_ or tonumber_(raw)
  end
  if bound and due < bound then set_held_due(P, due) end -- (absent or malformed: unknown, left so)
end

-- Until when the extents of an abandoned put by `writer` (started at `started`) stay held: the
-- release timeout, or nil (free them at once) when the writer was expired by the client-TTL
-- cleanup (P:expired_clients): an expired client is no longer writing.
local function hold_until(P, writer, started, release_timeout)
  if writer and redis.call('ZSCORE', P .. K.expired_clients, writer) then return nil end
  return started + release_timeout
end

-- Set the held_due bound to the first deadline of P:held ('none': empty), unless `bound` (as
-- read: Base.held_due) says so already. Returns the bound.
local function rebound_held(P, bound)
  local nxt = redis.call('ZRANGE', P .. K.held, 0, 0, 'WITHSCORES')[2]
  nxt = nxt and tonumber_(nxt) or 'none'
  if nxt ~= bound and not (nxt == 'none' and bound == huge_) then set_held_due(P, nxt) end
  return nxt
end

-- Free up to `limit` held extents whose deadline has passed (extents of unmounted segments
-- are simply dropped: their bytes left the books at unmount). Nothing to look at while the
-- call's held_due bound (read with its configuration) lies ahead, unless `always` (the
-- workers' sweep, which so also mends a bound left too late).
local function release_held(P, now, limit, always)
  local bound = held_due(P)
  if bound and now < bound and not always then return 0 end
  local due = redis.call('ZRANGEBYSCORE', P .. K.held, '-inf', S(now), 'LIMIT', 0, limit)
  for _, entry in ipairs(due) do
    local mount, off, size, seg = match_(entry, '^(%d+) (%d+) (%d+) (.*)$')
    if mount and mount_of(P, seg) == mount then free_extent(P, seg, tonumber_(off), tonumber_(size)) end
    redis.call('ZREM', P .. K.held, entry)
  end
  if #due < limit then rebound_held(P, bound) end -- none left due: the next entry's deadline is the bound
  return #due
end

return {
  free_keys = free_keys, add_free = add_free, alloc_extent = alloc_extent,
  free_extent = free_extent, drop_segment = drop_segment, mount_of = mount_of, slice_size = slice_size,
  host_key = host_key, MAX_HOST_SEGMENTS = MAX_HOST_SEGMENTS,
  hold_extent = hold_extent, hold_until = hold_until, release_held = release_held, rebound_held = rebound_held,
  held_member = held_member, draining = draining,
}
