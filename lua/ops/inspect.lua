-- Read-only functions: no lease is granted, nothing is written.

local E, fail, S, now_ms, register = Base.E, Base.fail, Base.S, Base.now_ms, Base.register
local obj_key, object_call, load_object, put_started = Object.obj_key, Object.object_call, Object.load_object,
  Object.put_started
local replicas_of, lease_of, needs_read_mark = Object.replicas_of, Units.lease_of, Object.needs_read_mark
local DEADLINES, DEADLINE_KINDS, INDEXES = Units.DEADLINES, Units.DEADLINE_KINDS, Units.INDEXES
local unit_state, in_memo = Units.unit_state, Units.in_memo
local retention_state = Retention.retention_state

-- describe. KEYS: P. ARGV: options tenant, key (required).
-- Reply: -704, or {fields (flat HGETALL; `node`: the node's hash itself), effective lease_until,
-- {live segment...}, now, put started (ms; '' for a complete object)}.
local DESCRIBE_SPEC = { opts = { tenant = 'optional', key = 'required' } }

local function describe(P, args)
  local call, err = object_call(args, DESCRIBE_SPEC)
  if not call then return err end
  local tenant, key = call.tenant, call.opts.key
  local okey = obj_key(P, tenant, key)
  local o = load_object(okey)
  if not o then return E.OBJECT_NOT_FOUND end
  local live = {}
  for _, r in ipairs(replicas_of(P, o)) do
    if r.live then live[#live + 1] = r.seg end
  end
  local started = o.status ~= 'complete' and put_started(P, tenant, key, o, nil)
  local flat = redis.call('HGETALL', okey)
  for i = 1, #flat, 2 do
    if flat[i] == 'node' then flat[i + 1] = o.node end -- the hash itself (its field says where it is)
  end
  return { flat, lease_of(P, tenant, key, o), live, now_ms(P), started and S(started) or '' }
end

-- unit_state. KEYS: P. ARGV: unit ("o:<tenant>:<key>" | "g:<tenant>:<group>").
-- What the unit's index entries should be under the evictability rule at the store clock, and
-- what they are: {why, {index, score, ...} expected, {index, score, ...} actual, {deadline index...},
-- sweep_due} where why is "" (evictable), a protection ("processing", "hard_pin", "task_ref",
-- "guaranteed", "no_members"), "draining", "grouped" (an object whose group is the unit) or "missing"; an
-- index is a key suffix (":evict:soft"); an expected score "" means any; sweep_due is 1 while a
-- guarantee of the unit ran out and the sweep has not ended it (its entries lag until then),
-- then mark_missing: 1 for an object that needs the read mark and lacks it (20_object.lua), then
-- memo_missed: 1 for a composite unit with an entry in an index its memo (`at`) does not list.
-- fsck compares the two.
local function unit_state_reply(P, args)
  local unit = args[1]
  if type(unit) ~= 'string' then return fail(E.INVALID_PARAMS, 'expected unit') end
  local now = now_ms(P)
  local why, entries, sweep_due, memo = unit_state(P, unit, now)
  local expected, actual, deadlines, memo_missed = {}, {}, {}, 0
  for i, index in ipairs(INDEXES) do
    local score = entries[index]
    if score ~= nil then
      expected[#expected + 1] = index
      expected[#expected + 1] = score and S(score) or ''
    end
    local have = redis.call('ZSCORE', P .. index, unit)
    if have then
      actual[#actual + 1] = index
      actual[#actual + 1] = have
      if not in_memo(memo, i) then memo_missed = 1 end
    end
  end
  for _, kind in ipairs(DEADLINE_KINDS) do deadlines[#deadlines + 1] = DEADLINES[kind] end
  retention_state(P, unit, expected, actual, deadlines)
  local tenant, key = string.match(unit, '^o:([^:]+):(.*)$')
  local o = tenant and load_object(obj_key(P, tenant, key))
  local mark_missing = o and not o.special and needs_read_mark(o) and 1 or 0
  return { why, expected, actual, deadlines, sweep_due and 1 or 0, mark_missing, memo_missed }
end

-- now. KEYS: P. Reply: the store clock in ms.
local function now(P) return now_ms(P) end

-- version. KEYS: none. Reply: {version (a hash of the source), protocol (an integer; a newer one
-- means callers of an older package must not replace this library)}.
local function version() return { LIBRARY_VERSION, LIBRARY_PROTOCOL } end

register('mc_describe', {}, describe, { 'no-writes' })
register('mc_now', {}, now, { 'no-writes' })
register('mc_unit_state', {}, unit_state_reply, { 'no-writes' })
redis.register_function { function_name = 'mc_version', callback = version, flags = { 'no-writes' } }
