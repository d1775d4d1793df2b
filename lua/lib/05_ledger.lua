-- The ledger of a batch: what a call of many keys (a batched put_start, put_end or remove, an
-- eviction step) may write once at its end instead of once a key: the shard counters (summed),
-- sorted-set writes that nothing in the call reads again (queued), and the allocator's carved
-- and grown free extents (Alloc: settled by the hook it registers). Outside with_ledger every
-- write goes at once. The ledger lives in Base.CALL, so a call never sees another's.

local K, S, CALL = Base.K, Base.S, Base.CALL

-- The shard counters an allocation, a free or an object's end changes: the segment's used
-- bytes (P:seg:<seg>.used and its P:segs score) and the shard's used_bytes and objects. Written
-- at once, or, within with_ledger, summed per segment and written when its loop ends: an
-- eviction step that frees a hundred extents of one segment writes four counters, not four
-- hundred.
local function write_segment(P, seg, delta)
  redis.call('HINCRBY', P .. K.segment .. seg, 'used', S(delta))
  redis.call('ZINCRBY', P .. K.segments, S(0 - delta), seg)
end

local function write_counters(P, segs, order, used, objects)
  for i = 1, #order do
    local seg = order[i]
    if segs[seg] ~= 0 then write_segment(P, seg, segs[seg]) end
  end
  if used ~= 0 then redis.call('HINCRBY', P, 'used_bytes', S(used)) end
  if objects ~= 0 then redis.call('HINCRBY', P, 'objects', S(objects)) end
end

local function account(P, seg, delta)
  local l = CALL.ledger
  if l then
    local cur = l.segs[seg]
    if cur == nil then l.order[#l.order + 1] = seg end
    l.segs[seg], l.used = (cur or 0) + delta, l.used + delta
    return
  end
  write_segment(P, seg, delta)
  redis.call('HINCRBY', P, 'used_bytes', S(delta))
end

-- An object more (1) or fewer (-1) on the shard.
local function count_objects(P, delta)
  local l = CALL.ledger
  if l then l.objects = l.objects + delta else redis.call('HINCRBY', P, 'objects', delta) end
end

-- A sorted-set write a batch may leave to its end, when nothing in the call reads the entry
-- again (put_end's: the processing entry it drops, the tier entry of an object it completes):
-- within with_ledger one variadic ZADD (ZREM) per key for the whole call, else at once.
local function defer_z(l, kind, key, a, b)
  local q = l[kind][key]
  if not q then
    q = {}
    l[kind][key] = q
    l.zorder[#l.zorder + 1] = key
  end
  q[#q + 1] = a
  if b then q[#q + 1] = b end
end
local function defer_zadd(key, score, member)
  local l = CALL.ledger
  if l then defer_z(l, 'zadd', key, score, member) else redis.call('ZADD', key, score, member) end
end
-- (A member the call added and now removes loses its queued ZADD: the end writes every ZREM of
-- a key before its ZADD, so a member removed and then added again stays.)
local function defer_zrem(key, member)
  local l = CALL.ledger
  if not l then
    redis.call('ZREM', key, member)
    return
  end
  local q = l.zadd[key]
  if q then
    for i = #q, 2, -2 do
      if q[i] == member then
        local n = #q
        for j = i - 1, n - 2 do q[j] = q[j + 2] end
        q[n], q[n - 1] = nil, nil
        break
      end
    end
  end
  defer_z(l, 'zrem', key, member)
end
local function write_z(l)
  for i = 1, #l.zorder do
    local key = l.zorder[i]
    local rem, add = l.zrem[key], l.zadd[key]
    if rem then redis.call('ZREM', key, unpack(rem)) end
    if add and #add > 0 then redis.call('ZADD', key, unpack(add)) end
  end
end

-- What runs when a ledger ends, before the counters are written: fn(P, l) (Alloc's extents).
local AT_END = {}
local function at_end(fn) AT_END[#AT_END + 1] = fn end

-- Run fn(P, ...) with the shard counters' writes summed, the deferred sorted-set writes queued
-- and the allocator's extents kept, until it returns (or raises: all of it is written before the
-- error goes on, so the counters always match the free lists). For a loop that reads these
-- counters only through settle_counters (mc_evict tracks its used bytes itself; put_start reads
-- P:segs in most_free and host_segments). Returns fn's first result (a function's reply).
local function with_ledger(P, fn, ...)
  if CALL.ledger then return (fn(P, ...)) end
  -- carve, grown, pending: the allocator's (lua/lib/10_alloc.lua)
  local l = { segs = {}, order = {}, used = 0, objects = 0, zadd = {}, zrem = {}, zorder = {}, carve = {},
    grown = {}, pending = {} }
  CALL.ledger = l
  local ok, result = pcall(fn, P, ...)
  CALL.ledger = nil
  for i = 1, #AT_END do AT_END[i](P, l) end
  write_counters(P, l.segs, l.order, l.used, l.objects)
  write_z(l)
  if not ok then error(result, 0) end
  return result
end

-- Write the counters the ledger has summed so far (nothing outside with_ledger): before a read
-- of them within the loop.
local function settle_counters(P)
  local l = CALL.ledger
  if not l or (#l.order == 0 and l.objects == 0) then return end
  write_counters(P, l.segs, l.order, l.used, l.objects)
  l.segs, l.order, l.used, l.objects = {}, {}, 0, 0 -- (the same table: with_ledger holds it)
end

return {
  account = account, count_objects = count_objects, defer_zadd = defer_zadd, defer_zrem = defer_zrem,
  with_ledger = with_ledger, settle_counters = settle_counters, at_end = at_end,
}
