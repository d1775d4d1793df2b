-- evict: one bounded eviction step on one shard.
-- KEYS: P.  ARGV: max_units (1-1024).
-- Starts when used_bytes > eviction_high_watermark_ratio x capacity, or when a put_start failed
-- for space since the last step (P.put_failed), or while a group's eviction is under way
-- (P:evict:draining); frees units until used_bytes <= (eviction_high_watermark_ratio -
-- eviction_ratio) x capacity and no group is left half evicted, or max_units were spent (a
-- unit costs 1, a group 1 per member dropped). While a
-- run is unfinished P.evicting is set, so the next step carries on below the high watermark.
-- Reply: {state, units, objects, bytes, used_bytes, target_bytes} where state is
--   "idle" (nothing to do), "target" (reached), "more" (call again), "blocked" (no evictable unit).

local E, fail, S, int_arg, now_ms = Base.E, Base.fail, Base.S, Base.int_arg, Base.now_ms
local register, FREES = Base.register, Base.FREES
local DRAINING, sweep_deadlines = Units.DRAINING, Units.sweep_deadlines
local next_candidate, evict_unit = Evict.next_candidate, Evict.evict_unit

local function evict(P, args, cfg)
  local max_units = int_arg(args[1], 1, 1024)
  if not max_units then return fail(E.INVALID_PARAMS, 'max_units must be an integer in [1, 1024]') end
  local now = now_ms(P)
  sweep_deadlines(P, now, 4 * max_units)
  local row = redis.call('HMGET', P, 'used_bytes', 'capacity_bytes', 'put_failed', 'evicting')
  local used, cap, put_failed = tonumber(row[1]) or 0, tonumber(row[2]) or 0, row[3]
  local target = math.floor(cap * (cfg.eviction_high_watermark_ratio - cfg.eviction_ratio))
  local draining = redis.call('ZCARD', P .. DRAINING) > 0 -- a group's eviction under way goes on
  if used <= cap * cfg.eviction_high_watermark_ratio and not put_failed and not row[4] and not draining then
    return { 'idle', 0, 0, 0, used, target }
  end
  local units, objects, bytes, state, budget = 0, 0, 0, 'more', max_units
  while budget > 0 do
    local at_target = used <= target and (units > 0 or not put_failed)
    local unit, tier = next_candidate(P, now, cfg, not draining)
    if not unit or (at_target and tier ~= DRAINING) then
      state = at_target and 'target' or 'blocked'
      break
    end
    draining = draining or string.byte(unit, 1) ~= 111 -- a group ('g:', 'r:', not 'o:') may start to drain
    local n, b, spent = evict_unit(P, unit, now, budget, cfg)
    budget = budget - spent
    if n > 0 then units, objects, bytes, used = units + 1, objects + n, bytes + b, used - b end
  end
  if redis.call('ZCARD', P .. DRAINING) > 0 then
    state = 'more' -- a group is half evicted: the next step goes on with it
  elseif state == 'more' and used <= target and units > 0 then
    state = 'target'
  end
  if state == 'more' then
    redis.call('HSET', P, 'evicting', S(now))
  else
    redis.call('HDEL', P, 'put_failed', 'evicting')
  end
  return { state, units, objects, bytes, used, target }
end

register('mc_evict', { 'eviction_high_watermark_ratio', 'eviction_ratio', 'allow_evict_soft_pinned_objects',
  'allow_evict_retained_groups', 'kv_events_maxlen' }, evict, FREES)
