-- Objects. An object is the hash P:obj:<tenant>:<key> with fields
--   size, status ("processing" while a put is in progress; a complete object has none, schema 4:
--   16 bytes an object; load_object gives it status "complete", as it does an object of an
--   older schema that stored it), writer, put_started (only in a put in progress
--   an earlier package wrote: a put's start is its P:processing score, see put_started below),
--   lease_until (absent: 0; see object_lease in 30_units.lua),
--   soft_pin_until (absent or 0: none), hard_pin (1; absent or 0: none), group (only when grouped),
--   soft_pin_action / soft_pin_ttl (only until the first put_end commits them; an action of
--   `preserve`, the default, is not written),
--   special = 1 (the read mark: needs_read_mark below),
--   reps = its memory replicas (size = the object's size), each "<offset> <mount id> <#segment>
--     <segment>" (the segment name's length, then the name: names are any bytes), one after
--     another in segment-name order, so that a read takes an object's facts and its replicas
--     with one HMGET (layout 2; layout 1 had one field rep:<segment> = "<offset> <mount id>" per
--     replica, which load_object still reads and mc_upgrade_objects rewrites)
-- A replica is live while its segment is mounted with the same mount id.
-- Indexes: P:processing (zset, member "<tenant>:<key>", score = when the put started).
-- Groups: P:grp:<tenant>:<group> hash, P:grpm:<tenant>:<group> set of member keys (30_units.lua).

local K, E, fail, S, now_ms, valid_tenant = Base.K, Base.E, Base.fail, Base.S, Base.now_ms, Base.valid_tenant
local tonumber_, sub_, byte_, match_, find_ -- (bound at the first call: Base.on_first_call)
Base.on_first_call(function()
  tonumber_, sub_, byte_, match_, find_ = tonumber, string.sub, string.byte, string.match, string.find
end)
local parse_call = Base.parse_call
local mount_of = Alloc.mount_of

local function obj_key(P, tenant, key) return P .. K.object .. tenant .. ':' .. key end
-- obj_key(P, tenant, key) is obj_prefix(P, tenant) .. key (a batch builds the prefix once)
local function obj_prefix(P, tenant) return P .. K.object .. tenant .. ':' end

-- Fields of an object that are never a replica: the loops that look for replica fields
-- ('rep:', 'disk:') skip them with one table lookup. A field missing here costs only a string
-- check more.
local SCALAR_FIELDS = { reps = true, special = true, repl_kind = true, repl_client = true, repl_source = true, repl_until = true, repl_reps = true, size = true, status = true, writer = true, put_started = true, lease_until = true,
  soft_pin_until = true, hard_pin = true, group = true, node = true, prefix = true, checksum = true,
  guaranteed_until = true, task_refs = true, soft_pin_action = true, soft_pin_ttl = true }
local function obj_id(tenant, key) return tenant .. ':' .. key end
-- A radix node is the second composite unit (lua/lib/32_radix.lua). Its keys are kept by the
-- group machinery under the internal group name RADIX_MARK .. <prefix hash>, whose record is
-- P:rnode:<tenant>:<hash>, its members fields of it (lua/lib/22_members.lua); an object registered under
-- a node has the field `node` = <hash>, which load_object turns into that group name. User group
-- ids never start with a NUL byte (put_start and retain_groups refuse them).
local RADIX_MARK = '\0r:'
-- The hashes of the radix groups seen (a sub is a new string: a call asks for its node's hash
-- several times). Bounded: dropped whole at RADIX_OF_MAX entries.
local RADIX_OF, radix_of_n, RADIX_OF_MAX = {}, 0, 4096
local function radix_hash(group)
  if byte_(group, 1) ~= 0 then return nil end
  local h = RADIX_OF[group]
  if h then return h end
  if sub_(group, 1, 3) ~= RADIX_MARK then return nil end
  h = sub_(group, 4)
  if radix_of_n >= RADIX_OF_MAX then RADIX_OF, radix_of_n = {}, 0 end
  RADIX_OF[group], radix_of_n = h, radix_of_n + 1
  return h
end
local function grp_key(P, tenant, group)
  local h = radix_hash(group)
  if h then return P .. K.radix_node .. tenant .. ':' .. h end
  return P .. K.group .. tenant .. ':' .. group
end
-- grp_key(P, tenant, RADIX_MARK .. h) is node_prefix(P, tenant) .. h (a batch builds the prefix once)
local function node_prefix(P, tenant) return P .. K.radix_node .. tenant .. ':' end
local function grp_members_key(P, tenant, group)
  local h = radix_hash(group)
  if h then return P .. K.radix_keys .. tenant .. ':' .. h end
  return P .. K.group_members .. tenant .. ':' .. group
end
-- A group's members are its keys as they are, a radix node's its keys with the node's hash
-- taken out: a key that contains the hash as '=' <n> ':' and the key without it (n: the bytes
-- before it), shortened to '=' and the rest when the key starts with the hash and the rest does
-- not start with a digit; another key as '\' and the key. Engines put a page's hash in every key
-- ("<hash>_0_k", "<tag>_<model>_<hash>_0_k", "<model>@...@<hash>"): members of a few bytes.
-- Schema 5 took the hash out (in a set then); schema 7 marks every other key too, so that a
-- member never reads as a field of the node's record, where it lives now (lua/lib/22_members.lua).
local EQ, BS = 61, 92 -- '=', '\'
local function member_of(group, key)
  local h = radix_hash(group)
  if not h then return key end
  local at = find_(key, h, 1, true)
  if at == 1 then
    local rest = sub_(key, #h + 1)
    local b = byte_(rest, 1)
    if b and b >= 48 and b <= 57 then return '=0:' .. rest end -- (a digit would read as a count)
    return '=' .. rest
  elseif at then
    return '=' .. (at - 1) .. ':' .. sub_(key, 1, at - 1) .. sub_(key, at + #h)
  end
  return '\\' .. key -- (always marked: a node's record holds its members beside its own fields, schema 7)
end
local function key_of(group, member)
  local h = radix_hash(group)
  if not h then return member end
  local b = byte_(member, 1)
  if b == EQ then
    local n, at = match_(member, '^=(%d+):()')
    if not n then return h .. sub_(member, 2) end
    n = at + tonumber_(n)
    return sub_(member, at, n - 1) .. h .. sub_(member, n)
  end
  if b == BS then return sub_(member, 2) end
  return member
end
-- An object's `node` field names its radix node by where the node's hash sits in its key: '='
-- <n> ':' <length> (n: the bytes before it), 5 or 6 bytes where the hash takes 64; a hash that
-- is not in the key as it is, and as '\' and the hash when it starts with '=' or '\' (schema 6:
-- older stores' fields are rewritten, lua/ops/upgrade.lua). node_of reads the field (nil: none).
local function node_field(key, h)
  local at = find_(key, h, 1, true)
  if at then return '=' .. (at - 1) .. ':' .. #h end
  local b = byte_(h, 1)
  if b == EQ or b == BS then return '\\' .. h end
  return h
end
-- The byte range of each '=' form seen (a read's every key of one shape has the same field).
-- Bounded: dropped whole at NODE_AT_MAX entries.
local NODE_AT, node_at_n, NODE_AT_MAX = {}, 0, 1024
local function node_of(key, field)
  if not field then return nil end
  local at = NODE_AT[field]
  if at then return sub_(key, at[1], at[2]) end
  local b = byte_(field, 1)
  if b == EQ then
    local n, len = match_(field, '^=(%d+):(%d+)$')
    if n then
      n = tonumber_(n)
      at = { n + 1, n + tonumber_(len) }
      if node_at_n >= NODE_AT_MAX then NODE_AT, node_at_n = {}, 0 end
      NODE_AT[field], node_at_n = at, node_at_n + 1
      return sub_(key, at[1], at[2])
    end
  elseif b == BS then
    return sub_(field, 2)
  end
  return field
end
-- The key of an object key P:obj:<tenant>:<key> (a shard key and a tenant hold no ':obj:' and
-- a tenant no ':').
local function key_of_okey(okey)
  local at = find_(okey, ':obj:', 1, true)
  return sub_(okey, find_(okey, ':', at + 5, true) + 1)
end

-- The keys of a list of a member set's members (in place).
local function keys_of(group, members)
  if radix_hash(group) then
    for i = 1, #members do members[i] = key_of(group, members[i]) end
  end
  return members
end

-- Keys one call may carry: every function bounds its own work whatever a caller sends (the
-- Python client sends at most 32-128 keys a call, see CHUNK_OF in mooncake_redis/master.py).
local MAX_KEYS_PER_CALL = 512

-- Parse the call of a per-key function (parse_call) and check its tenant option (default
-- "default"). Returns the call (with .tenant) or nil and an error reply.
local function object_call(args, spec)
  local call, err = parse_call(args, spec)
  if not call then return nil, fail(E.INVALID_PARAMS, err) end
  if call.tenant then return call end -- a memoised head, checked when it was first parsed
  local tenant = call.opts.tenant or 'default'
  if not valid_tenant(tenant) then
    return nil, fail(E.INVALID_PARAMS, 'tenant_id must match [A-Za-z0-9_.-]{1,64}')
  end
  call.tenant = tenant
  return call
end

-- The driver of every per-key batch function: reads the clock once and replies
-- one(P, tenant, row, now) for each row of the call, in order. `row` is one table refilled for
-- every row (no allocation per key): one() must not keep it.
local function per_row(P, args, call, one)
  local now = now_ms(P)
  local reply, row, fields, stride = {}, {}, call.fields, call.stride
  for r = 1, call.rows do
    local at = call.first + (r - 1) * stride
    for i = 1, stride do row[fields[i]] = args[at + i - 1] end
    reply[r] = one(P, call.tenant, row, now)
  end
  return reply
end

-- The spec of a function whose rows are keys, with option tenant and optionally one more.
-- (Specs are built when the library loads, where Lua's pairs is not available.)
local function keys_spec(option, kind)
  local opts = { tenant = 'optional' }
  if option then opts[option] = kind end
  return { opts = opts, fields = { key = 'required' }, max_rows = MAX_KEYS_PER_CALL }
end

-- The read mark: the field special = 1 on an object that has (or had) a guarantee, a hard pin, a
-- task reference, a soft pin, a disk replica or an offload on evict pending, so that a read tells from a few fields that an
-- object without it has none of them (get_replica_list's plain_read) and takes the general path
-- for one that has. Set where those fields are written (put_start, put_end, task references,
-- offload), never taken back but with the object: a stale mark costs a read the general path.
local function needs_read_mark(o)
  if o.guaranteed_until or o.hard_pin == '1' or (tonumber_(o.task_refs) or 0) > 0
    or (tonumber_(o.soft_pin_until) or 0) > 0 or o.offload_evict then return true end
  for field in pairs(o) do
    if sub_(field, 1, 5) == 'disk:' then return true end
  end
  return false
end

-- The `reps` field of replicas {seg=, off=, mount=} (any order; written in segment order).
local function by_segment(a, b) return a.seg < b.seg end
local function encode_reps(list)
  if #list == 1 then local r = list[1]; return S(r.off) .. ' ' .. r.mount .. ' ' .. S(#r.seg) .. ' ' .. r.seg end
  if #list > 1 then table.sort(list, by_segment) end
  local parts = {}
  for i, r in ipairs(list) do parts[i] = S(r.off) .. ' ' .. r.mount .. ' ' .. S(#r.seg) .. ' ' .. r.seg end
  return table.concat(parts)
end

-- Replicas of a `reps` value, as {seg=, off=, mount=} in its order; nil when it is malformed.
local function decode_reps(reps)
  local list, at, n = {}, 1, #reps
  while at <= n do
    local off, mount, len, from = match_(reps, '^(%d+) (%d+) (%d+) ()', at)
    if not off then return nil end
    local upto = from + tonumber_(len) - 1
    if len == '0' or upto > n then return nil end
    list[#list + 1] = { seg = sub_(reps, from, upto), off = tonumber_(off), mount = mount }
    at = upto + 1
  end
  return list
end

-- Layout 1's replica fields (rep:<segment> = "<offset> <mount id>") of an HGETALL reply, as
-- a `reps` value, and the field names; nil when there are none.
local function legacy_reps(flat)
  local list, names = {}, {}
  for i = 1, #flat, 2 do
    local seg = byte_(flat[i], 1) == 114 and match_(flat[i], '^rep:(.*)$')
    if seg then
      local off, mount = match_(flat[i + 1], '^(%d+) (%d+)$')
      names[#names + 1] = flat[i]
      if off then list[#list + 1] = { seg = seg, off = tonumber_(off), mount = mount } end
    end
  end
  if #names == 0 then return nil end
  return encode_reps(list), names
end

-- HGETALL as a table, nil when the object does not exist. Every object has at least 3 fields
-- (size, writer and a replica or disk field; status while a put is in progress); a constructor
-- fills them into a table sized at once (its hash part holds 4, or 8 from 5 fields on), where
-- filling an empty table re-hashes it at each power of two on the way. An object of layout 1
-- gets its `reps` from its replica fields (and `legacy_reps`: their names, which write_reps
-- deletes).
-- Whether an object's stored `status` (nil or, from an HMGET, false: none) says a put is in
-- progress: a complete object has none, or, stored by an older schema, "complete".
local function in_progress(status) return status and status ~= 'complete' or false end

local function load_object(okey)
  local flat = redis.call('HGETALL', okey)
  local n = #flat
  if n == 0 then return nil end
  local o, from = nil, 1
  if n >= 10 then
    o = { [flat[1]] = flat[2], [flat[3]] = flat[4], [flat[5]] = flat[6], [flat[7]] = flat[8],
      [flat[9]] = flat[10] }
    from = 11
  elseif n >= 6 then
    o = { [flat[1]] = flat[2], [flat[3]] = flat[4], [flat[5]] = flat[6] }
    from = 7
  else
    o = {}
  end
  for i = from, n, 2 do o[flat[i]] = flat[i + 1] end
  if not in_progress(o.status) then o.status = 'complete' end
  if o.node then
    o.node = node_of(key_of_okey(okey), o.node)
    o.group = RADIX_MARK .. o.node
  end
  if not o.reps then o.reps, o.legacy_reps = legacy_reps(flat) end
  return o
end

-- Write an object's memory replicas (none: the field goes), in the hash and in `o`.
local function write_reps(okey, o, list)
  if o.legacy_reps then -- an object of an older layout: its replica fields go, and it gets its read mark
    redis.call('HDEL', okey, unpack(o.legacy_reps))
    o.legacy_reps = nil
    if not o.special and needs_read_mark(o) then redis.call('HSET', okey, 'special', '1'); o.special = '1' end
  end
  if #list == 0 then
    if o.reps then redis.call('HDEL', okey, 'reps') end
    o.reps = nil
  else
    o.reps = encode_reps(list)
    redis.call('HSET', okey, 'reps', o.reps)
  end
end

-- Replicas as a list of {seg=, off=, mount=, live=}, in segment-name order (stable replies).
-- The second result is false when no field starts with 'd', i.e. the object has no disk replica
-- (27_disk.lua): readers then skip the pass over the fields that looks for them.
local function replicas_of(P, o, mount_cache)
  local list = o.reps and decode_reps(o.reps) or {}
  for i = 1, #list do
    local r = list[i]
    r.live = mount_of(P, r.seg, mount_cache) == r.mount
  end
  local maybe_disk = false
  for field in pairs(o) do
    if not SCALAR_FIELDS[field] and byte_(field, 1) == 100 then maybe_disk = true; break end
  end
  return list, maybe_disk
end

-- Live replicas; dead ones (segment unmounted) are dropped from the hash on the way. The second
-- result is replicas_of's.
local function live_replicas(P, okey, o, mount_cache)
  local list, maybe_disk = replicas_of(P, o, mount_cache)
  local total, n = #list, 0
  for i = 1, total do -- compacted in place
    local r = list[i]
    list[i] = nil
    if r.live then n = n + 1; list[n] = r end
  end
  if n < total or o.legacy_reps then write_reps(okey, o, list) end -- (a layout 1 object: rewritten)
  return list, maybe_disk
end

-- A grouped object shares the lease of its group.
local function lease_until(P, tenant, o)
  local own = tonumber_(o.lease_until) or 0
  if o.group then
    local g = tonumber_(redis.call('HGET', grp_key(P, tenant, o.group), 'lease_until')) or 0
    if g > own then return g end
  end
  return own
end

-- When the put in progress of object `o` started: its P:processing score (or the put_started
-- field an earlier package wrote); `default` when neither says.
local function put_started(P, tenant, key, o, default)
  local v = o.put_started or redis.call('ZSCORE', P .. K.processing, obj_id(tenant, key))
  return tonumber_(v) or default
end

return {
  put_started = put_started,
  obj_key = obj_key, obj_prefix = obj_prefix, SCALAR_FIELDS = SCALAR_FIELDS, obj_id = obj_id, RADIX_MARK = RADIX_MARK,
  radix_hash = radix_hash, grp_key = grp_key, node_prefix = node_prefix, grp_members_key = grp_members_key,
  member_of = member_of, key_of = key_of, keys_of = keys_of, node_field = node_field, node_of = node_of,
  MAX_KEYS_PER_CALL = MAX_KEYS_PER_CALL, object_call = object_call, per_row = per_row,
  keys_spec = keys_spec, load_object = load_object, in_progress = in_progress, replicas_of = replicas_of,
  encode_reps = encode_reps, decode_reps = decode_reps, write_reps = write_reps, needs_read_mark = needs_read_mark,
  live_replicas = live_replicas, lease_until = lease_until,
}
