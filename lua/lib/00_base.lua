-- Shared basics: error codes, number formatting, argument parsing, clock, config.
-- Every function receives KEYS[1] = the shard key P ("<ns>:{<ns>:<shard>}"); all other
-- keys of the call are P .. ":<suffix>" and so live in the same hash slot.

-- The key schema: every key of shard P is P followed by one of these suffixes (docs/keys.md's key
-- schema table; mooncake_redis/keys.py holds the same table and a test checks that they agree).
local K = {
  config = ':config', mount_seq = ':mount_seq',
  segment = ':seg:', segments = ':segs', free = ':free:', free_by_off = ':by_off', free_by_size = ':by_size',
  segments_draining = ':segs_draining', -- graceful unmounts (lua/ops/segments.lua)
  host_segments = ':hsegs:', -- a host's segments (lua/ops/segments.lua), for put_start's prefer_same_host
  repl_due = ':repl_due', -- replications in flight (lua/lib/47_replication.lua)
  -- Mooncake's task queue (lua/ops/task_queue.lua)
  task = ':task:', task_queue = ':taskq:', tasks_due = ':tasks_due', tasks_done = ':tasks_done',
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
  radix_outbox = ':routbox',
  -- SSD offload (lua/lib/27_disk.lua, 45_offload.lua): local disk segments, queues, tasks in flight,
  -- files to remove
  disk = ':disk:', disks = ':disks', offload_queue = ':offq:', offload_overflow = ':offover:',
  offload_inflight = ':offload_inflight', disk_removals = ':diskrm:',
  offload_evict = ':offload_evict', -- objects eviction queued for offload (offload_on_evict)
  -- the Mooncake wire gateway (lua/ops/gateway.lua): segment facts, the transfer engine's
  -- metadata, the gateways serving
  gw_segment = ':gwseg:', gw_segment_ids = ':gwsegids', gw_segments = ':gwsegs', gw_metadata = ':gwmeta',
  gateways = ':gateways', gateway = ':gateway:',
  -- KV events (lua/lib/28_events.lua): the shard's stream
  events = ':events',
}

local E = {
  OK = 0, INTERNAL_ERROR = -1,
  SEGMENT_NOT_FOUND = -101, SEGMENT_ALREADY_EXISTS = -102,
  NO_AVAILABLE_HANDLE = -200,
  INVALID_PARAMS = -600, ILLEGAL_CLIENT = -601,
  REPLICA_IS_NOT_READY = -703, OBJECT_NOT_FOUND = -704,
  OBJECT_ALREADY_EXISTS = -705, OBJECT_HAS_LEASE = -706,
  INVALID_WRITE = -700, OBJECT_HAS_REPLICATION_TASK = -708, OBJECT_NO_REPLICATION_TASK = -709,
  REPLICA_NOT_FOUND = -710, REPLICA_IS_GONE = -712, UNAVAILABLE_IN_CURRENT_STATUS = -1010,
  TASK_NOT_FOUND = -1400, TASK_PENDING_LIMIT_EXCEEDED = -1401,
  GUARANTEED_CAPACITY_EXCEEDED = -10002, RETENTION_LIMIT_EXCEEDED = -10003, HOST_SEGMENTS_EXCEEDED = -10004,
  RADIX_LINK_PENDING = -10010,
}
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

-- Standard functions are bound to locals at the first call: nothing but redis is readable
-- while the library loads, and a global read at run time goes through the sandbox's table and
-- its metatable (about 270 instructions, the call's own work aside). A module hands its binder
-- to on_first_call while it loads; register runs them all once, before the first call's work.
local BINDERS = {}
local function on_first_call(bind) BINDERS[#BINDERS + 1] = bind end
local format_, tonumber_, tostring_, match_, sub_, floor_, huge_
on_first_call(function()
  format_, tonumber_, tostring_, match_, sub_, floor_, huge_ = string.format, tonumber, tostring, string.match, string.sub, math.floor, math.huge
end)

-- Integers are doubles in Lua 5.1; '%.0f' prints them exactly up to 2^53 (tostring would not).
-- Zero is always "0": a negated zero would print "-0", which Redis 7 refuses as an integer.
-- An exact integer goes through '%d' (a C long: exact, and a negated zero prints "0"), which
-- costs about 40% of '%.0f'.
-- A format is a sprintf and a new string (about 2k instructions), and the same numbers come
-- again and again (object sizes and their negations, offsets, counts): the spellings of numbers
-- below 2^40 are remembered, bounded (dropped whole at S_MEMO_MAX). Clock readings (ms, above
-- 2^40 since 2004) are rarely spelt twice and are not. (Nor is a NaN: it cannot be a key.)
local S_MEMO, s_memo_n, S_MEMO_MAX, S_MEMO_BELOW = {}, 0, 256, 1099511627776
local function S(n)
  local s = S_MEMO[n]
  if s then return s end
  if n % 1 == 0 and n > -9007199254740992 and n < 9007199254740992 then
    s = format_('%d', n)
  elseif n == 0 then
    s = '0'
  else
    s = format_('%.0f', n)
  end
  if n < S_MEMO_BELOW and n > -S_MEMO_BELOW then
    if s_memo_n >= S_MEMO_MAX then S_MEMO, s_memo_n = {}, 0 end
    S_MEMO[n], s_memo_n = s, s_memo_n + 1
  end
  return s
end

local MAX_INT = 9007199254740991 -- 2^53 - 1

-- The number a canonical spelling of 0..255 stands for, else nil: a table lookup where head
-- counts and small options would cost a pattern and a conversion. Filled at the first call (not
-- while the library loads).
local SMALL_INTS
local function small_int(s)
  if not SMALL_INTS then
    SMALL_INTS = {}
    for i = 0, 255 do SMALL_INTS[tostring_(i)] = i end
  end
  return SMALL_INTS[s]
end

-- Parse a decimal integer argument within [lo, hi]; nil unless it is in canonical form (no sign
-- on zero, no leading zeros, no '+'): "-0" or "007" would otherwise pass a range check and then
-- be stored or matched in a different spelling than the one the functions write.
local function int_arg(s, lo, hi)
  local n = small_int(s)
  if not n then
    if type(s) ~= 'string' or #s > 17 then return nil end
    if s ~= '0' and not match_(s, '^%-?[1-9]%d*$') then return nil end
    n = tonumber_(s)
  end
  if n < lo or n > hi then return nil end
  return n
end

-- What the running call read with its configuration (open_shard, see config below): its shard,
-- the test clock's value there (false: not frozen), the mount epoch and, for the functions that
-- list it, the held-extent bound (held_due below; nil: not read), and the eviction's note of the
-- unit it placed last (`placed`, `noting`: lua/lib/30_units.lua), and the seq its same-shard
-- radix links share (`link_seq`: lua/lib/32_radix.lua), and what a batch leaves to its end
-- (`ledger`: lua/lib/05_ledger.lua). Reset at the start of every call (register), so nothing
-- read in one call is taken for another's.
local CALL = { shard = nil, clock = false, mounts = false, held_due = nil, now = nil, events = nil,
  placed = nil, noting = nil, link_seq = nil, ledger = nil }

-- TIME in ms, converting its reply with as few strtod calls as it can: the seconds of its last
-- reply are kept (one string for a second of calls) and the milliseconds (the microseconds but
-- their last three digits, canonical decimals) are looked up as the strings they are (at most
-- 999 of them). The same number as t[1] * 1000 + floor_(t[2] / 1000).
local last_sec, last_sec_ms, MS_OF = nil, 0, nil
local function time_ms()
  local t = redis.call('TIME')
  local sec, us = t[1], t[2]
  if sec ~= last_sec then last_sec, last_sec_ms = sec, tonumber_(sec) * 1000 end
  local n = #us
  if n <= 3 then return last_sec_ms end
  if not MS_OF then MS_OF = {} end
  local digits = sub_(us, 1, n - 3)
  local ms = MS_OF[digits]
  if not ms then ms = tonumber_(digits); MS_OF[digits] = ms end
  return last_sec_ms + ms
end

-- The store clock: the test hook (the `clock` field of P:config, absolute ms) when set, else the
-- server's TIME. Read once a call: every step of a call sees the same instant.
local function now_ms(P)
  if P == CALL.shard then
    if CALL.now then return CALL.now end
    if CALL.clock then CALL.now = tonumber_(CALL.clock); return CALL.now end
  else
    local frozen = redis.call('HGET', P .. K.config, 'clock')
    if frozen then return tonumber_(frozen) end
  end
  local now = time_ms()
  if P == CALL.shard then CALL.now = now end
  return now
end

-- Segments' mount ids, remembered between calls while the shard's mount epoch (the `mounts`
-- field of P:config, a token no two states of the shard's mounts share, not even across a
-- FLUSHALL) is the one they were read under: mount_segment and drop_segment change the epoch
-- (new_mount_epoch), and the epoch is read with the configuration, so a remembered mount id is
-- always the current one. The reads keep the replica tails they have seen there too (live_tail in
-- lua/ops/get_replica_list.lua). Bounded: dropped whole at MOUNTS_MAX entries of either kind.
local MOUNTS, MOUNTS_MAX = {}, 4096

-- The running call's mount-id table for shard P (segment -> mount id, false: not mounted), or
-- nil when the shard has no epoch yet (a store last written before epochs: nothing is kept).
local function mount_table(P)
  if P ~= CALL.shard or not CALL.mounts then return nil end
  local m = MOUNTS[P]
  if not m or m.epoch ~= CALL.mounts or m.n >= MOUNTS_MAX then
    m = { epoch = CALL.mounts, n = 0, seg = {} }
    MOUNTS[P] = m
  end
  return m
end

-- A segment of shard P was mounted or dropped: a new epoch, so that no call trusts a mount id
-- remembered before.
local function new_mount_epoch(P)
  local t = redis.call('TIME')
  local token = t[1] .. '.' .. t[2] .. '.' .. redis.call('INCR', P .. K.mount_seq)
  redis.call('HSET', P .. K.config, 'mounts', token)
  MOUNTS[P] = nil
  if P == CALL.shard then CALL.mounts = token end
end

-- P:config fields the functions read, with their ranges: {lo, hi}, {lo, hi, 'ratio'} for a
-- finite real number, or {'choice', name...} for one of those names (kept as the string).
-- Python writes them (MasterConfig); a value out of range here means the
-- hash was edited by hand or by another program, and every function refuses to run on it.
-- mooncake_redis/config.py accepts the same ranges (a test checks that they agree).
local MAX_TTL = 1000000000000000 -- 10^15 ms: now + MAX_TTL stays far below 2^53
local CONFIG_RANGES = {
  shards = { 1, 16384 },
  default_kv_lease_ttl = { 0, MAX_TTL }, -- 0: reads grant no lease
  kv_lease_slack = { 0, MAX_TTL },
  default_kv_soft_pin_ttl = { 1, MAX_TTL },
  max_kv_soft_pin_ttl = { 1, MAX_TTL },
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
  allow_evict_retained_groups = { 0, 1 },
  max_retained_groups = { 0, MAX_INT },
  max_retained_groups_per_tenant = { 0, MAX_INT },
  max_group_retention = { 0, MAX_TTL },
  enable_radix_tree = { 0, 1 },
  offload_on_put = { 0, 1 },
  offload_on_evict = { 0, 1 },
  offload_queue_limit = { 0, MAX_INT },
  offload_task_timeout = { 1, MAX_TTL },
  offload_max_attempts = { 1, 1000 },
  disk_removal_queue_limit = { 0, MAX_INT },
  kv_events_maxlen = { 0, 100000000 },
  allocation_strategy = { 'choice', 'most_free', 'random', 'free_ratio_first' }, -- lua/ops/put_start.lua
}

-- Fields added after stores were first written: one missing from P:config (a store last
-- configured by an earlier package) reads as this value until Master.connect writes it.
local CONFIG_DEFAULTS = { allocation_strategy = 'most_free' }

local function choice_value(range, raw)
  for i = 2, #range do
    if range[i] == raw then return raw end
  end
  return nil
end

local function config_value(name, raw)
  local range = CONFIG_RANGES[name]
  if range[1] == 'choice' then return choice_value(range, raw) end
  local v = tonumber_(raw)
  if not v or v ~= v or v < range[1] or v > range[2] then return nil end -- v ~= v: nan
  if range[3] ~= 'ratio' and floor_(v) ~= v then return nil end
  return v
end

-- The last config each `names` list parsed, with the raw values it came from: a parse checks
-- every range and builds a table, and the hash changes only when Master.connect rewrites it.
-- Keyed by the list (register's, one per function), so it holds one entry per function.
local CONFIG_MEMO = {}

-- Read and check config fields from P:config; `names` ends with 'clock' and 'mounts' (register
-- adds them) and, when names.held_due, 'held_due': these are read for the call (CALL) and are
-- not configuration. Returns the table (shared: callers only read it), or nil and an error reply.
local CONFIG_KEY = {} -- P -> P .. K.config, for the shard keys SHARD_OF holds (reset with it)
local unpack_ = nil    -- unpack, bound at the first call (no global but redis while loading)
local function config(P, names)
  local key = CONFIG_KEY[P]
  if not key then key = P .. K.config; CONFIG_KEY[P] = key end
  if not unpack_ then unpack_ = unpack end
  local values = redis.call('HMGET', key, unpack_(names))
  local n = #names - (names.held_due and 3 or 2)
  CALL.shard, CALL.clock, CALL.mounts = P, values[n + 1], values[n + 2]
  if names.held_due then CALL.held_due = values[n + 3] end
  local memo = CONFIG_MEMO[names]
  if memo then
    local same = true
    for i = 1, n do
      if values[i] ~= memo.raw[i] then same = false; break end
    end
    if same then return memo.cfg end
  end
  local cfg = {}
  for i = 1, n do
    local name = names[i]
    local raw = values[i] or CONFIG_DEFAULTS[name]
    if not raw then return nil, fail(E.INTERNAL_ERROR,
      'store not initialised (' .. P .. ':config has no ' .. name .. '): connect once with Master.connect or mooncake-redis serve') end
    cfg[name] = config_value(name, raw)
    if not cfg[name] then return nil, fail(E.INTERNAL_ERROR,
      'bad configuration: ' .. P .. ':config ' .. name .. ' = ' .. raw .. '; rewrite it with Master.connect(url, MasterConfig(...))') end
  end
  CONFIG_MEMO[names] = { raw = values, cfg = cfg }
  return cfg
end

-- This shard's exact share of a store-wide limit: limit / shards rounded down, plus one for the
-- first (limit mod shards) shards, so that the shares add up to the limit.
local function shard_share(P, limit, shards)
  local i = tonumber_(match_(P, ':(%d+)}$'))
  return floor_(limit / shards) + ((i < limit % shards) and 1 or 0)
end

local function valid_tenant(t)
  return type(t) == 'string' and #t >= 1 and #t <= 64 and match_(t, '^[%w_%.%-]+$') ~= nil
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
-- parse_call returns { opts = {name = value or {values} for 'list'}, fields = {names in order},
-- stride, first (ARGV index of the first row), rows (count) }, or nil and the reason.
local function parse_head(args, spec)
  local n = int_arg(args[1], 0, 128)
  if not n or #args < 1 + 2 * n then return nil, 'expected n_opts, then that many option name, value pairs' end
  local opts = {}
  for i = 2, 2 * n, 2 do
    local name, value = args[i], args[i + 1]
    local kind = spec.opts[name]
    if not kind then return nil, 'unknown option ' .. tostring_(name) end
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
    call.first = #args + 1
    return call
  end
  local at = 2 + 2 * n
  local nf = int_arg(args[at], 1, 8)
  if not nf then return nil, 'expected n_fields (1-8) after the options' end
  local fields, seen = {}, {}
  for i = 1, nf do
    local f = args[at + i]
    if not spec.fields[f] or seen[f] then return nil, 'unknown or repeated field ' .. tostring_(f) end
    seen[f], fields[i] = true, f
  end
  for name, kind in pairs(spec.fields) do
    if kind == 'required' and not seen[name] then return nil, 'missing field ' .. name end
  end
  call.fields, call.stride, call.first = fields, nf, at + nf + 1
  return call
end

-- Where a call's head (options and field names) ends, read before parsing it: the cache key.
-- Only canonical counts are looked up (small_int); anything else ("01", "1.0") goes to the full
-- parse, which refuses it.
local function head_length(args, spec)
  local n = small_int(args[1])
  if not n or n > 128 then return nil end
  if not spec.fields then return #args end
  local nf = small_int(args[2 + 2 * n])
  if not nf or nf < 1 or nf > 8 then return nil end
  return 2 + 2 * n + nf
end

-- Parsed heads, memoised per spec in a tree keyed by the head's arguments in order (lookups
-- allocate nothing). Most calls repeat a few heads with other rows, and a parse is a pure
-- function of the spec and the head, so a cached one is exact. Only the row count is set per
-- call; otherwise callers only keep on it what is itself a pure function of the head (and of
-- the memoised config: put_start's put_args). Bounded: dropped whole at HEAD_CACHE_MAX nodes.
local HEAD_CACHE, head_cache_nodes, HEAD_CACHE_MAX = {}, 0, 4096
local PARSED = {} -- the slot of a node's parsed call (a table: no argument string can equal it)

local function cached_head(args, spec, last)
  local node = HEAD_CACHE[spec]
  for i = 1, last do
    if not node then return nil end
    node = node[args[i]]
  end
  return node and node[PARSED]
end

local function cache_head(args, spec, last, call)
  if head_cache_nodes + last + 1 > HEAD_CACHE_MAX then HEAD_CACHE, head_cache_nodes = {}, 0 end
  local node = HEAD_CACHE[spec]
  if not node then node = {}; HEAD_CACHE[spec] = node; head_cache_nodes = head_cache_nodes + 1 end
  for i = 1, last do
    local child = node[args[i]]
    if not child then child = {}; node[args[i]] = child; head_cache_nodes = head_cache_nodes + 1 end
    node = child
  end
  node[PARSED] = call
end

local function parse_call(args, spec)
  -- a memoised head first: head_length and cached_head, inlined (this runs in every call)
  local call, node = nil, HEAD_CACHE[spec]
  local n = node and SMALL_INTS[args[1]]
  if n and n <= 128 then
    local last
    if not spec.fields then
      last = #args
    else
      local nf = SMALL_INTS[args[2 + 2 * n]]
      if nf and nf >= 1 and nf <= 8 then last = 2 + 2 * n + nf end
    end
    if last then
      for i = 1, last do
        node = node[args[i]]
        if not node then break end
      end
      call = node and node[PARSED]
    end
  end
  if not call then
    local last = head_length(args, spec)
    call = last and cached_head(args, spec, last)
  end
  if not call then
    local err
    call, err = parse_head(args, spec)
    if not call then return nil, err end
    cache_head(args, spec, call.first - 1, call)
  end
  if not spec.fields then return call end
  local values = #args - call.first + 1
  if values < 0 or values % call.stride ~= 0 then return nil, 'each row must have ' .. call.stride .. ' values' end
  if values / call.stride > spec.max_rows then return nil, 'at most ' .. spec.max_rows .. ' keys per call' end
  call.rows = values / call.stride
  return call
end

-- Row r (1-based) of a parsed call, as { field = value }.
local function row_of(args, call, r)
  local t, at = {}, call.first + (r - 1) * call.stride
  for i, f in ipairs(call.fields) do t[f] = args[at + i - 1] end
  return t
end

-- Shard keys already seen well-formed, with their shard number (a pure function of the key,
-- memoised: the pattern match allocates three strings a call). Bounded like HEAD_CACHE.
local SHARD_OF, shard_keys_seen = {}, 0

local function shard_number(P)
  local i = SHARD_OF[P]
  if i then return i end
  local ns, ns2, digits = match_(P, '^([%w_%.%-]+):{([%w_%.%-]+):(%d+)}$')
  if not ns or ns ~= ns2 or #ns > 64 then return nil end
  i = int_arg(digits, 0, 16383)
  if not i then return nil end
  if shard_keys_seen >= HEAD_CACHE_MAX then SHARD_OF, CONFIG_KEY, shard_keys_seen = {}, {}, 0 end
  SHARD_OF[P], shard_keys_seen = i, shard_keys_seen + 1
  return i
end

-- The one entry check of every function that takes a shard: exactly one key, a well-formed
-- shard key "<ns>:{<ns>:<i>}" of an initialised store with i below its shard count, and a
-- valid configuration. Runs before anything is written, so a call under a made-up key plants
-- nothing. Returns P and the config fields `wanted` ({ 'shards', fields the function reads... }),
-- or nil and an error reply.
local function open_shard(keys, wanted)
  local P = keys[1]
  if #keys ~= 1 or type(P) ~= 'string' then
    return nil, fail(E.INVALID_PARAMS, 'expected exactly one key: the shard key <ns>:{<ns>:<i>}')
  end
  local i = shard_number(P)
  if not i then return nil, fail(E.INVALID_PARAMS, 'bad shard key (expected <ns>:{<ns>:<i>}): ' .. P) end
  local cfg, err = config(P, wanted)
  if not cfg then return nil, err end
  if i >= cfg.shards then
    return nil, fail(E.INVALID_PARAMS, 'shard ' .. S(i) .. ' is beyond the store\'s ' .. S(cfg.shards) .. ' shards')
  end
  return P, cfg
end

-- The flags of a function whose writes only free memory (removal, eviction, unmount, sweeps,
-- expiry, the worker's claim) or rewrite values already there (the leases of reads, pings):
-- Redis runs it even at maxmemory (noeviction), so a full store still serves reads and can
-- free itself while it refuses puts.
local FREES = { 'allow-oom' }

-- The KV event stream's bound for the running call (0: no events; lua/lib/28_events.lua): read
-- with its configuration by the functions whose changes are mostly events (they list
-- kv_events_maxlen), else once, when a call first has an event to write (a field a store of an
-- earlier package lacks until Master.connect adds it: off).
local function events_maxlen(P)
  if CALL.events == nil then
    CALL.events = config_value('kv_events_maxlen', redis.call('HGET', P .. K.config, 'kv_events_maxlen') or '0') or 0
  end
  return CALL.events
end

-- The held-extent bound of P:config (field held_due, kept by lua/lib/10_alloc.lua): no entry of
-- P:held is due before it ('none': P:held is empty). As read with the running call's
-- configuration: a number, math.huge for 'none', or nil when unknown (absent, not read by this
-- function, or another shard), which makes the next sweep look.
local function held_due(P)
  local v = P == CALL.shard and CALL.held_due
  if not v then return nil end
  if v == 'none' then return huge_ end
  return tonumber_(v)
end

-- Write the bound (a number or 'none') for shard P, for this call too when it is its shard.
local function set_held_due(P, v)
  v = v == 'none' and v or S(v)
  redis.call('HSET', P .. K.config, 'held_due', v)
  if P == CALL.shard and CALL.held_due ~= nil then CALL.held_due = v end
end

-- Register a function of one shard: fn(P, args, cfg) runs only after open_shard passed.
-- `names` are the config fields it reads, and 'held_due' when it sweeps P:held (held_due above);
-- flags e.g. { 'no-writes' }.
local function register(name, names, fn, flags)
  local wanted = nil -- { 'shards', names..., 'clock', 'mounts' [, 'held_due'] }, built at the first call (not while loading)
  redis.register_function { function_name = name, flags = flags, callback = function(keys, args)
    if BINDERS then
      for i = 1, #BINDERS do BINDERS[i]() end
      BINDERS = nil
    end
    CALL.shard, CALL.now, CALL.events, CALL.held_due, CALL.placed, CALL.noting, CALL.link_seq, CALL.ledger =
      nil, nil, nil, nil, nil, nil, nil, nil
    CALL.fresh_nodes, CALL.legacy_members = nil, nil
    if not wanted then
      wanted = { 'shards' }
      for _, field in ipairs(names) do
        if field == 'held_due' then wanted.held_due = true else wanted[#wanted + 1] = field end
      end
      wanted[#wanted + 1] = 'clock'
      wanted[#wanted + 1] = 'mounts'
      if wanted.held_due then wanted[#wanted + 1] = 'held_due' end
    end
    local P, cfg = open_shard(keys, wanted)
    if not P then return cfg end
    CALL.events = cfg.kv_events_maxlen -- nil unless the function lists it
    return fn(P, args, cfg)
  end }
end

return {
  K = K, E = E, fail = fail, S = S, MAX_INT = MAX_INT, int_arg = int_arg, now_ms = now_ms, mount_table = mount_table,
  new_mount_epoch = new_mount_epoch,
  config_value = config_value, shard_share = shard_share, valid_tenant = valid_tenant,
  valid_name = valid_name, HEAD_CACHE_MAX = HEAD_CACHE_MAX, parse_call = parse_call,
  row_of = row_of, register = register, FREES = FREES, events_maxlen = events_maxlen, shard_number = shard_number,
  on_first_call = on_first_call, held_due = held_due, set_held_due = set_held_due, CALL = CALL,
}
