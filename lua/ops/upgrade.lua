-- upgrade_objects: rewrite objects of an older layout in this library's (Master.connect runs it
-- over every object of a store whose schema_version is older; mooncake_redis/upgrade.py).
--   Layout 1 -> 4: the replica fields rep:<segment> become the one field reps; layout 2 -> 4: an
--   object that needs the read mark (special, lua/lib/20_object.lua) gets it; layout 3 -> 4: a
--   complete object's status "complete" goes (a complete object has none). An object already
--   in layout 4, or gone, is left alone. Objects of older layouts stay readable meanwhile
--   (load_object reads both replica layouts and both ways of saying complete; an object without
--   reps takes the general read).
-- KEYS: P. ARGV: object ids "<tenant>:<key>" (at most MAX_KEYS_PER_CALL).
-- Reply: the number of objects rewritten.

local K, E, fail, register = Base.K, Base.E, Base.fail, Base.register
local load_object, decode_reps, write_reps = Object.load_object, Object.decode_reps, Object.write_reps
local needs_read_mark = Object.needs_read_mark
local MAX_KEYS_PER_CALL = Object.MAX_KEYS_PER_CALL

local function upgrade_objects(P, args)
  if #args > MAX_KEYS_PER_CALL then return fail(E.INVALID_PARAMS, 'at most ' .. MAX_KEYS_PER_CALL .. ' ids a call') end
  local done = 0
  for _, id in ipairs(args) do
    local okey = P .. K.object .. id
    local o = load_object(okey)
    local changed = false
    if o and o.legacy_reps then
      write_reps(okey, o, decode_reps(o.reps) or {})
      changed = true
    elseif o and not o.special and needs_read_mark(o) then
      redis.call('HSET', okey, 'special', '1')
      changed = true
    end
    if o and o.status == 'complete' and redis.call('HDEL', okey, 'status') == 1 then changed = true end
    if changed then done = done + 1 end
  end
  return done
end

register('mc_upgrade_objects', {}, upgrade_objects)
