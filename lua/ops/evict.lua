-- evict: one bounded eviction step on one shard.
-- KEYS: P.  ARGV: max_units (1-1024).
-- Starts when used_bytes > eviction_high_watermark_ratio x capacity, or when a put_start failed
-- for space since the last step (P.put_failed), or while a group's eviction is under way
-- (P:evict:draining); frees units until used_bytes <= (eviction_high_watermark_ratio -
-- eviction_ratio) x capacity and no group is left half evicted, or max_units were spent (a
-- unit costs 1, a group 1 per member dropped). While a
-- run is unfinished P.evicting is set, so the next step carries on below the high watermark.
-- With offload_on_evict, an object without a disk copy is queued for offload instead of dropped
-- (lua/lib/45_offload.lua): the bytes waiting (P.offload_evict_bytes) count as freed in both
-- marks, and a step first ends up to max_units waits whose end passed (evicting them).
-- Reply: {state, units, objects, bytes, used_bytes, target_bytes, queued} where state is
--   "idle" (nothing to do), "target" (reached), "more" (call again), "blocked" (no evictable
--   unit), and queued counts the objects this step queued for offload instead of evicting.

local tonumber_, floor_ -- (bound at the first call: Base.on_first_call)
Base.on_first_call(function() tonumber_, floor_ = tonumber, math.floor end)
local E, fail, S, int_arg, now_ms = Base.E, Base.fail, Base.S, Base.int_arg, Base.now_ms
local register, FREES = Base.register, Base.FREES
local DRAINING, sweep_deadlines = Units.DRAINING, Units.sweep_deadlines
local next_candidate, evict_unit = Evict.next_candidate, Evict.evict_unit
local sweep_offload_evict = Offload.sweep_offload_evict
local with_ledger = Ledger.with_ledger

local function evict(P, args, cfg)
  local max_units = int_arg(args[1], 1, 1024)
  if not max_units then return fail(E.INVALID_PARAMS, 'max_units must be an integer in [1, 1024]') end
  local now = now_ms(P)
  sweep_deadlines(P, now, 4 * max_units)
  local objects, bytes = sweep_offload_evict(P, now, max_units, cfg.offload_task_timeout)
  local units = objects
  local row = redis.call('HMGET', P, 'used_bytes', 'capacity_bytes', 'put_failed', 'evicting', 'offload_evict_bytes')
  local used, cap, put_failed = tonumber_(row[1]) or 0, tonumber_(row[2]) or 0, row[3]
  local waiting = tonumber_(row[5]) or 0 -- bytes queued for offload by earlier steps: as good as freed
  local target = floor_(cap * (cfg.eviction_high_watermark_ratio - cfg.eviction_ratio))
  local draining = redis.call('ZCARD', P .. DRAINING) > 0 -- a group's eviction under way goes on
  if used - waiting <= cap * cfg.eviction_high_watermark_ratio and not put_failed and not row[4] and not draining then
    return { 'idle', units, objects, bytes, used, target, 0 }
  end
  local queued, state, budget = 0, 'more', max_units
  -- the loop tracks the used bytes itself: the shard counters are written once, after it
  with_ledger(P, function()
    while budget > 0 do
      local at_target = used - waiting <= target and (units + queued > 0 or not put_failed)
      local unit, tier = next_candidate(P, now, cfg, not draining)
      if not unit or (at_target and tier ~= DRAINING) then
        state = at_target and 'target' or 'blocked'
        return
      end
      local n, b, spent, q, drains = evict_unit(P, unit, now, budget, cfg, true)
      draining = draining or drains -- a group left half evicted goes first from now on
      budget = budget - spent
      if n > 0 then units, objects, bytes, used = units + 1, objects + n, bytes + b, used - b end
      if q then queued, waiting = queued + 1, waiting + q end
    end
  end)
  if redis.call('ZCARD', P .. DRAINING) > 0 then
    state = 'more' -- a group is half evicted: the next step goes on with it
  elseif state == 'more' and used - waiting <= target and units + queued > 0 then
    state = 'target'
  end
  if state == 'more' then
    redis.call('HSET', P, 'evicting', S(now))
  else
    redis.call('HDEL', P, 'put_failed', 'evicting')
  end
  return { state, units, objects, bytes, used, target, queued }
end

register('mc_evict', { 'eviction_high_watermark_ratio', 'eviction_ratio', 'allow_evict_soft_pinned_objects',
  'allow_evict_retained_groups', 'offload_on_evict', 'offload_queue_limit', 'offload_task_timeout',
  'kv_events_maxlen' }, evict, FREES)
