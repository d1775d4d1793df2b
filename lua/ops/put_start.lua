-- put_start: allocate replicas for new objects.
-- KEYS: P.  ARGV (see parse_call): options client_id (required), tenant, replica_num (1-64,
--   default 1), soft_pin_action (enable|preserve|disable, default preserve), soft_pin_ttl_ms
--   (only with enable; default default_kv_soft_pin_ttl), hard_pin (0|1), group, preferred
--   (repeatable, in order of preference), guaranteed_ttl_ms (0 - max_guaranteed_ttl, default 0:
--   with > 0 each new object is guaranteed until now + guaranteed_ttl_ms), guarantee_fallback
--   (0|1: a key that would pass the guaranteed-capacity limit is written as an ordinary object
--   instead of failing), host (1-256 bytes: the writer's node, Mooncake's host_id) and
--   prefer_same_host (0|1, default 0; 1 needs host: after the preferred segments, one replica is
--   placed on a segment of P:hsegs:<host> with room, the most free first, before the strategy's
--   segments); fields key, size, prefix (optional: the key's prefix hash, computed by
--   the caller with the store's one extraction rule; kept as the object's `prefix` field for
--   prefix-wide operations such as expire_guaranteed; a guaranteed key without one is its own
--   prefix), node, parent and parent_shard (optional: with enable_radix_tree, a key registers
--   under the radix node `node` (its prefix hash, computed by the caller with the same rule;
--   '' = not indexed), and the node under `parent`, whose shard the caller computes with the
--   store's routing ('' = a root); see 32_radix.lua). A grouped key with a node has the node as
--   its unit and is an indexed member of its group (field `ugroup`, 30_units.lua).
--   Per key also INVALID_PARAMS when the node has another parent, or a grouped key would pass
--   MAX_NODE_GROUPS / MAX_GROUP_NODES; NO_AVAILABLE_HANDLE while the node is being evicted.
-- Reply: one entry per key: {segment, offset, segment, offset, ...} or an error code
--   (GUARANTEED_CAPACITY_EXCEEDED: the shard's or the tenant's guaranteed bytes would pass their
--   limit, see guarantee_room; nothing is allocated).
-- Bounds: at most MAX_PUTS_PER_CALL keys and MAX_PREFERRED preferred segments a call; the search
-- for space looks at the preferred segments, the host's (at most 64), and the segments of the
-- store's allocation_strategy (most_free: the SEARCH_EXTRA + replica_num segments with the most
-- free bytes; random and free_ratio_first: as many random picks besides; see most_free below),
-- never at every segment of the shard.
-- Retry: a put_start of a key whose put is in progress, by the same writer with the same size,
-- answers the replicas already allocated (so a caller whose first call timed out can retry).

local tonumber_, byte_, max_, min_ -- (bound at the first call: Base.on_first_call)
Base.on_first_call(function() tonumber_, byte_, max_, min_ = tonumber, string.byte, math.max, math.min end)
local K, E, fail, S, MAX_INT = Base.K, Base.E, Base.fail, Base.S, Base.MAX_INT
local int_arg, now_ms, valid_tenant = Base.int_arg, Base.now_ms, Base.valid_tenant
local valid_name, parse_call, row_of = Base.valid_name, Base.parse_call, Base.row_of
local register = Base.register
local alloc_extent, mount_of = Alloc.alloc_extent, Alloc.mount_of
local slice_size, host_key = Alloc.slice_size, Alloc.host_key
local hold_until, release_held, count_objects = Alloc.hold_until, Alloc.release_held, Ledger.count_objects
local with_ledger, settle_counters = Ledger.with_ledger, Ledger.settle_counters
local obj_key, obj_id, load_object, put_started = Object.obj_key, Object.obj_id, Object.load_object, Object.put_started
local replicas_of, encode_reps, node_field = Object.replicas_of, Object.encode_reps, Object.node_field
local guarantee_room, start_guarantee = Guarantee.guarantee_room, Guarantee.start_guarantee
local group_draining, being_evicted = Units.group_draining, Units.being_evicted
local join_group, delete_object = Units.join_group, Units.delete_object
local indexed_room, join_indexed = Units.indexed_room, Units.join_indexed
local sweep_guarantees, sweep_deadlines = Units.sweep_guarantees, Units.sweep_deadlines
local radix_group, radix_settle, rnode_key = Radix.radix_group, Radix.radix_settle, Radix.rnode_key
local radix_check, radix_register, radix_hold = Radix.radix_check, Radix.radix_register, Radix.radix_hold
local radix_parent_of = Radix.radix_parent_of
local next_candidate, evict_unit = Evict.next_candidate, Evict.evict_unit

-- Pick up to `want` distinct segments with room for `size`: the preferred ones first, then (with
-- prefer_same_host) one replica on the writer's host (`host`: its segments, most free first,
-- as {seg, free} with the free bytes read at the call's start), then the strategy's list.
-- `free_of` (the strategy's free bytes per segment, or nil) skips segments without the room.
-- `mounts` memoises the segments' mount ids for the call (mount_of).
local function allocate(P, size, want, preferred, by_free, mounts, host, free_of)
  local got, used = {}, {}
  local function try(seg)
    if #got >= want or used[seg] then return false end
    local mount = mount_of(P, seg, mounts)
    if not mount then return false end
    local off = alloc_extent(P, seg, size)
    if not off then return false end
    used[seg] = true
    got[#got + 1] = { seg = seg, off = off, mount = mount }
    return true
  end
  for _, seg in ipairs(preferred) do try(seg) end
  if host then
    for _, h in ipairs(host) do
      if h.free >= size and try(h.seg) then h.free = h.free - size; break end
    end
  end
  for _, seg in ipairs(by_free) do
    if not free_of or (free_of[seg] or 0) >= size then try(seg) end
  end
  return got
end

-- Evict-on-put: each key that finds no space may evict up to EVICT_PER_KEY units (a unit costs
-- 1, a group 1 per member dropped), so a batch evicts what its keys need, and a call at most
-- EVICT_PER_CALL in all, so it stays short; past that, puts fail with NO_AVAILABLE_HANDLE and
-- P.put_failed starts the workers' eviction.
local EVICT_PER_KEY, EVICT_PER_CALL = 16, 256
local MAX_PUTS_PER_CALL, MAX_PREFERRED, SEARCH_EXTRA = 128, 64, 16
local GUARANTEE_SWEEP = 64 -- due guarantees a guaranteed put_start ends before it checks the limit

-- Could `size` fit in some segment slice of this shard if it were empty?
local function could_fit(P, size, by_free)
  for _, seg in ipairs(by_free) do
    if (tonumber_(redis.call('HGET', P .. K.segment .. seg, 'size')) or 0) >= size then return true end
  end
  return false
end

-- The segments an allocation looks at (besides the preferred ones and the writer's host), by
-- the store's allocation_strategy: most_free, the SEARCH_EXTRA + replica_num segments with the
-- most free bytes; random, as many random picks (ZRANDMEMBER, uniform, repeats dropped), then
-- the most free ones (so a put fails only when no segment the search sees has room);
-- free_ratio_first, the picks and the most free ones ranked by free / slice size. Sets a.free_of
-- (segment -> free bytes) for the sampling strategies.
local function pairs_of(reply, into, seen)
  for i = 1, #reply, 2 do
    local seg = reply[i]
    if not seen[seg] then
      seen[seg] = tonumber_(reply[i + 1])
      into[#into + 1] = seg
    end
  end
end

local function most_free(P, a, cfg)
  settle_counters(P) -- the free bytes as the call's allocations and evictions left them
  local n, strategy = SEARCH_EXTRA + a.replica_num, cfg.allocation_strategy
  if strategy == 'most_free' then return redis.call('ZREVRANGE', P .. K.segments, 0, n - 1) end
  local list, free_of = {}, {}
  local top = redis.call('ZREVRANGE', P .. K.segments, 0, n - 1, 'WITHSCORES')
  a.free_of = free_of
  if #top == 0 then return list end -- (and no ZRANDMEMBER of a missing key: fakeredis fails it)
  pairs_of(redis.call('ZRANDMEMBER', P .. K.segments, -n, 'WITHSCORES'), list, free_of)
  pairs_of(top, list, free_of)
  if strategy == 'free_ratio_first' then
    local ratio = {}
    for _, seg in ipairs(list) do ratio[seg] = free_of[seg] / max_(slice_size(P, seg), 1) end
    table.sort(list, function(x, y)
      if ratio[x] ~= ratio[y] then return ratio[x] > ratio[y] end
      return x < y
    end)
  end
  return list
end

-- The writer's host's segments (prefer_same_host): {seg, free} most free first, those not
-- mounted (a stale entry) left out. At most MAX_HOST_SEGMENTS.
local function host_segments(P, host)
  settle_counters(P)
  local names = redis.call('SMEMBERS', host_key(P, host))
  if #names == 0 then return nil end
  local free = redis.call('ZMSCORE', P .. K.segments, unpack(names))
  local out = {}
  for i, seg in ipairs(names) do
    if free[i] then out[#out + 1] = { seg = seg, free = tonumber_(free[i]) } end
  end
  table.sort(out, function(x, y)
    if x.free ~= y.free then return x.free > y.free end
    return x.seg < y.seg
  end)
  return out
end

-- Returns the replicas got, whether eviction could have helped (the put fits some slice), and
-- whether it evicted anything.
local function allocate_evicting(P, size, a, now, cfg, by_free)
  local got = allocate(P, size, a.replica_num, a.preferred, by_free, a.mounts, a.host_segs, a.free_of)
  if #got > 0 then return got, true end
  -- evict only for a put that eviction can help: never for one larger than every slice
  local fits = could_fit(P, size, by_free)
  if cfg.evict_on_put ~= 1 or not fits then return got, fits end
  if not a.swept then
    sweep_deadlines(P, now, EVICT_PER_KEY)
    a.swept = true
  end
  local budget = min_(EVICT_PER_KEY, a.evict_budget)
  local evicted = false
  while budget > 0 do
    local unit = next_candidate(P, now, cfg)
    if not unit then break end
    local n, _, spent = evict_unit(P, unit, now, budget, cfg)
    budget, a.evict_budget = budget - spent, a.evict_budget - spent
    if n > 0 then
      evicted = true
      by_free = most_free(P, a, cfg) -- the freed bytes may sit in a segment the first search passed over
      a.by_free = by_free
      if a.host then a.host_segs = host_segments(P, a.host) end
      got = allocate(P, size, a.replica_num, a.preferred, by_free, a.mounts, a.host_segs, a.free_of)
      if #got > 0 then return got, true, true end
    end
  end
  return got, true, evicted
end

-- The replicas of a put in progress, as put_start first answered them (minus dead ones).
local function retry_reply(P, o)
  local reply = {}
  for _, r in ipairs(replicas_of(P, o)) do
    if r.live then
      reply[#reply + 1] = r.seg
      reply[#reply + 1] = r.off
    end
  end
  if #reply == 0 then return E.OBJECT_ALREADY_EXISTS end
  return reply
end

-- May this key be guaranteed with `bytes` more? Without fallback a refusal fails the key; with
-- it the key is written as an ordinary object.
local function guarantee_allowed(P, a, bytes, cfg)
  return guarantee_room(P, a.tenant, bytes, cfg) and 'yes' or (a.fallback and 'no' or 'refused')
end

-- A key may join node h (radix_check, and the node is not being evicted): nil and the node's
-- record as read, or an error code.
local function check_node(P, tenant, h, parent, pshard, cfg)
  local code, nrec = radix_check(P, tenant, h, parent, pshard, cfg.shards)
  if code then return code end
  if nrec[3] == '1' then return E.NO_AVAILABLE_HANDLE end
  return nil, nrec
end

local function put_one(P, a, row, size, now, cfg, by_free)
  local key, prefix = row.key, row.prefix
  if not valid_name(key, cfg.max_key_length) or not size then return E.INVALID_PARAMS end
  if prefix ~= nil and not valid_name(prefix, 256) then return E.INVALID_PARAMS end
  if a.group and group_draining(P, a.tenant, a.group) then return E.NO_AVAILABLE_HANDLE end
  -- the radix index: a key with a prefix hash registers under its node, its unit; a grouped
  -- one is also a member of its group (join_indexed, 30_units.lua)
  local node = a.radix and row.node ~= '' and row.node or nil
  local parent, pshard, nrec
  if node then
    parent, pshard = radix_parent_of(row)
    local code
    code, nrec = check_node(P, a.tenant, node, parent, pshard, cfg)
    if code then return code end
    if a.group and not indexed_room(P, a.tenant, a.group, node) then return E.INVALID_PARAMS end
  end
  local okey = obj_key(P, a.tenant, key)
  local old = load_object(okey)
  if old and being_evicted(P, a.tenant, old) then
    delete_object(P, a.tenant, key, okey, old, nil, now) -- it was being evicted: finish it now
    old, nrec = nil, nil -- (its node may have changed)
  end
  if old then
    if old.status == 'complete' then return E.OBJECT_ALREADY_EXISTS end
    local started = put_started(P, a.tenant, key, old, 0)
    if now - started < cfg.put_start_discard_timeout then
      if old.writer == a.client and tonumber_(old.size) == size then return retry_reply(P, old) end
      return E.OBJECT_ALREADY_EXISTS
    end
    -- an abandoned put: preempt it, keeping its space until the release timeout
    delete_object(P, a.tenant, key, okey, old, hold_until(P, old.writer, started, cfg.put_start_release_timeout), now)
    nrec = nil -- (its node may have changed)
  end
  -- every replica asked for counts against the limit, checked before evict-on-put may evict
  -- anything for this key (fewer replicas allocated then hold fewer bytes than were allowed)
  local guaranteed = a.guarantee_ttl > 0 and guarantee_allowed(P, a, size * a.replica_num, cfg)
  if guaranteed == 'refused' then return E.GUARANTEED_CAPACITY_EXCEEDED end
  if node and not nrec then -- the node may have changed since it was checked: check it again
    local code
    code, nrec = check_node(P, a.tenant, node, parent, pshard, cfg)
    if code then return code end
  end
  -- the node is linked to its parent and held before evict-on-put runs, so that neither the
  -- parent (on this shard) nor the node is a candidate for the room this key needs; a refused
  -- key takes both back. A new node's record is written with this key's counters (join_group):
  -- `fresh` holds its fields until then.
  local fresh = node and radix_register(P, a.tenant, node, parent, pshard, now, nrec, true)
  if node and not fresh then radix_hold(P, a.tenant, node, nrec[4] or nil, now) end
  local got, fits, evicted = allocate_evicting(P, size, a, now, cfg, by_free)
  -- an eviction may have dropped the node (a shell whose last child it evicted): register it again
  if node and evicted and not fresh then fresh = radix_register(P, a.tenant, node, parent, pshard, now, nil, true) end
  if #got == 0 then
    if fits then redis.call('HSET', P, 'put_failed', S(now)) end -- tells the eviction workers to start
    if fresh then redis.call('HSET', rnode_key(P, a.tenant, node), unpack(fresh)) end -- (so that it settles)
    if node then radix_settle(P, a.tenant, node, now, 0) end
    return E.NO_AVAILABLE_HANDLE
  end
  local guaranteed_until = guaranteed == 'yes' and now + a.guarantee_ttl or nil
  -- default-valued fields are left out (no lease, no soft pin, no hard pin, the action preserve):
  -- fewer fields for every read, and none for put_end to delete; the start is the P:processing score
  local fields = { 'size', row.size, 'status', 'processing', 'writer', a.client } -- row.size: canonical (int_arg)
  if a.pin_action ~= 'preserve' then fields[#fields + 1] = 'soft_pin_action'; fields[#fields + 1] = a.pin_action end
  if a.hard_pin == '1' then fields[#fields + 1] = 'hard_pin'; fields[#fields + 1] = '1' end
  if a.pin_ttl then fields[#fields + 1] = 'soft_pin_ttl'; fields[#fields + 1] = S(a.pin_ttl) end
  if a.group then fields[#fields + 1] = node and 'ugroup' or 'group'; fields[#fields + 1] = a.group end
  if node then fields[#fields + 1] = 'node'; fields[#fields + 1] = node_field(key, node) end -- (20_object.lua)
  if prefix then fields[#fields + 1] = 'prefix'; fields[#fields + 1] = prefix end
  if guaranteed_until then fields[#fields + 1] = 'guaranteed_until'; fields[#fields + 1] = S(guaranteed_until) end
  if guaranteed_until or a.hard_pin == '1' then fields[#fields + 1] = 'special'; fields[#fields + 1] = '1' end -- the read mark
  local reply = {}
  for _, r in ipairs(got) do -- in the order allocated (preferred segments first)
    reply[#reply + 1] = r.seg
    reply[#reply + 1] = r.off
  end
  fields[#fields + 1] = 'reps'
  fields[#fields + 1] = encode_reps(got)
  redis.call('HSET', okey, unpack(fields))
  redis.call('ZADD', P .. K.processing, now, obj_id(a.tenant, key))
  count_objects(P, 1)
  if guaranteed_until then start_guarantee(P, a.tenant, key, prefix, guaranteed_until, got, size) end
  if a.group and node then
    join_indexed(P, a.tenant, key, a.group, node)
  elseif a.group then
    join_group(P, a.tenant, key, a.group, a.hard_pin, guaranteed_until, now)
  end
  if node then join_group(P, a.tenant, key, radix_group(node), a.hard_pin, guaranteed_until, now, fresh) end
  return reply
end

local PUT_SPEC = {
  opts = { client_id = 'required', tenant = 'optional', replica_num = 'optional', soft_pin_action = 'optional',
    soft_pin_ttl_ms = 'optional', hard_pin = 'optional', group = 'optional', preferred = 'list',
    guaranteed_ttl_ms = 'optional', guarantee_fallback = 'optional', host = 'optional', prefer_same_host = 'optional' },
  fields = { key = 'required', size = 'required', prefix = 'optional', node = 'optional', parent = 'optional',
    parent_shard = 'optional' },
  max_rows = MAX_PUTS_PER_CALL,
}

local function parse_put_args(call, cfg)
  local o = call.opts
  local a = { call = call, client = o.client_id, tenant = o.tenant or 'default', radix = cfg.enable_radix_tree == 1,
    pin_action = o.soft_pin_action or 'preserve', hard_pin = o.hard_pin or '0' }
  if not valid_name(a.client, 256) then return nil, 'client_id must be 1-256 bytes' end
  if not valid_tenant(a.tenant) then return nil, 'tenant_id must match [A-Za-z0-9_.-]{1,64}' end
  a.replica_num = int_arg(o.replica_num or '1', 1, 64)
  if not a.replica_num then return nil, 'replica_num must be an integer in [1, 64]' end
  if a.hard_pin ~= '0' and a.hard_pin ~= '1' then return nil, 'hard_pin must be 0 or 1' end
  if o.group then
    if not valid_name(o.group, 256) or byte_(o.group, 1) == 0 then
      return nil, 'group_id must be 1-256 bytes, not starting with a NUL byte'
    end
    a.group = o.group
  end
  if o.soft_pin_ttl_ms then
    a.pin_ttl = int_arg(o.soft_pin_ttl_ms, 0, MAX_INT)
    if not a.pin_ttl then return nil, 'soft_pin_ttl_ms must be an integer >= 0' end
  end
  if a.pin_action == 'enable' then
    a.pin_ttl = a.pin_ttl or cfg.default_kv_soft_pin_ttl
    if a.pin_ttl > cfg.max_kv_soft_pin_ttl then
      return nil, 'soft_pin_ttl_ms above max_kv_soft_pin_ttl (' .. S(cfg.max_kv_soft_pin_ttl) .. ')'
    end
  elseif a.pin_action == 'preserve' or a.pin_action == 'disable' then
    if a.pin_ttl then return nil, 'soft_pin_ttl_ms is only valid with soft_pin_action enable' end
  else
    return nil, 'soft_pin_action must be enable, preserve or disable'
  end
  a.guarantee_ttl = int_arg(o.guaranteed_ttl_ms or '0', 0, cfg.max_guaranteed_ttl)
  if not a.guarantee_ttl then
    return nil, 'guaranteed_ttl_ms must be an integer in [0, max_guaranteed_ttl (' .. S(cfg.max_guaranteed_ttl) .. ')]'
  end
  local fallback = o.guarantee_fallback or '0'
  if fallback ~= '0' and fallback ~= '1' then return nil, 'guarantee_fallback must be 0 or 1' end
  a.fallback = fallback == '1'
  a.preferred = o.preferred or {}
  if #a.preferred > MAX_PREFERRED then return nil, 'at most ' .. MAX_PREFERRED .. ' preferred segments' end
  local host, same = o.host, o.prefer_same_host or '0'
  if host ~= nil and not valid_name(host, 256) then return nil, 'host must be 1-256 bytes' end
  if same ~= '0' and same ~= '1' then return nil, 'prefer_same_host must be 0 or 1' end
  if same == '1' and not host then return nil, 'prefer_same_host needs the writer\'s host' end
  a.host = same == '1' and host or nil -- a host alone is accepted and changes nothing (Mooncake sends host_id always)
  return a
end

-- The parsed options are a pure function of the call's head and the configuration, and both are
-- memoised (parse_call, config: the same tables while neither changes), so the parse is kept on
-- the call for its configuration. Each call reads it through a fresh table of its own state
-- (evict_budget, mounts, by_free, swept, now_s), which leaves the shared one untouched.
local function put_args(args, cfg)
  local call, err = parse_call(args, PUT_SPEC)
  if not call then return nil, err end
  local memo = call.put_args
  if not memo or memo.cfg ~= cfg then
    local parsed
    parsed, err = parse_put_args(call, cfg)
    if not parsed then return nil, err end
    memo = { cfg = cfg, meta = { __index = parsed } }
    call.put_args = memo
  end
  return setmetatable({}, memo.meta)
end

local function put_rows(P, a, args, now, cfg)
  local reply = {}
  for r = 1, a.call.rows do
    local row = row_of(args, a.call, r)
    reply[r] = put_one(P, a, row, int_arg(row.size, 1, MAX_INT), now, cfg, a.by_free)
  end
  return reply
end

local function put_start(P, args, cfg)
  local a, err = put_args(args, cfg)
  if not a then return fail(E.INVALID_PARAMS, err) end
  local now = now_ms(P)
  a.now_s = S(now)
  release_held(P, now, 16)
  if a.guarantee_ttl > 0 then sweep_guarantees(P, now, GUARANTEE_SWEEP) end -- the limit counts only live guarantees
  a.evict_budget, a.mounts = EVICT_PER_CALL, {}
  a.by_free = most_free(P, a, cfg)
  if a.host then a.host_segs = host_segments(P, a.host) end
  if a.call.rows == 1 then return put_rows(P, a, args, now, cfg) end
  return with_ledger(P, put_rows, a, args, now, cfg) -- a batch writes the shard counters once
end

register('mc_put_start', { 'put_start_discard_timeout', 'put_start_release_timeout',
  'default_kv_soft_pin_ttl', 'max_kv_soft_pin_ttl', 'max_key_length', 'evict_on_put',
  'allow_evict_soft_pinned_objects', 'guaranteed_capacity_ratio', 'guaranteed_tenant_ratio',
  'max_guaranteed_ttl', 'allow_evict_retained_groups', 'enable_radix_tree', 'allocation_strategy', 'held_due' }, put_start)
