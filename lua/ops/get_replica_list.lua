-- get_replica_list / exist_key: reads. Only complete objects with a live replica are readable;
-- a successful read leases the object (or its group) until at least now + default_kv_lease_ttl
-- (renewing it, when it falls short, to that rounded up to a multiple of kv_lease_slack:
-- extend_lease).
-- KEYS: P.  ARGV: options tenant, and for get_replica_list guaranteed_ttl_ms (0 -
--   max_guaranteed_ttl, default 0: renew-only, an object whose guarantee is active gets
--   guaranteed_until = max(guaranteed_until, now + guaranteed_ttl_ms); any other is unchanged);
--   with_disk (0|1, default 0; get_replica_list only), fields key.
-- get_replica_list reply, per key: {lease_ttl_ms, size, segment, offset, segment, offset, ...}
--   or an error code; with with_disk=1 see disk_reply below (disk replicas and the checksum).
-- An object whose memory replicas are gone stays readable while it has a live disk replica
-- (with_disk=0 then answers it with no replica).   exist_key reply, per key: 1 or 0.

local E, fail, S, int_arg, register, now_ms = Base.E, Base.fail, Base.S, Base.int_arg, Base.register, Base.now_ms
local FREES = Base.FREES
local obj_key, object_call = Object.obj_key, Object.object_call
local keys_spec, load_object, in_progress = Object.keys_spec, Object.load_object, Object.in_progress
local live_replicas, node_of = Object.live_replicas, Object.node_of
local live_disk_replicas = Disk.live_disk_replicas
local being_evicted, extend_lease = Units.being_evicted, Units.extend_lease
local flush_rescore, delete_object = Units.flush_rescore, Units.delete_object
local renew_guarantee = Units.renew_guarantee
local settle_disk_only = Offload.settle_disk_only

local NO_DISKS = {} -- read only
local plain_lease, plain_lease_now = Units.plain_lease, Units.plain_lease_now
local object_unit_prefix = Units.object_unit_prefix
local lease_group, group_unit, group_tiers = Units.lease_group, Units.group_unit, Units.group_tiers
local MEMO_FIELD = Units.MEMO_FIELD
local grp_key, obj_prefix, node_prefix = Object.grp_key, Object.obj_prefix, Object.node_prefix
local node_unit_prefix = Units.node_unit_prefix
local mount_of, mount_table = Alloc.mount_of, Base.mount_table

local GENERAL = {} -- plain_read's answer for an object that needs read_one

-- Standard functions, bound at the first call (while the library loads, its code may read no
-- global but redis): a global read goes through the sandbox's table (and its metatable) each
-- time, a local costs nothing.
local find, sub, tonumber_ = nil, nil, nil

-- Numbers of the decimal strings a read converts again and again (object sizes, segment name
-- lengths): tonumber is a strtod. Bounded: dropped whole at NUMS_MAX entries.
local NUMS, nums_n, NUMS_MAX = {}, 0, 4096
local function num(s)
  local n = NUMS[s]
  if n or not s then return n end
  n = tonumber_(s)
  if nums_n >= NUMS_MAX then NUMS, nums_n = {}, 0 end
  NUMS[s], nums_n = n, nums_n + 1
  return n
end

-- What the reads of one call share, set by batch_read before its first row (Redis runs one call
-- at a time): the shard, the tenant, the clock (nil until a row needs it), the config, the
-- re-scores (nil for a call of one key until a row needs them), the mount ids (a table for a
-- store without a mount epoch, else nil), the replica tails seen (live_tail), the prefixes of
-- the object keys and units and of the radix nodes' records and units, and the lease of plain
-- objects (their lease, its score and the queue of their tier's re-scores with its length; nil
-- until the first one), or R_single: a call of one key, whose plain lease is sent at once.
local R_P, R_tenant, R_now, R_cfg, R_rescore, R_mounts, R_tails, R_okey, R_unit, R_node, R_node_unit
local R_until, R_score, R_q, R_qn, R_single
-- The record of the composite unit (group, radix node) the batch's last key belonged to, by its
-- key, with the lease as this call left it (in place of the raw lease_until, at 2): the keys of
-- one unit that come one after another (a page's k and v, its tensor-parallel ranks' keys) read
-- it once and renew its lease once. Dropped when a read takes the general path, which may write
-- a unit's record.
local R_gkey, R_g

-- The object key and unit prefixes of a shard and tenant, and its radix nodes' (pure functions
-- of them), built once. Bounded: dropped whole at PREFIXES_MAX pairs.
local PREFIXES, prefixes_n, PREFIXES_MAX = {}, 0, 1024

local function read_now()
  if not R_now then R_now = now_ms(R_P) end
  return R_now
end

-- The one memory replica of a `reps` value, from its tail after the offset ("<mount id>
-- <#segment> <segment>"): the segment when it is live, else false (also for several replicas
-- or a malformed value: walk_reps decides those). Remembered per tail while the mount epoch
-- holds (beside the mount ids, Base.mount_table: counted in its bound), or for the call on a
-- store without an epoch.
local function live_tail(tail)
  local seg = R_tails[tail]
  if seg ~= nil then return seg end
  local s2 = find(tail, ' ', 1, true)
  local s3 = s2 and find(tail, ' ', s2 + 1, true)
  local len = s3 and num(sub(tail, s2 + 1, s3 - 1))
  seg = false
  if len and len >= 1 and s3 + len == #tail then
    local name = sub(tail, s3 + 1)
    if mount_of(R_P, name, R_mounts) == sub(tail, 1, s2 - 1) then seg = name end
  end
  if not R_mounts then
    local m = mount_table(R_P)
    if m then m.n = m.n + 1 end
  end
  R_tails[tail] = seg
  return seg
end

-- Whether every replica of `reps` is live and well-formed (read_one's rules: else the general
-- path). With `r` (a reply being built), each one's (segment, offset) is appended to it.
local function walk_reps(reps, r, kind)
  local at, n = 1, #reps
  while at <= n do
    local s1 = find(reps, ' ', at, true)
    local s2 = s1 and find(reps, ' ', s1 + 1, true)
    local s3 = s2 and find(reps, ' ', s2 + 1, true)
    local len = s3 and num(sub(reps, s2 + 1, s3 - 1))
    if not len or len < 1 or s3 + len > n then return false end -- malformed
    local seg = sub(reps, s3 + 1, s3 + len)
    if mount_of(R_P, seg, R_mounts) ~= sub(reps, s1 + 1, s2 - 1) then return false end -- dead: read_one drops it
    if r then
      r[#r + 1] = seg
      r[#r + 1] = tonumber_(sub(reps, at, s1 - 1))
      if kind == 'disk' then r[4] = r[4] + 1 end
    end
    at = s3 + len + 1
  end
  return true
end

-- A read's reply for a plain object (complete, no guarantee, hard pin, task, soft pin or disk
-- replica, every replica live), or GENERAL for any other (and an error code for a missing or
-- unfinished one). One HMGET of the fields a read takes (size, status, reps, group, node,
-- special, checksum; exist_key leaves out size and checksum) answers a plain object without
-- more calls but, for a group member (or a radix node's key), one HMGET of its group's record;
-- read_one loads the whole hash of any other. `kind`: 'exist', 'get' or 'disk'
-- (get_replica_list with with_disk=1). The replicas are walked in place (plain finds, no
-- pattern, no table per replica), and one replica on a segment already seen costs a find and a
-- sub (live_tail): this is every read's path.
local function plain_read(call, key, kind)
  local status, size, reps, group, node, special, checksum
  if kind == 'exist' then
    local v = call('HMGET', R_okey .. key, 'reps', 'status', 'group', 'node', 'special')
    reps, status, group, node, special = v[1], v[2], v[3], v[4], v[5]
    -- no reps, no read mark and no status (which every object of an older schema and every put
    -- in progress has): none, or an object whose memory replicas are gone, unreadable either way
    if not (reps or special or status) then return E.OBJECT_NOT_FOUND end
  else
    local v = call('HMGET', R_okey .. key, 'size', 'status', 'reps', 'group', 'node', 'special', 'checksum')
    size, status, reps, group, node, special, checksum = v[1], v[2], v[3], v[4], v[5], v[6], v[7]
    if not size then return E.OBJECT_NOT_FOUND end -- every object has a size (20_object.lua)
  end
  if not reps or special then return GENERAL end -- no memory replica field, or the read mark (20_object.lua)
  local gkey, unit, group_lease, retained_until, grouped, memo, g
  if group then -- a group member (or a radix node's key, below): the group is the unit
    gkey, unit = grp_key(R_P, R_tenant, group), group_unit(R_tenant, group)
  elseif node then -- grp_key and group_unit of RADIX_MARK .. node
    node = node_of(key, node)
    gkey, unit = R_node .. node, R_node_unit .. node
  end
  if gkey then
    if not R_rescore then R_rescore = {} end
    if gkey == R_gkey then
      g = R_g
    else
      g = call('HMGET', gkey, 'draining', 'lease_until', 'retained_until', 'grouped', MEMO_FIELD)
      g[2] = tonumber_(g[2]) or 0
      R_gkey, R_g = gkey, g
    end
    if g[1] == '1' then return E.OBJECT_NOT_FOUND end -- being evicted: gone for readers
    group_lease, retained_until, grouped, memo = g[2], g[3], g[4], g[5] or nil
  end
  if in_progress(status) then return E.REPLICA_IS_NOT_READY end
  local r, off
  local s1 = find(reps, ' ', 1, true)
  local seg = s1 and live_tail(sub(reps, s1 + 1))
  if seg then -- one live replica
    if kind ~= 'exist' then off = tonumber_(sub(reps, 1, s1 - 1)) end
  else
    if kind == 'get' then r = { 0, num(size) } elseif kind == 'disk' then r = { 0, num(size), checksum or '', 0 } end
    if not walk_reps(reps, r, kind) then return GENERAL end
  end
  local now, cfg, until_ms = read_now(), R_cfg, nil
  if gkey then
    until_ms = lease_group(gkey, unit, group_lease,
      now + cfg.default_kv_lease_ttl, cfg.kv_lease_slack, R_rescore, group_tiers(retained_until, now, grouped, memo))
    g[2] = until_ms
  else
    if R_single then -- a call of one key: its re-score goes at once
      until_ms = plain_lease_now(R_P, R_unit .. key, now + cfg.default_kv_lease_ttl, cfg.kv_lease_slack, now)
    else
      if not R_q then
        R_until, R_score, R_q = plain_lease(R_rescore, now + cfg.default_kv_lease_ttl, cfg.kv_lease_slack, now)
        R_qn = #R_q
      end
      R_q[R_qn + 1], R_q[R_qn + 2], R_qn = R_score, R_unit .. key, R_qn + 2
      until_ms = R_until
    end
  end
  if kind == 'exist' then return 1 end
  if r then r[1] = until_ms - now; return r end
  if kind == 'get' then return { until_ms - now, num(size), seg, off } end
  return { until_ms - now, num(size), checksum or '', 1, seg, off }
end

-- Returns the live replicas, or nil and an error code; leases the object on success.
local function read_one(P, tenant, key, now, cfg, guarantee_ttl, mount_cache, rescore, disk_cache)
  local okey = obj_key(P, tenant, key)
  local o = load_object(okey)
  if not o or being_evicted(P, tenant, o) then return nil, E.OBJECT_NOT_FOUND end
  if o.status ~= 'complete' then return nil, E.REPLICA_IS_NOT_READY end
  local live, maybe_disk = live_replicas(P, okey, o, mount_cache)
  local disks = maybe_disk and live_disk_replicas(P, okey, o, disk_cache) or NO_DISKS
  if #live == 0 and #disks == 0 then -- every replica was on unmounted segments: the object is gone
    delete_object(P, tenant, key, okey, o, nil, now)
    return nil, E.OBJECT_NOT_FOUND
  end
  if #live == 0 and o.group then settle_disk_only(P, tenant, key, okey, now) end
  local leased_until = extend_lease(P, tenant, key, okey, o, now + cfg.default_kv_lease_ttl, cfg.kv_lease_slack, rescore, now)
  local guaranteed = o.guaranteed_until and tonumber(o.guaranteed_until) or 0 -- most objects have none
  if guaranteed > now and now + guarantee_ttl > guaranteed then
    renew_guarantee(P, tenant, key, okey, o, now + guarantee_ttl)
  end
  return live, leased_until - now, o.size, disks, o.checksum -- size as stored: the reply shapes convert it
end

-- with_disk=1: {lease_ttl_ms, size, checksum ("" if none), n_memory, (segment, offset) x n_memory,
-- (client, location) x n_disk}: memory replicas first, then disk replicas.
local function disk_reply(live, ttl_or_code, size, disks, checksum)
  if not live then return ttl_or_code end
  local r = { ttl_or_code, tonumber(size), checksum or '', #live }
  for _, rep in ipairs(live) do
    r[#r + 1] = rep.seg
    r[#r + 1] = rep.off
  end
  for _, d in ipairs(disks) do
    r[#r + 1] = d.client
    r[#r + 1] = d.location
  end
  return r
end

local function replica_reply(live, ttl_or_code, size)
  if not live then return ttl_or_code end
  local r = { ttl_or_code, tonumber(size) }
  for _, rep in ipairs(live) do
    r[#r + 1] = rep.seg
    r[#r + 1] = rep.off
  end
  return r
end

local function exist_reply(live) return live and 1 or 0 end

local GET_SPEC, EXIST_SPEC = keys_spec('guaranteed_ttl_ms', 'optional'), keys_spec()
GET_SPEC.opts.with_disk = 'optional'

local function batch_read(P, args, cfg, spec, shape)
  local call, err = object_call(args, spec)
  if not call then return err end
  local guarantee_ttl = int_arg(call.opts.guaranteed_ttl_ms or '0', 0, cfg.max_guaranteed_ttl or 0)
  if not guarantee_ttl then
    return fail(E.INVALID_PARAMS, 'guaranteed_ttl_ms must be an integer in [0, max_guaranteed_ttl ('
      .. S(cfg.max_guaranteed_ttl) .. ')]')
  end
  local with_disk = call.opts.with_disk or '0'
  if with_disk ~= '0' and with_disk ~= '1' then return fail(E.INVALID_PARAMS, 'with_disk must be 0 or 1') end
  local kind = (shape == exist_reply and 'exist') or (with_disk == '1' and 'disk') or 'get'
  if not find then find, sub, tonumber_ = string.find, string.sub, tonumber end
  local redis_call, tenant, reply, stride = redis.call, call.tenant, {}, call.stride -- rows of one field: key
  local m = mount_table(P)
  R_single = call.rows == 1
  R_P, R_tenant, R_now, R_cfg, R_rescore, R_q = P, tenant, nil, cfg, not R_single and {} or nil, nil
  R_gkey, R_g = nil, nil
  R_mounts = not m and {} or nil
  if m then
    R_tails = m.tails
    if not R_tails then R_tails = {}; m.tails = R_tails end
  else
    R_tails = {}
  end
  local pre = PREFIXES[P] and PREFIXES[P][tenant]
  if not pre then
    if prefixes_n >= PREFIXES_MAX then PREFIXES, prefixes_n = {}, 0 end
    pre = { obj_prefix(P, tenant), object_unit_prefix(tenant), node_prefix(P, tenant), node_unit_prefix(tenant) }
    PREFIXES[P] = PREFIXES[P] or {}
    PREFIXES[P][tenant], prefixes_n = pre, prefixes_n + 1
  end
  R_okey, R_unit, R_node, R_node_unit = pre[1], pre[2], pre[3], pre[4]
  for i = 1, call.rows do
    local key = args[call.first + (i - 1) * stride]
    local got = plain_read(redis_call, key, kind)
    if kind == 'exist' and got ~= GENERAL then
      got = got == 1 and 1 or 0 -- an error code: it does not exist (for readers)
    elseif got == GENERAL then
      if not R_rescore then R_rescore = {} end
      local live, ttl_or_code, size, disks, checksum = read_one(P, tenant, key, read_now(), cfg, guarantee_ttl,
        R_mounts, R_rescore, {})
      if R_q then R_qn = #R_q end -- read_one may have queued a re-score there too
      R_gkey, R_g = nil, nil -- (and written a unit's record)
      if kind == 'disk' then got = disk_reply(live, ttl_or_code, size, disks, checksum) else got = shape(live, ttl_or_code, size) end
    end
    reply[i] = got
  end
  if R_rescore then flush_rescore(P, R_rescore) end
  R_rescore, R_q, R_gkey, R_g = nil, nil, nil, nil
  return reply
end

register('mc_get_replica_list', { 'default_kv_lease_ttl', 'kv_lease_slack', 'max_guaranteed_ttl' },
  function(P, args, cfg) return batch_read(P, args, cfg, GET_SPEC, replica_reply) end, FREES)
register('mc_exist_key', { 'default_kv_lease_ttl', 'kv_lease_slack' },
  function(P, args, cfg) return batch_read(P, args, cfg, EXIST_SPEC, exist_reply) end, FREES)
