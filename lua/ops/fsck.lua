-- fsck repairs. The audit itself runs outside Redis (the mooncake_redis/fsck package): it SCANs a shard's
-- object hashes in bounded batches, recomputes the derived state (counters, segment bytes, free
-- lists, candidate tiers, processing index, group records) and calls these functions to fix the
-- drift it found. Each function touches one shard, does bounded work, and re-derives what it writes
-- from the state it reads inside the call (or refuses when that state moved since fsck read it),
-- so a repair that races with normal traffic never loses a write. On a healthy store every one of
-- them is a no-op.

local K, E, fail, S, MAX_INT = Base.K, Base.E, Base.fail, Base.S, Base.MAX_INT
local int_arg, now_ms, valid_tenant = Base.int_arg, Base.now_ms, Base.valid_tenant
local valid_name, register = Base.valid_name, Base.register
local free_keys, add_free = Alloc.free_keys, Alloc.add_free
local obj_key, obj_id, RADIX_MARK = Object.obj_key, Object.obj_id, Object.RADIX_MARK
local grp_key, grp_members_key, radix_hash = Object.grp_key, Object.grp_members_key, Object.radix_hash
local add_member, remove_members, all_members = Members.add_member, Members.remove_members, Members.all_members
local member_of, keys_of, node_of = Object.member_of, Object.keys_of, Object.node_of
local load_object, decode_reps, needs_read_mark = Object.load_object, Object.decode_reps, Object.needs_read_mark
local in_progress = Object.in_progress
local keep_lease = Units.keep_lease
local guarantee_prefix_key = Guarantee.guarantee_prefix_key
local object_unit, group_unit, agg_key = Units.object_unit, Units.group_unit, Units.agg_key
local unplace, place_object, place_group = Units.unplace, Units.place_object, Units.place_group
local retire_group, MAX_NODE_GROUPS = Units.retire_group, Units.MAX_NODE_GROUPS
local DEADLINES, DEADLINE_KINDS = Units.DEADLINES, Units.DEADLINE_KINDS

local FSCK_MAX_GROUP = 10000     -- candidates one mc_fsck_group call may load
local FSCK_MAX_EXTENTS = 8192    -- extents (+ free-list members) one mc_fsck_rebuild_free call may touch

-- A figure as stored: its number (missing = 0), or nil when it is malformed (not an integer in
-- canonical form: HINCRBY and every function that counts with it fail on it; mc_fsck_figures
-- replaces it).
local function figure(raw)
  if raw == false or raw == nil then return 0 end
  return int_arg(raw, -MAX_INT, MAX_INT)
end

-- Compare-and-add of hash fields: todo = { {key, field, expected, delta}, ... }, already
-- validated. Every field is read before any is written; a field is added to only if it still
-- holds `expected` (missing = 0; a malformed value never matches, so the call writes nothing
-- to it and does not fail half way). Reply: per entry {applied (1|0), value after the call}.
local function compare_and_add(todo)
  local cur = {}
  for i, t in ipairs(todo) do
    local raw = redis.call('HGET', t[1], t[2])
    cur[i] = figure(raw) or raw
  end
  local reply = {}
  for i, t in ipairs(todo) do
    if cur[i] == t[3] then
      reply[#reply + 1] = { 1, redis.call('HINCRBY', t[1], t[2], S(t[4])) }
    else
      reply[#reply + 1] = { 0, cur[i] }
    end
  end
  return reply
end

-- mc_fsck_counters. KEYS: P. ARGV: (field, expected, delta) triples, field one of used_bytes,
--   capacity_bytes, objects, guaranteed_bytes, offload_evict_bytes, tasks_pending. Compare-and-add: for each triple, when the field's current value
--   (missing = 0) equals `expected` (the value fsck read), HINCRBY field delta; otherwise leave
--   it (a write landed since fsck read it: rerun fsck). All arguments are validated first, and a
--   delta that would make a counter negative is refused (INVALID_PARAMS, nothing written).
-- Reply: per triple {applied (1|0), value after the call}.
local SHARD_COUNTERS = { used_bytes = true, capacity_bytes = true, objects = true, guaranteed_bytes = true,
  offload_evict_bytes = true, tasks_pending = true }

local function fsck_counters(P, args)
  if #args == 0 or #args % 3 ~= 0 or #args > 48 then
    return fail(E.INVALID_PARAMS, 'expected 1-16 field, expected, delta triples')
  end
  local todo = {}
  for i = 1, #args, 3 do
    local field = args[i]
    local expected, delta = int_arg(args[i + 1], -MAX_INT, MAX_INT), int_arg(args[i + 2], -MAX_INT, MAX_INT)
    if not SHARD_COUNTERS[field] then return fail(E.INVALID_PARAMS, 'unknown counter ' .. tostring(field)) end
    if not expected or not delta then return fail(E.INVALID_PARAMS, 'expected and delta must be integers') end
    if expected + delta < 0 then return fail(E.INVALID_PARAMS, field .. ' would go below 0') end
    todo[#todo + 1] = { P, field, expected, delta }
  end
  return compare_and_add(todo)
end

-- mc_fsck_guaranteed. KEYS: P. ARGV: (segment, tenant, expected, delta) quadruples.
--   Compare-and-add on a tenant's guaranteed bytes: in P:gtenants (segment "") or in a mounted
--   segment's hash (field g:<tenant>), as mc_fsck_counters does for the shard counters (the
--   shard's total is its counter guaranteed_bytes). Reply: per quadruple {applied (1|0), value}.
local function fsck_guaranteed(P, args)
  if #args == 0 or #args % 4 ~= 0 or #args > 256 then
    return fail(E.INVALID_PARAMS, 'expected 1-64 segment, tenant, expected, delta quadruples')
  end
  local todo = {}
  for i = 1, #args, 4 do
    local seg, tenant = args[i], args[i + 1]
    local expected, delta = int_arg(args[i + 2], -MAX_INT, MAX_INT), int_arg(args[i + 3], -MAX_INT, MAX_INT)
    if type(seg) ~= 'string' or not valid_tenant(tenant) or not expected or not delta then
      return fail(E.INVALID_PARAMS, 'expected segment ("" for the tenant total), tenant, expected, delta')
    end
    if expected + delta < 0 then return fail(E.INVALID_PARAMS, 'guaranteed bytes would go below 0') end
    local key, field = P .. K.guaranteed_tenants, tenant
    if seg ~= '' then
      key, field = P .. K.segment .. seg, 'g:' .. tenant
      if redis.call('EXISTS', key) == 0 then return fail(E.SEGMENT_NOT_FOUND, 'segment ' .. seg .. ' is not mounted') end
    end
    todo[#todo + 1] = { key, field, expected, delta }
  end
  return compare_and_add(todo)
end

-- mc_fsck_disk_used. KEYS: P. ARGV: client, mount, expected, delta. Compare-and-add on a local
--   disk's P:disk:<client>.used_bytes (the sizes of its live disk replicas), as mc_fsck_counters
--   does, and only while the disk still has that mount (a remount starts from 0).
-- Reply: {applied (1|0), value after the call}; INVALID_PARAMS (nothing written) when used_bytes
-- would go below 0.
local function fsck_disk_used(P, args)
  local client, mount = args[1], int_arg(args[2], 1, MAX_INT)
  local expected, delta = int_arg(args[3], -MAX_INT, MAX_INT), int_arg(args[4], -MAX_INT, MAX_INT)
  if #args ~= 4 or not valid_name(client, 256) or not mount or not expected or not delta then
    return fail(E.INVALID_PARAMS, 'expected client, mount, expected, delta')
  end
  if expected + delta < 0 then return fail(E.INVALID_PARAMS, 'used_bytes would go below 0') end
  local dkey = P .. K.disk .. client
  local cur = redis.call('HMGET', dkey, 'mount', 'used_bytes')
  if cur[1] ~= S(mount) then return { 0, figure(cur[2]) or cur[2] } end
  return compare_and_add({ { dkey, 'used_bytes', expected, delta } })[1]
end

-- mc_fsck_segment_used. KEYS: P. ARGV: segment, expected_used, delta.
--   Compare-and-add on P:seg:<segment>.used (as mc_fsck_counters), then set the segment's P:segs
--   score to size - used (the score is derived from the hash, so it is rewritten from it; this
--   also puts back a mounted segment missing from P:segs). Nothing is written on a mismatch.
-- Reply: {applied (1|0), used, free bytes}; error SEGMENT_NOT_FOUND when the segment is not mounted,
-- INVALID_PARAMS (nothing written) when used would leave [0, size].
local function fsck_segment_used(P, args)
  local seg = args[1]
  local expected, delta = int_arg(args[2], -MAX_INT, MAX_INT), int_arg(args[3], -MAX_INT, MAX_INT)
  if not valid_name(seg, 1024) or not expected or not delta then
    return fail(E.INVALID_PARAMS, 'expected segment, expected_used, delta')
  end
  local skey = P .. K.segment .. seg
  local row = redis.call('HMGET', skey, 'size', 'used')
  local size = tonumber(row[1])
  if not size then return fail(E.SEGMENT_NOT_FOUND, 'segment ' .. seg .. ' is not mounted') end
  local used = figure(row[2])
  if used ~= expected then return { 0, used or row[2], used and size - used or '' } end
  if used + delta < 0 or used + delta > size then return fail(E.INVALID_PARAMS, 'used would leave [0, size]') end
  if delta ~= 0 then used = redis.call('HINCRBY', skey, 'used', S(delta)) end
  redis.call('ZADD', P .. K.segments, S(size - used), seg)
  return { 1, used, size - used }
end

-- mc_fsck_figures. KEYS: P. ARGV: (hash, field, found, value) quadruples (1-64).
--   Replaces malformed figures (see `figure` above) with the values fsck recomputed, as a
--   compare-and-set: a field is set only if it still holds exactly `found`, the malformed value
--   fsck read (a figure rewritten meanwhile is left alone). `found` must itself be malformed
--   (numbers are repaired by compare-and-add: mc_fsck_counters and the like) and `value` an
--   integer >= 0. `hash` names the record: "" for the shard hash P (field one of the shard
--   counters), "gtenants" for P:gtenants (field a tenant), "seg:<segment>" for a mounted segment
--   (field "used", at most its size, which also rewrites its P:segs score; or "g:<tenant>"),
--   "disk:<client>" for a local disk segment (field "used_bytes", "inflight" or "inflight_bytes").
--   Every quadruple is checked before the first write (INVALID_PARAMS, SEGMENT_NOT_FOUND: nothing
--   written).
-- Reply: per quadruple {applied (1|0), the value now}.
local DISK_FIGURES = { used_bytes = true, inflight = true, inflight_bytes = true }

local function fsck_figures(P, args)
  if #args == 0 or #args % 4 ~= 0 or #args > 256 then
    return fail(E.INVALID_PARAMS, 'expected 1-64 hash, field, found, value quadruples')
  end
  local todo = {}
  for i = 1, #args, 4 do
    local hash, field, found, value = args[i], args[i + 1], args[i + 2], int_arg(args[i + 3], 0, MAX_INT)
    if type(hash) ~= 'string' or type(field) ~= 'string' or type(found) ~= 'string' or not value then
      return fail(E.INVALID_PARAMS, 'expected hash, field, found, value (an integer >= 0)')
    end
    if figure(found) then return fail(E.INVALID_PARAMS, field .. ': ' .. found .. ' is a number (compare-and-add)') end
    local key, size
    if hash == '' and SHARD_COUNTERS[field] then
      key = P
    elseif hash == 'gtenants' and valid_tenant(field) then
      key = P .. K.guaranteed_tenants
    elseif string.sub(hash, 1, 4) == 'seg:' and valid_name(string.sub(hash, 5), 1024)
        and (field == 'used' or (string.sub(field, 1, 2) == 'g:' and valid_tenant(string.sub(field, 3)))) then
      key = P .. K.segment .. string.sub(hash, 5)
      size = int_arg(redis.call('HGET', key, 'size') or '', 1, MAX_INT)
      if not size then return fail(E.SEGMENT_NOT_FOUND, 'segment ' .. string.sub(hash, 5) .. ' is not mounted with a valid size') end
      if field == 'used' and value > size then return fail(E.INVALID_PARAMS, 'used would exceed the segment') end
    elseif string.sub(hash, 1, 5) == 'disk:' and valid_name(string.sub(hash, 6), 256) and DISK_FIGURES[field] then
      key = P .. K.disk .. string.sub(hash, 6)
      if redis.call('EXISTS', key) == 0 then return fail(E.INVALID_PARAMS, 'no local disk ' .. string.sub(hash, 6)) end
    else
      return fail(E.INVALID_PARAMS, 'not a figure fsck repairs: ' .. hash .. ' ' .. field)
    end
    todo[#todo + 1] = { key, field, found, value, field == 'used' and size }
  end
  local reply = {}
  for i, t in ipairs(todo) do
    local cur = redis.call('HGET', t[1], t[2])
    if cur == t[3] then
      redis.call('HSET', t[1], t[2], S(t[4]))
      if t[5] then redis.call('ZADD', P .. K.segments, S(t[5] - t[4]), string.sub(t[1], #P + #K.segment + 1)) end
      reply[i] = { 1, t[4] }
    else
      reply[i] = { 0, cur or 0 }
    end
  end
  return reply
end

-- mc_fsck_host_index. KEYS: P. ARGV: segment, host (each 1-1024 / 1-256 bytes).
--   Makes P:hsegs:<host> agree with the segment's slice as it is inside the call: listed when the
--   slice is mounted with that host (P:seg:<segment>.host), else not. Reply: 1 if listed, else 0.
local function fsck_host_index(P, args)
  local seg, host = args[1], args[2]
  if #args ~= 2 or not valid_name(seg, 1024) or not valid_name(host, 256) then
    return fail(E.INVALID_PARAMS, 'expected a segment name (1-1024 bytes) and a host (1-256 bytes)')
  end
  local hkey = Alloc.host_key(P, host)
  if redis.call('HGET', P .. K.segment .. seg, 'host') == host then
    redis.call('SADD', hkey, seg)
    return 1
  end
  redis.call('SREM', hkey, seg)
  return 0
end

-- mc_fsck_forget_segment. KEYS: P. ARGV: segment.
--   For a segment that is NOT mounted (no P:seg:<segment> hash): drop it from P:segs and delete
--   its free lists (unmount removes all three at once; leftovers are drift). A mounted segment is
--   left alone. Reply: 1 when something was forgotten, 0 when the segment is mounted.
local function fsck_forget_segment(P, args)
  local seg = args[1]
  if not valid_name(seg, 1024) then return fail(E.INVALID_PARAMS, 'segment name must be 1-1024 bytes') end
  if redis.call('EXISTS', P .. K.segment .. seg) == 1 then return 0 end
  local by_off, by_size = free_keys(P, seg)
  redis.call('ZREM', P .. K.segments, seg)
  redis.call('DEL', by_off, by_size)
  return 1
end

-- Re-derive one object's own index entries: P:processing (member iff not complete, score =
-- put_started where the object has one), its guarantee's entries (P:guaranteed and its prefix set, iff it has
-- guaranteed_until; a stale entry is dropped by the sweep or expire_guaranteed), its
-- P:offload_evict entry (iff it has offload_evict; a missing one is added due now, so the next
-- mc_evict ends the wait) and its object unit (placed by place_object when ungrouped; never present when
-- grouped: members are placed through their group, see mc_fsck_group). A missing object leaves
-- none. Returns 1 if the object exists, else 0.
local function fsck_place_object(P, tenant, key, now)
  local id, unit, okey = obj_id(tenant, key), object_unit(tenant, key), obj_key(P, tenant, key)
  local o = load_object(okey)
  if not o then
    redis.call('ZREM', P .. K.processing, id)
    redis.call('ZREM', P .. K.offload_evict, id)
    unplace(P, unit)
    return 0
  end
  if o.offload_evict then
    redis.call('ZADD', P .. K.offload_evict, 'NX', S(now), id)
  else
    redis.call('ZREM', P .. K.offload_evict, id)
  end
  if o.status == 'complete' then
    redis.call('ZREM', P .. K.processing, id)
  else
    -- its start: put_started (an earlier package's), else the entry's own score, else now (a full window)
    if tonumber(o.put_started) then
      redis.call('ZADD', P .. K.processing, tonumber(o.put_started), id)
    else
      redis.call('ZADD', P .. K.processing, 'NX', S(now), id)
    end
  end
  if tonumber(o.guaranteed_until) then
    redis.call('ZADD', P .. K.guaranteed, S(tonumber(o.guaranteed_until)), id)
    redis.call('SADD', guarantee_prefix_key(P, tenant, o.prefix or key), key)
  else
    redis.call('ZREM', P .. K.guaranteed, id)
  end
  if not o.special and needs_read_mark(o) then redis.call('HSET', okey, 'special', '1'); o.special = '1' end
  if not o.group then keep_lease(P, unit, okey, o) end -- the tier's lease, before unplace drops it
  unplace(P, unit) -- every index: a stray entry anywhere goes
  if not o.group then place_object(P, tenant, key, o, now) end
  return 1
end

-- mc_fsck_place. KEYS: P. ARGV: tenant, key [, prefix].  Re-places one object (see
--   fsck_place_object above): processing index, guarantee entries, candidate tier and soft-pin
--   deadline entry; with `prefix`, the key also leaves that prefix's set of guaranteed keys unless
--   it is the object's own guaranteed prefix. Reply: 1 (object exists) | 0.
local function fsck_place(P, args)
  local tenant, key, prefix = args[1], args[2], args[3]
  if not valid_tenant(tenant) or type(key) ~= 'string' then return fail(E.INVALID_PARAMS, 'expected tenant, key') end
  if prefix ~= nil then
    if not valid_name(prefix, 256) then return fail(E.INVALID_PARAMS, 'a prefix hash must be 1-256 bytes') end
    local o = redis.call('HMGET', obj_key(P, tenant, key), 'guaranteed_until', 'prefix')
    if not o[1] or (o[2] or key) ~= prefix then redis.call('SREM', guarantee_prefix_key(P, tenant, prefix), key) end
  end
  return fsck_place_object(P, tenant, key, now_ms(P))
end

-- mc_fsck_unit. KEYS: P. ARGV: unit.  Re-derives one candidate unit found in a tier or in the
--   soft-pin deadline index: "o:<tenant>:<key>" is re-placed like mc_fsck_place; "g:<tenant>:<group>"
--   and a radix node's "r:<tenant>:<hash>" are re-placed from the record's counters (fix the
--   counters first with mc_fsck_group); anything else (a malformed unit) is removed from the
--   tiers and the deadline index.
-- Reply: "o", "g", "r" or "removed".
local function fsck_unit(P, args)
  local unit = args[1]
  if type(unit) ~= 'string' then return fail(E.INVALID_PARAMS, 'expected unit') end
  local kind, tenant, name = string.match(unit, '^([ogr]):([^:]+):(.+)$')
  if kind and valid_tenant(tenant) then
    local now = now_ms(P)
    if kind == 'o' then
      fsck_place_object(P, tenant, name, now)
    else -- (a radix node is the group named RADIX_MARK .. hash)
      place_group(P, tenant, kind == 'r' and RADIX_MARK .. name or name, now, true)
    end
    return kind
  end
  unplace(P, unit)
  return 'removed'
end

-- mc_fsck_group. KEYS: P. ARGV: tenant, group, max_members, key...
--   Rebuilds one group's record from its objects. Candidates = P:grpm:<tenant>:<group> plus the
--   keys passed (the objects fsck found naming the group); fails with INVALID_PARAMS, writing
--   nothing, when there are more than max_members (<= 10000) candidates. A candidate is a member
--   iff its object exists and its group field names this group. Rewrites the member set, sets
--   members / processing / hard_pinned / task_refs, rebuilds the members' soft-pin deadlines
--   (P:agg:soft_pin:<unit>: complete members with a soft pin) and guarantees
--   (P:agg:guarantee:<unit>: members with guaranteed_until), removes members' own object units, then places the group unit (place_group) — or,
--   when no member is left, retires the group (retire_group). lease_until is kept: it is the
--   group's own state (reads extend it), not derived from the members.
-- Reply: {members, processing, hard_pinned}.
local function fsck_group(P, args)
  local tenant, group = args[1], args[2]
  local max = int_arg(args[3], 1, FSCK_MAX_GROUP)
  if not valid_tenant(tenant) or not valid_name(group, 259) or not max then -- 259: a radix node's internal name
    return fail(E.INVALID_PARAMS, 'expected tenant, group, max_members (1-' .. FSCK_MAX_GROUP .. '), key...')
  end
  local gkey = grp_key(P, tenant, group)
  local listed = all_members(P, tenant, group)
  if #listed + #args - 3 > max then
    return fail(E.INVALID_PARAMS, 'group ' .. group .. ' has more than ' .. S(max) .. ' candidate members')
  end
  local seen, cand = {}, {}
  local function add(k) if not seen[k] then seen[k] = true; cand[#cand + 1] = k end end
  for _, k in ipairs(keys_of(group, listed)) do add(k) end
  for i = 4, #args do add(args[i]) end
  table.sort(cand)
  local members, processing, hard, refs = 0, 0, 0, 0
  local soft_key = agg_key(P, 'soft_pin', group_unit(tenant, group))
  local guarantee_key = agg_key(P, 'guarantee', group_unit(tenant, group))
  redis.call('DEL', soft_key, guarantee_key)
  for _, k in ipairs(cand) do
    local o = redis.call('HMGET', obj_key(P, tenant, k), 'group', 'status', 'hard_pin', 'soft_pin_until', 'task_refs',
      'guaranteed_until', 'node')
    if (o[1] or (o[7] and RADIX_MARK .. node_of(k, o[7]))) == group then -- a radix node's keys carry `node`
      members = members + 1
      if tonumber(o[6]) then redis.call('ZADD', guarantee_key, o[6], k) end
      if in_progress(o[2]) then
        processing = processing + 1
      elseif (tonumber(o[4]) or 0) > 0 then
        redis.call('ZADD', soft_key, o[4], k)
      end
      if o[3] == '1' then hard = hard + 1 end
      refs = refs + (tonumber(o[5]) or 0)
      add_member(P, tenant, group, member_of(group, k))
      unplace(P, object_unit(tenant, k))
    else
      remove_members(P, tenant, group, { member_of(group, k) })
    end
  end
  -- a node's member set of an older layout: its members are in the record now
  if radix_hash(group) then redis.call('DEL', grp_members_key(P, tenant, group)) end
  if members == 0 then
    unplace(P, group_unit(tenant, group)) -- every index, whatever the memo says
    retire_group(P, tenant, group, now_ms(P))
    return { 0, 0, 0 }
  end
  redis.call('HSET', gkey, 'members', S(members), 'processing', S(processing), 'hard_pinned', S(hard), 'task_refs', S(refs))
  redis.call('HDEL', gkey, 'soft_pin_until') -- written by older versions; the members' zset replaces it
  place_group(P, tenant, group, now_ms(P), true) -- every index: the memo is rewritten
  return { members, processing, hard }
end

-- mc_fsck_rebuild_free. KEYS: P.
-- ARGV: segment, mount, lo, hi,
--       n_seen, (member, by_off score, by_size score) x n_seen,
--       n_alloc, (offset, length, kind, ref) x n_alloc,
--       n_drop, member x n_drop
--   Rebuilds the free lists of the window [lo, hi) of a mounted segment from the allocated extents
--   passed (sorted, not overlapping). fsck cuts a segment into windows whose edges are segment
--   ends or starts of allocated extents, so no free extent crosses a window edge and one call stays
--   bounded. `seen` are the free-list members fsck read for this window (a score is "" when the
--   member is missing from that list); `drop` are members found only in by_size.
--   Nothing a caller passes can make allocated bytes allocatable:
--   * every allocated extent is checked against the records: kind "r" with ref "<tenant>:<key>"
--     is a replica of that object on this segment and mount at that offset, with the object's
--     size; kind "h" with ref = a P:held member is that held extent. One that does not check out
--     refuses the call (INVALID_PARAMS, nothing written);
--   * the free lists must still hold exactly the seen members with the seen scores (ZCOUNT of
--     by_off over the window — over (-inf, ...) / (..., +inf) for a window touching the segment's
--     ends — equals the number of seen members scored inside it), otherwise {0, reason};
--   * the new free extents are the complement of the allocated ones, cut down to bytes that are
--     free now (the union of the seen extents) unless the window is the whole segment and the
--     allocated extents add up to the segment's used bytes (then the list is complete, and bytes
--     that are neither free nor allocated, a leak, become free again).
--   At most 8192 seen + allocated + dropped entries per call.
-- Reply: {1, free extents written} or {0, reason} when the state moved (rerun fsck).

-- The allocated extent at off/len on segment `seg` (mount `mount`) that `kind`/`ref` names exists.
local function allocation_checks_out(P, seg, mount, off, len, kind, ref)
  if kind == 'r' then
    local tenant, key = string.match(ref, '^([^:]+):(.*)$')
    if not tenant then return false end
    local o = load_object(obj_key(P, tenant, key))
    if not o or tonumber(o.size) ~= len then return false end
    for _, r in ipairs(o.reps and decode_reps(o.reps) or {}) do
      if r.seg == seg then return r.off == off and r.mount == mount end
    end
    return false
  elseif kind == 'h' then
    return redis.call('ZSCORE', P .. K.held, ref) ~= false
      and ref == mount .. ' ' .. S(off) .. ' ' .. S(len) .. ' ' .. seg
  end
  return false
end

-- The parts of the sorted, disjoint ranges `a` ({lo, hi}) that lie inside some range of `b`
-- (sorted by lo; its ranges may overlap each other): a two-pointer walk over both lists.
local function intersect(a, b)
  local union = {}
  for _, r in ipairs(b) do
    local last = union[#union]
    if last and r[1] <= last[2] then last[2] = math.max(last[2], r[2]) else union[#union + 1] = { r[1], r[2] } end
  end
  local out, j = {}, 1
  for _, x in ipairs(a) do
    while union[j] and union[j][2] <= x[1] do j = j + 1 end
    local k = j
    while union[k] and union[k][1] < x[2] do
      local lo, hi = math.max(x[1], union[k][1]), math.min(x[2], union[k][2])
      if lo < hi then out[#out + 1] = { lo, hi } end
      k = k + 1
    end
  end
  return out
end

local function fsck_rebuild_free(P, args)
  local seg, mount = args[1], args[2]
  local lo, hi = int_arg(args[3], 0, MAX_INT), int_arg(args[4], 0, MAX_INT)
  if not valid_name(seg, 1024) or type(mount) ~= 'string' or not lo or not hi or lo >= hi then
    return fail(E.INVALID_PARAMS, 'expected segment, mount, lo < hi')
  end
  local i = 5
  local function count()
    local n = int_arg(args[i], 0, FSCK_MAX_EXTENTS)
    i = i + 1
    return n
  end
  local n_seen = count()
  if not n_seen or #args < i + 3 * n_seen then return fail(E.INVALID_PARAMS, 'bad seen list') end
  local seen = {}
  for _ = 1, n_seen do
    seen[#seen + 1] = { args[i], tonumber(args[i + 1]), tonumber(args[i + 2]) }
    i = i + 3
  end
  local n_alloc = count()
  if not n_alloc or #args < i + 4 * n_alloc then return fail(E.INVALID_PARAMS, 'bad allocated list') end
  local alloc, cursor, alloc_bytes = {}, lo, 0
  for _ = 1, n_alloc do
    local off, len = int_arg(args[i], 0, MAX_INT), int_arg(args[i + 1], 1, MAX_INT)
    if not off or not len or off < cursor or off + len > hi or type(args[i + 3]) ~= 'string' then
      return fail(E.INVALID_PARAMS, 'allocated extents must be sorted, disjoint and inside [lo, hi)')
    end
    alloc[#alloc + 1] = { off, len, args[i + 2], args[i + 3] }
    cursor, alloc_bytes = off + len, alloc_bytes + len
    i = i + 4
  end
  local n_drop = count()
  if not n_drop or #args ~= i - 1 + n_drop then return fail(E.INVALID_PARAMS, 'bad drop list') end
  if n_seen + n_alloc + n_drop > FSCK_MAX_EXTENTS then return fail(E.INVALID_PARAMS, 'too many extents for one call') end

  local row = redis.call('HMGET', P .. K.segment .. seg, 'mount', 'base', 'size', 'used')
  if row[1] ~= mount then return { 0, 'segment not mounted with mount id ' .. mount } end
  local base, size, used = tonumber(row[2]), tonumber(row[3]), tonumber(row[4])
  if lo < base or hi > base + size then return fail(E.INVALID_PARAMS, 'window outside the segment') end
  for _, a in ipairs(alloc) do
    if not allocation_checks_out(P, seg, mount, a[1], a[2], a[3], a[4]) then
      return fail(E.INVALID_PARAMS, 'no replica or held extent at ' .. S(a[1]) .. ' (' .. S(a[2]) .. ' bytes) as claimed')
    end
  end
  local by_off, by_size = free_keys(P, seg)
  local q_lo, q_hi = (lo == base) and '-inf' or S(lo), (hi == base + size) and '+inf' or ('(' .. S(hi))
  local inside, free_now = 0, {}
  for _, s in ipairs(seen) do
    if tonumber(redis.call('ZSCORE', by_off, s[1])) ~= s[2] or tonumber(redis.call('ZSCORE', by_size, s[1])) ~= s[3] then
      return { 0, 'free extent ' .. s[1] .. ' changed' }
    end
    if s[2] and (q_lo == '-inf' or s[2] >= lo) and (q_hi == '+inf' or s[2] < hi) then inside = inside + 1 end
    if s[2] and s[3] and tostring(s[2]) == s[1] then free_now[#free_now + 1] = { s[2], s[2] + s[3] } end
  end
  if redis.call('ZCOUNT', by_off, q_lo, q_hi) ~= inside then return { 0, 'free extents were added in the window' } end
  for d = i, #args do
    if redis.call('ZSCORE', by_off, args[d]) then return { 0, 'free extent ' .. args[d] .. ' changed' } end
  end

  local complement = {}
  cursor = lo
  for _, a in ipairs(alloc) do
    if a[1] > cursor then complement[#complement + 1] = { cursor, a[1] } end
    cursor = a[1] + a[2]
  end
  if cursor < hi then complement[#complement + 1] = { cursor, hi } end
  local complete = lo == base and hi == base + size and alloc_bytes == used
  if not complete then
    table.sort(free_now, function(p, q) return p[1] < q[1] end)
    complement = intersect(complement, free_now)
  end

  for _, s in ipairs(seen) do
    redis.call('ZREM', by_off, s[1])
    redis.call('ZREM', by_size, s[1])
  end
  for d = i, #args do redis.call('ZREM', by_size, args[d]) end
  for _, r in ipairs(complement) do add_free(by_off, by_size, r[1], r[2] - r[1]) end
  return { 1, #complement }
end

-- mc_fsck_sweep_due. KEYS: P. ARGV: unit... (1-1024 units, as mc_unit_state names them).
--   Read-only. Per unit, 1 when the next deadline sweep (sweep_deadlines, lua/lib/30_units.lua)
--   will re-derive it at the store clock, else 0: an entry that sweep reads names the unit with
--   a due score and the record agrees that the deadline passed. Those entries are the unit's own
--   in a deadline index (P:deadline:soft_pin: re-placed unconditionally), the P:guaranteed entry
--   of its guarantee (an object's own, or for a composite unit the earliest member's in
--   P:agg:guarantee:<unit>; ended when guaranteed_until is due too) and its P:deadline:retention
--   entry (dropped when retained_until is not later; for a radix node, that of a group of its keys). Until that sweep runs, a unit's tier and
--   deadline entries lag behind mc_unit_state's expected ones by design, which the audit must not
--   report as drift; an entry the sweep would not act on (a stale score, a record with a later
--   deadline) gives 0, so real drift is still reported.
-- Reply: {0|1 per unit}.
local FSCK_MAX_UNITS = 1024

local function due_in(index, member, now)
  local score = tonumber(redis.call('ZSCORE', index, member))
  return score ~= nil and score <= now
end

-- A number field of a record, nil when absent, not a number, or the key is not a hash (an
-- object key of another type is the audit's bad_object, not an error of this call).
local function number_field(key, field)
  local v = redis.pcall('HGET', key, field)
  return type(v) == 'string' and tonumber(v) or nil
end

local function guarantee_due(P, tenant, key, now)
  local g = number_field(obj_key(P, tenant, key), 'guaranteed_until')
  return g ~= nil and g <= now and due_in(P .. K.guaranteed, obj_id(tenant, key), now)
end

-- Will the sweep end group `group`'s retention (a due index entry, a record not later)?
local function retention_due(P, tenant, group, now)
  if not due_in(P .. K.deadline_retention, 'g:' .. tenant .. ':' .. group, now) then return false end
  local rec = number_field(grp_key(P, tenant, group), 'retained_until')
  return rec == nil or rec <= now
end

local function sweep_due(P, unit, now)
  for _, kind in ipairs(DEADLINE_KINDS) do
    if due_in(P .. DEADLINES[kind], unit, now) then return true end
  end
  local kind, tenant, name = string.match(unit, '^([ogr]):([^:]+):(.+)$')
  if not kind or not valid_tenant(tenant) then return false end
  if kind == 'o' then return guarantee_due(P, tenant, name, now) end
  local first = redis.call('ZRANGEBYSCORE', agg_key(P, 'guarantee', unit), '-inf', S(now), 'LIMIT', 0, 1)
  if first[1] and guarantee_due(P, tenant, first[1], now) then return true end
  if kind == 'g' then return retention_due(P, tenant, name, now) end
  if kind == 'r' then -- a node ranks by the retention of its keys' groups (30_units.lua)
    for _, g in ipairs(redis.call('ZRANGE', agg_key(P, 'groups', unit), 0, MAX_NODE_GROUPS - 1)) do
      if retention_due(P, tenant, g, now) then return true end
    end
  end
  return false
end

local function fsck_sweep_due(P, args)
  if #args < 1 or #args > FSCK_MAX_UNITS then
    return fail(E.INVALID_PARAMS, 'expected 1-' .. S(FSCK_MAX_UNITS) .. ' units')
  end
  for _, unit in ipairs(args) do
    if type(unit) ~= 'string' then return fail(E.INVALID_PARAMS, 'expected units') end
  end
  local now, reply = now_ms(P), {}
  for i, unit in ipairs(args) do reply[i] = sweep_due(P, unit, now) and 1 or 0 end
  return reply
end

register('mc_fsck_counters', {}, fsck_counters)
register('mc_fsck_figures', {}, fsck_figures)
register('mc_fsck_guaranteed', {}, fsck_guaranteed)
register('mc_fsck_segment_used', {}, fsck_segment_used)
register('mc_fsck_disk_used', {}, fsck_disk_used)
register('mc_fsck_forget_segment', {}, fsck_forget_segment)
-- mc_fsck_held_due. KEYS: P. Rewrites P:config's held_due from P:held (Alloc.rebound_held).
-- Reply: the bound, as written ('none': P:held is empty).
register('mc_fsck_held_due', {}, function(P)
  local bound = Alloc.rebound_held(P, nil)
  return bound == 'none' and bound or S(bound)
end)
register('mc_fsck_host_index', {}, fsck_host_index)
register('mc_fsck_place', {}, fsck_place)
register('mc_fsck_unit', {}, fsck_unit)
register('mc_fsck_group', {}, fsck_group)
register('mc_fsck_rebuild_free', {}, fsck_rebuild_free)
register('mc_fsck_sweep_due', {}, fsck_sweep_due, { 'no-writes' })
