-- Shared basics: error codes, number formatting, argument parsing, clock, config.
-- Every function receives KEYS[1] = the shard key P ("<ns>:{<ns>:<shard>}"); all other
-- keys of the call are P .. ":<suffix>" and so live in the same hash slot.

-- The key schema: every key of shard P is P followed by one of these suffixes (the README's key
-- schema table; mooncake_redis/keys.py holds the same table and a test checks that they agree).
local K = {
  config = ':config', clock = ':clock', mount_seq = ':mount_seq',
  segment = ':seg:', segments = ':segs', free = ':free:', free_by_off = ':by_off', free_by_size = ':by_size',
  held = ':held', processing = ':processing', clients = ':clients', expired_clients = ':expired_clients',
  object = ':obj:', group = ':grp:', group_members = ':grpm:', aggregate = ':agg:',
  tier_ordinary = ':evict:ordinary', tier_soft = ':evict:soft', draining = ':evict:draining',
  deadline_soft_pin = ':deadline:soft_pin', sweep_pending = ':sweep_pending', worker = ':worker',
  guaranteed = ':guaranteed', guaranteed_tenants = ':gtenants', guarantee_prefix = ':gpfx:',
  -- group retention (lua/lib/35_retention.lua): its tiers, its deadline index, its per-tenant counts
  tier_retained = ':evict:retained', tier_soft_retained = ':evict:soft_retained',
  deadline_retention = ':deadline:retention', retained_tenants = ':retained_tenants',
  -- the radix index (lua/lib/32_radix.lua): node records, their keys and children, every node
  -- of the shard, and the outbox of cross-shard steps
  radix_node = ':rnode:', radix_keys = ':rkeys:', radix_kids = ':rkids:',
  radix_nodes = ':rnodes', radix_outbox = ':routbox',
  -- SSD offload (lua/lib/27_disk.lua, 45_offload.lua): local disk segments, queues, tasks in flight,
  -- files to remove
  disk = ':disk:', disks = ':disks', offload_queue = ':offq:', offload_overflow = ':offover:',
  offload_inflight = ':offload_inflight', disk_removals = ':diskrm:',
}

local E = {
  OK = 0, INTERNAL_ERROR = -1,
  SEGMENT_NOT_FOUND = -101, SEGMENT_ALREADY_EXISTS = -102,
  NO_AVAILABLE_HANDLE = -200,
  INVALID_PARAMS = -600, ILLEGAL_CLIENT = -601,
  REPLICA_IS_NOT_READY = -703, OBJECT_NOT_FOUND = -704,
  OBJECT_ALREADY_EXISTS = -705, OBJECT_HAS_LEASE = -706,
  INVALID_WRITE = -700, OBJECT_HAS_REPLICATION_TASK = -708,
  GUARANTEED_CAPACITY_EXCEEDED = -10002,
}
E.RETENTION_LIMIT_EXCEEDED = -10003
E.RADIX_LINK_PENDING = -10010
-- code -> name, filled on first use (library load time may not iterate tables)
local E_NAME = nil
local function error_name(code)
  if not E_NAME then
    E_NAME = {}
    for name, c in pairs(E) do E_NAME[c] = name end
  end
  return E_NAME[code]
end

-- Whole-call error reply: "<NAME> <code> <detail>", e.g. "INVALID_PARAMS -600 size must be > 0".
local function fail(code, detail)
  return redis.error_reply(error_name(code) .. ' ' .. code .. ' ' .. detail)
end

-- Integers are doubles in Lua 5.1; '%.0f' prints them exactly up to 2^53 (tostring would not).
-- Zero is always "0": a negated zero would print "-0", which Redis 7 refuses as an integer.
local function S(n)
  if n == 0 then return '0' end
  return string.format('%.0f', n)
end

local MAX_INT = 9007199254740991 -- 2^53 - 1

-- Parse a decimal integer argument within [lo, hi]; nil unless it is in canonical form (no sign
-- on zero, no leading zeros, no '+'): "-0" or "007" would otherwise pass a range check and then
-- be stored or matched in a different spelling than the one the functions write.
local function int_arg(s, lo, hi)
  if type(s) ~= 'string' or #s > 17 then return nil end
  if s ~= '0' and not string.match(s, '^%-?[1-9]%d*$') then return nil end
  local n = tonumber(s)
  if n < lo or n > hi then return nil end
  return n
end

-- The store clock: the test hook P:clock (absolute ms) when set, else the server's TIME.
local function now_ms(P)
  local frozen = redis.call('GET', P .. K.clock)
  if frozen then return tonumber(frozen) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- P:config fields the functions read, with their ranges: {lo, hi}, or {lo, hi, 'ratio'} for a
-- finite real number. Python writes them (MasterConfig); a value out of range here means the
-- hash was edited by hand or by another program, and every function refuses to run on it.
local MAX_TTL = 1000000000000000 -- 10^15 ms: now + MAX_TTL stays far below 2^53
local CONFIG_RANGES = {
  shards = { 1, 16384 },
  default_kv_lease_ttl = { 1, MAX_TTL },
  default_kv_soft_pin_ttl = { 0, MAX_TTL },
  max_kv_soft_pin_ttl = { 0, MAX_TTL },
  eviction_high_watermark_ratio = { 0, 1, 'ratio' },
  eviction_ratio = { 0, 1, 'ratio' },
  allow_evict_soft_pinned_objects = { 0, 1 },
  put_start_discard_timeout = { 1, MAX_TTL },
  put_start_release_timeout = { 1, MAX_TTL },
  client_ttl = { 1, MAX_TTL },
  max_key_length = { 1, 1048576 },
  evict_on_put = { 0, 1 },
  guaranteed_capacity_ratio = { 0, 1, 'ratio' },
  guaranteed_tenant_ratio = { 0, 1, 'ratio' },
  max_guaranteed_ttl = { 0, MAX_TTL },
}
CONFIG_RANGES.allow_evict_retained_groups = { 0, 1 }
CONFIG_RANGES.max_retained_groups = { 0, MAX_INT }
CONFIG_RANGES.max_retained_groups_per_tenant = { 0, MAX_INT }
CONFIG_RANGES.max_group_retention = { 0, MAX_INT }
CONFIG_RANGES.enable_radix_tree = { 0, 1 }
CONFIG_RANGES.offload_on_put = { 0, 1 }
CONFIG_RANGES.offload_queue_limit = { 0, MAX_INT }
CONFIG_RANGES.offload_task_timeout = { 1, MAX_TTL }
CONFIG_RANGES.offload_max_attempts = { 1, 1000 }
CONFIG_RANGES.disk_removal_queue_limit = { 0, MAX_INT }

local function config_value(name, raw)
  local range = CONFIG_RANGES[name]
  local v = tonumber(raw)
  if not v or v ~= v or v < range[1] or v > range[2] then return nil end -- v ~= v: nan
  if range[3] ~= 'ratio' and math.floor(v) ~= v then return nil end
  return v
end

-- Read and check config fields from P:config. Returns the table, or nil and an error reply.
local function config(P, names)
  local values = redis.call('HMGET', P .. K.config, unpack(names))
  local cfg = {}
  for i, name in ipairs(names) do
    if not values[i] then return nil, fail(E.INTERNAL_ERROR,
      'store not initialised (' .. P .. ':config has no ' .. name .. '): connect once with Master.connect or mooncake-redis serve') end
    cfg[name] = config_value(name, values[i])
    if not cfg[name] then return nil, fail(E.INTERNAL_ERROR,
      'bad configuration: ' .. P .. ':config ' .. name .. ' = ' .. values[i] .. '; rewrite it with Master.connect(url, MasterConfig(...))') end
  end
  return cfg
end

-- This shard's exact share of a store-wide limit: limit / shards rounded down, plus one for the
-- first (limit mod shards) shards, so that the shares add up to the limit.
local function shard_share(P, limit, shards)
  local i = tonumber(string.match(P, ':(%d+)}$'))
  return math.floor(limit / shards) + ((i < limit % shards) and 1 or 0)
end

local function valid_tenant(t)
  return type(t) == 'string' and #t >= 1 and #t <= 64 and string.match(t, '^[%w_%.%-]+$') ~= nil
end

local function valid_name(s, max_len)
  return type(s) == 'string' and #s >= 1 and #s <= max_len
end

-- The wire format of the engine-facing functions: named options, then declared per-key fields.
--   ARGV = n_opts, (name, value) x n_opts [, n_fields, field name x n_fields, rows...]
-- where each row has n_fields values in the declared order. A caller written for an older
-- protocol keeps working when options or fields are added; an unknown option or field is
-- INVALID_PARAMS, so a newer caller learns at once what this library does not know.
-- spec = { opts = { name = 'required' | 'optional' | 'list' }, fields = { name = 'required' |
-- 'optional' } (nil for a function without rows), max_rows = N }.
-- Returns { opts = {name = value or {values} for 'list'}, fields = {names in order}, stride,
-- first (ARGV index of the first row), rows (count) }, or nil and the reason.
local function parse_call(args, spec)
  local n = int_arg(args[1], 0, 128)
  if not n or #args < 1 + 2 * n then return nil, 'expected n_opts, then that many option name, value pairs' end
  local opts = {}
  for i = 2, 2 * n, 2 do
    local name, value = args[i], args[i + 1]
    local kind = spec.opts[name]
    if not kind then return nil, 'unknown option ' .. tostring(name) end
    if kind == 'list' then
      opts[name] = opts[name] or {}
      opts[name][#opts[name] + 1] = value
    elseif opts[name] ~= nil then
      return nil, 'option ' .. name .. ' given twice'
    else
      opts[name] = value
    end
  end
  for name, kind in pairs(spec.opts) do
    if kind == 'required' and opts[name] == nil then return nil, 'missing option ' .. name end
  end
  local call = { opts = opts }
  if not spec.fields then
    if #args ~= 1 + 2 * n then return nil, 'unexpected arguments after the options' end
    return call
  end
  local at = 2 + 2 * n
  local nf = int_arg(args[at], 1, 8)
  if not nf then return nil, 'expected n_fields (1-8) after the options' end
  local fields, seen = {}, {}
  for i = 1, nf do
    local f = args[at + i]
    if not spec.fields[f] or seen[f] then return nil, 'unknown or repeated field ' .. tostring(f) end
    seen[f], fields[i] = true, f
  end
  for name, kind in pairs(spec.fields) do
    if kind == 'required' and not seen[name] then return nil, 'missing field ' .. name end
  end
  call.fields, call.stride, call.first = fields, nf, at + nf + 1
  local values = #args - call.first + 1
  if values < 0 or values % nf ~= 0 then return nil, 'each row must have ' .. nf .. ' values' end
  call.rows = values / nf
  if call.rows > spec.max_rows then return nil, 'at most ' .. spec.max_rows .. ' keys per call' end
  return call
end

-- Row r (1-based) of a parsed call, as { field = value }.
local function row_of(args, call, r)
  local t, at = {}, call.first + (r - 1) * call.stride
  for i, f in ipairs(call.fields) do t[f] = args[at + i - 1] end
  return t
end

-- The one entry check of every function that takes a shard: exactly one key, a well-formed
-- shard key "<ns>:{<ns>:<i>}" of an initialised store with i below its shard count, and a
-- valid configuration. Runs before anything is written, so a call under a made-up key plants
-- nothing. Returns P and the config fields `names` (plus shards), or nil and an error reply.
local function open_shard(keys, names)
  local P = keys[1]
  if #keys ~= 1 or type(P) ~= 'string' then
    return nil, fail(E.INVALID_PARAMS, 'expected exactly one key: the shard key <ns>:{<ns>:<i>}')
  end
  local ns, ns2, i = string.match(P, '^([%w_%.%-]+):{([%w_%.%-]+):(%d+)}$')
  if not ns or ns ~= ns2 or #ns > 64 or int_arg(i, 0, 16383) == nil then
    return nil, fail(E.INVALID_PARAMS, 'bad shard key (expected <ns>:{<ns>:<i>}): ' .. P)
  end
  local wanted = { 'shards' }
  for _, name in ipairs(names) do wanted[#wanted + 1] = name end
  local cfg, err = config(P, wanted)
  if not cfg then return nil, err end
  if tonumber(i) >= cfg.shards then
    return nil, fail(E.INVALID_PARAMS, 'shard ' .. i .. ' is beyond the store\'s ' .. S(cfg.shards) .. ' shards')
  end
  return P, cfg
end

-- Register a function of one shard: fn(P, args, cfg) runs only after open_shard passed.
-- `names` are the config fields it reads; flags e.g. { 'no-writes' }.
local function register(name, names, fn, flags)
  redis.register_function { function_name = name, flags = flags, callback = function(keys, args)
    local P, cfg = open_shard(keys, names)
    if not P then return cfg end
    return fn(P, args, cfg)
  end }
end
