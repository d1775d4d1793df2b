-- Read-only functions: no lease is granted, nothing is written.

-- describe. KEYS: P. ARGV: tenant, key.
-- Reply: -704, or {fields (flat HGETALL), effective lease_until, {live segment...}}.
local function describe(P, args)
  local tenant, key = args[1], args[2]
  if not valid_tenant(tenant) then return fail(E.INVALID_PARAMS, 'tenant_id must match [A-Za-z0-9_.-]{1,64}') end
  if type(key) ~= 'string' then return fail(E.INVALID_PARAMS, 'expected tenant, key') end
  local okey = obj_key(P, tenant, key)
  local o = load_object(okey)
  if not o then return E.OBJECT_NOT_FOUND end
  local live = {}
  for _, r in ipairs(replicas_of(P, o)) do
    if r.live then live[#live + 1] = r.seg end
  end
  return { redis.call('HGETALL', okey), lease_until(P, tenant, o), live }
end

-- now. KEYS: P. Reply: the store clock in ms.
local function now(P) return now_ms(P) end

-- version. KEYS: none. Reply: the library version (a hash of its source).
local function version() return LIBRARY_VERSION end

register('mc_describe', {}, describe, { 'no-writes' })
register('mc_now', {}, now, { 'no-writes' })
redis.register_function { function_name = 'mc_version', callback = version, flags = { 'no-writes' } }
