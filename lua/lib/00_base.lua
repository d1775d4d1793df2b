-- Shared basics: error codes, number formatting, argument parsing, clock, config.
-- Every function receives KEYS[1] = the shard key P ("<ns>:{<ns>:<shard>}"); all other
-- keys of the call are P .. ":<suffix>" and so live in the same hash slot.

local E = {
  OK = 0, INTERNAL_ERROR = -1,
  SEGMENT_NOT_FOUND = -101, SEGMENT_ALREADY_EXISTS = -102,
  NO_AVAILABLE_HANDLE = -200,
  INVALID_PARAMS = -600, ILLEGAL_CLIENT = -601,
  REPLICA_IS_NOT_READY = -703, OBJECT_NOT_FOUND = -704,
  OBJECT_ALREADY_EXISTS = -705, OBJECT_HAS_LEASE = -706,
  INVALID_WRITE = -700, OBJECT_HAS_REPLICATION_TASK = -708,
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

-- Integers are doubles in Lua 5.1; '%.0f' prints them exactly up to 2^53 (tostring would not).
local function S(n) return string.format('%.0f', n) end

local MAX_INT = 9007199254740991 -- 2^53 - 1

-- Parse a decimal integer argument within [lo, hi]; nil when it is not one.
local function int_arg(s, lo, hi)
  if type(s) ~= 'string' or #s > 17 or not string.match(s, '^%-?%d+$') then return nil end
  local n = tonumber(s)
  if n < lo or n > hi then return nil end
  return n
end

-- The store clock: the test hook P:clock (absolute ms) when set, else the server's TIME.
local function now_ms(P)
  local frozen = redis.call('GET', P .. ':clock')
  if frozen then return tonumber(frozen) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Read config fields (numbers) from P:config; nil when the shard was never initialised.
local function config(P, names)
  local values = redis.call('HMGET', P .. ':config', unpack(names))
  local cfg = {}
  for i, name in ipairs(names) do
    if not values[i] then return nil end
    cfg[name] = tonumber(values[i])
  end
  return cfg
end

local function not_initialised()
  return fail(E.INTERNAL_ERROR, 'store not initialised: connect once with Master.connect or mooncake-redis serve')
end

local function valid_tenant(t)
  return type(t) == 'string' and #t >= 1 and #t <= 64 and string.match(t, '^[%w_%.%-]+$') ~= nil
end

local function valid_name(s, max_len)
  return type(s) == 'string' and #s >= 1 and #s <= max_len
end
