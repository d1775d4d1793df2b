-- The radix index's functions (lua/lib/32_radix.lua holds the model). All need
-- enable_radix_tree = 1 except the read-only ones, which answer from whatever index exists.
--
-- mc_radix_register. KEYS: P. ARGV: option tenant; fields node (required), parent, parent_shard
--   (the parent's shard, computed by the caller with the store's routing; both '' or absent
--   for a root). Rows: nodes of this shard. Registers each node (an empty node stays until
--   reconciliation's grace period ends) under its parent. Reply per row: 0, or INVALID_PARAMS
--   (bad hash, parent = node, parent_shard out of range, or the node already has another parent).

local K, E, fail, MAX_INT, int_arg = Base.K, Base.E, Base.fail, Base.MAX_INT, Base.int_arg
local now_ms, valid_tenant, valid_name = Base.now_ms, Base.valid_tenant, Base.valid_name
local row_of, register, FREES = Base.row_of, Base.register, Base.FREES
local MAX_KEYS_PER_CALL, keys_of, all_members = Object.MAX_KEYS_PER_CALL, Object.keys_of, Members.all_members
local object_call, per_row = Object.object_call, Object.per_row
local unit_state = Units.unit_state
local rnode_key, radix_group = Radix.rnode_key, Radix.radix_group
local radix_unit, shard_index = Radix.radix_unit, Radix.shard_index
local parse_outbox_entry, radix_settle = Radix.parse_outbox_entry, Radix.radix_settle
local radix_apply, radix_check = Radix.radix_apply, Radix.radix_check
local radix_register, radix_parent_of, children_of = Radix.radix_register, Radix.radix_parent_of, Radix.children_of

local REGISTER_SPEC = { opts = { tenant = 'optional' },
  fields = { node = 'required', parent = 'optional', parent_shard = 'optional' }, max_rows = MAX_KEYS_PER_CALL }

local function radix_off() return fail(E.INVALID_PARAMS, 'the radix index is off (MasterConfig.enable_radix_tree)') end

register('mc_radix_register', { 'enable_radix_tree' }, function(P, args, cfg)
  if cfg.enable_radix_tree ~= 1 then return radix_off() end
  local call, err = object_call(args, REGISTER_SPEC)
  if not call then return err end
  return per_row(P, args, call, function(_, tenant, row, now)
    local ph, pshard = radix_parent_of(row)
    local code, rec = radix_check(P, tenant, row.node, ph, pshard, cfg.shards)
    if code then return code end
    radix_register(P, tenant, row.node, ph, pshard, now, rec)
    return E.OK
  end)
end)

-- mc_radix_nodes (read-only). KEYS: P. ARGV: option tenant; field node. Reply per row:
--   {keys, children} (two lists; both empty for an unknown node). Cost: the node's own size.
local NODES_SPEC = { opts = { tenant = 'optional' }, fields = { node = 'required' }, max_rows = MAX_KEYS_PER_CALL }
register('mc_radix_nodes', {}, function(P, args)
  local call, err = object_call(args, NODES_SPEC)
  if not call then return err end
  local reply = {}
  for r = 1, call.rows do
    local h = row_of(args, call, r).node
    reply[r] = { keys_of(radix_group(h), all_members(P, call.tenant, radix_group(h))), children_of(P, call.tenant, h) }
  end
  return reply
end, { 'no-writes' })

-- mc_radix_describe (read-only). KEYS: P. ARGV: options tenant, node (required).
-- Reply: OBJECT_NOT_FOUND, or {parent ('' for a root), {child...}, {key...}, created,
--   link_pending ('' when none), why (unit_rule's answer for the node's unit: '' evictable,
--   'has_children', 'no_members' for a shell, ...)}.
local DESCRIBE_NODE_SPEC = { opts = { tenant = 'optional', node = 'required' } }
register('mc_radix_describe', {}, function(P, args)
  local call, err = object_call(args, DESCRIBE_NODE_SPEC)
  if not call then return err end
  local tenant, h = call.tenant, call.opts.node
  local rec = redis.call('HMGET', rnode_key(P, tenant, h), 'parent', 'created', 'link_pending')
  if not rec[2] then return E.OBJECT_NOT_FOUND end
  local why = unit_state(P, radix_unit(tenant, h), now_ms(P))
  return { rec[1] or '', children_of(P, tenant, h),
    keys_of(radix_group(h), all_members(P, tenant, radix_group(h))), rec[2], rec[3] or '',
    why }
end, { 'no-writes' })

-- mc_radix_outbox (read-only). KEYS: P. ARGV: max (1-1024). Reply: up to max outbox entries,
--   oldest first (format: lua/lib/32_radix.lua).
register('mc_radix_outbox', {}, function(P, args)
  local max = int_arg(args[1], 1, 1024)
  if not max then return fail(E.INVALID_PARAMS, 'max must be an integer in [1, 1024]') end
  return redis.call('ZRANGE', P .. K.radix_outbox, 0, max - 1)
end, { 'no-writes' })

-- mc_radix_apply. KEYS: P (the parent's shard). ARGV: outbox entries whose parent shard is P
--   (at most 1024). Applies each entry's parent half (idempotent). Reply: 1 per entry applied,
--   0 for an entry that is malformed or for another shard.
register('mc_radix_apply', {}, function(P, args)
  if #args > 1024 then return fail(E.INVALID_PARAMS, 'at most 1024 entries a call') end
  local now, me, reply = now_ms(P), shard_index(P), {}
  for i, e in ipairs(args) do
    local op, seq, pshard, tenant, ph, h = parse_outbox_entry(e)
    if op and pshard == me and valid_tenant(tenant) then
      radix_apply(P, op, seq, tenant, ph, h, now, 0)
      reply[i] = 1
    else
      reply[i] = 0
    end
  end
  return reply
end, FREES)

-- mc_radix_ack. KEYS: P (the child's shard). ARGV: outbox entries applied on their parent's
--   shard (at most 1024). Drops them from the outbox; a link's node stops waiting for it.
--   Reply: number of entries dropped.
register('mc_radix_ack', {}, function(P, args)
  if #args > 1024 then return fail(E.INVALID_PARAMS, 'at most 1024 entries a call') end
  local dropped = 0
  for _, e in ipairs(args) do
    if redis.call('ZREM', P .. K.radix_outbox, e) == 1 then
      dropped = dropped + 1
      local op, seq, _, tenant, _, h = parse_outbox_entry(e)
      if op == 'link' and valid_tenant(tenant) then
        local nkey = rnode_key(P, tenant, h)
        if tonumber(redis.call('HGET', nkey, 'link_pending')) == seq then redis.call('HDEL', nkey, 'link_pending') end
      end
    end
  end
  return dropped
end, FREES)

-- mc_radix_probe (read-only). KEYS: P (the child's shard). ARGV: tenant, child, parent.
--   Reply: {alive, seq}: alive is 1 when node child exists here with that parent; seq is this
--   shard's radix_seq now. An unlink carrying that seq (mc_radix_apply on the parent's shard)
--   removes exactly the links made before the probe, so a child re-created later survives it.
register('mc_radix_probe', {}, function(P, args)
  local tenant, h, ph = args[1], args[2], args[3]
  if not valid_tenant(tenant) or not valid_name(h, 256) or not valid_name(ph, 256) then
    return fail(E.INVALID_PARAMS, 'expected tenant, child, parent')
  end
  local alive = redis.call('HGET', rnode_key(P, tenant, h), 'parent') == ph and 1 or 0
  return { alive, tonumber(redis.call('HGET', P, 'radix_seq')) or 0 }
end, { 'no-writes' })

-- A node's id in the calls that walk the shard's nodes: "<tenant>:<hash>", the tail of its
-- record's key (the caller finds the records with SCAN MATCH P:rnode:*), so the record's key is
-- P:rnode: .. id whatever the id holds. It is split (and checked) only for a node the call acts
-- on: tenant, hash, or nil when malformed.
local function node_of_id(id)
  local tenant, h = string.match(id, '^([^:]+):(.+)$')
  if tenant and valid_tenant(tenant) and valid_name(h, 256) then return tenant, h end
end

-- The count of node ids in ARGV from index `from` (min-max of them), or nil when one has no
-- ':' past its first byte or is longer than a tenant, a ':' and a hash.
local function node_ids(args, from, min, max)
  local n = #args - from + 1
  if n < min or n > max then return nil end
  for i = from, #args do
    local id = args[i]
    if #id > 321 or not string.find(id, ':', 2, true) then return nil end
  end
  return n
end

-- mc_radix_reconcile. KEYS: P. ARGV: grace_ms, node id... (1-1024, "<tenant>:<hash>"). For each
--   node in turn (at most RECONCILE_CHECKS children looked at a call, at most RECONCILE_KIDS per
--   node): a node with neither keys nor children whose record is older than grace_ms goes (its
--   parent forgets it); children listed that are not alive here are returned. A node whose
--   record is gone is skipped. Reply: {nodes looked at (the caller passes the rest again),
--   nodes dropped, {tenant, parent, child, ...} children not alive on this shard (the caller
--   probes them on their shard, mc_radix_probe)}.
--   A store of one shard has no phantom child but by drift (a link and its child are written
--   in one call there), which fsck finds and repairs: its walk looks at no children.
local RECONCILE_KIDS = 16   -- children looked at per node and call
local RECONCILE_CHECKS = 256 -- children looked at per call: the walk stops early past it
register('mc_radix_reconcile', {}, function(P, args, cfg)
  local grace = int_arg(args[1], 0, MAX_INT)
  if not grace or not node_ids(args, 2, 1, 1024) then
    return fail(E.INVALID_PARAMS, 'expected grace_ms, node ids (1-1024, <tenant>:<hash>)')
  end
  local now = now_ms(P)
  local dropped, remote, checks, seen = 0, {}, 0, 0
  local node_prefix, kids_prefix = P .. K.radix_node, P .. K.radix_kids
  for i = 2, #args do
    if checks >= RECONCILE_CHECKS then break end
    seen = seen + 1
    local id = args[i]
    local rec = redis.call('HMGET', node_prefix .. id, 'created', 'members', 'draining', 'kid')
    local tenant, h
    if rec[1] and cfg.shards > 1 then tenant, h = node_of_id(id) end
    if tenant then
      local kids = redis.call('ZRANGE', kids_prefix .. id, 0, RECONCILE_KIDS - 1)
      if rec[4] then kids[#kids + 1] = rec[4] end -- (the child its record lists)
      for _, kid in ipairs(kids) do
        checks = checks + 1
        if redis.call('HGET', rnode_key(P, tenant, kid), 'parent') ~= h then -- not a live child here
          remote[#remote + 1] = tenant
          remote[#remote + 1] = h
          remote[#remote + 1] = kid
        end
      end
    end
    if rec[1] and not rec[2] and rec[3] ~= '1' and not rec[4] and tonumber(rec[1]) + grace <= now
      and redis.call('ZCARD', kids_prefix .. id) == 0 then
      if not tenant then tenant, h = node_of_id(id) end
      if tenant then
        radix_settle(P, tenant, h, now, 0)
        dropped = dropped + 1
      end
    end
  end
  return { seen, dropped, remote }
end)

-- mc_radix_stats (read-only). KEYS: P. ARGV: node id... (0-10000, "<tenant>:<hash>"). Counts
--   over the nodes whose records exist: {nodes, shells (no keys), leaves (no children), outbox
--   entries of the shard}.
register('mc_radix_stats', {}, function(P, args)
  if not node_ids(args, 1, 0, 10000) then
    return fail(E.INVALID_PARAMS, 'expected node ids (0-10000, <tenant>:<hash>)')
  end
  local nodes, shells, leaves = 0, 0, 0
  local node_prefix, kids_prefix = P .. K.radix_node, P .. K.radix_kids
  for _, id in ipairs(args) do
    local rec = redis.call('HMGET', node_prefix .. id, 'created', 'members', 'kid')
    if rec[1] then
      nodes = nodes + 1
      if (tonumber(rec[2]) or 0) == 0 then shells = shells + 1 end
      if not rec[3] and redis.call('EXISTS', kids_prefix .. id) == 0 then leaves = leaves + 1 end
    end
  end
  return { nodes, shells, leaves, redis.call('ZCARD', P .. K.radix_outbox) }
end, { 'no-writes' })
