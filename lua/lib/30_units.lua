-- Eviction units, and the one rule that decides where a unit belongs. A unit is an ungrouped
-- object ("o:<tenant>:<key>") or a composite unit, a whole group ("g:<tenant>:<group>").
--
-- Indexes (all per shard, all zsets, all derived from the records by unit_rule below):
--   tiers, in eviction order, scored by lease_until (every leased unit sits above every
--   unleased one, so a step pops from the low end and never walks over a leased unit):
--     P:evict:ordinary   evicted first
--     P:evict:soft       an active soft pin; evicted only when allow_evict_soft_pinned_objects
--   deadline indexes, one per kind of deadline, unit -> ms at which the unit's state changes by
--   itself; sweep_deadlines re-derives the units whose deadline is due:
--     P:deadline:soft_pin
--   P:evict:draining     groups being evicted over several steps (unit -> ms the drain began)
-- A unit is in no tier while protected: put in progress, hard-pinned, referenced by a task,
-- queued for offload by eviction (offload_on_evict: the field offload_evict, 45_offload.lua),
-- guaranteed (until guaranteed_until: 25_guarantee.lua; the expiry sweep re-places the unit), a
-- group without members; a group while any member is so. New protections, tiers and deadline
-- kinds are one entry in TIERS / DEADLINES and one line in unit_rule.
--
-- A key with a group id under the radix index is its node's, not its group's (see below).
-- Composite units keep counters of their members' protections (members, processing,
-- hard_pinned, task_refs in P:grp:<tenant>:<group>) and, for each kind of member deadline
-- (AGG_KINDS: soft_pin, guarantee), a zset of the members' values (P:agg:<kind>:<unit>, member key
-- -> ms), so that the unit's deadline is the latest member's and drops back when that member
-- leaves or its deadline is taken back. The group's lease_until is shared
-- by all members; draining is 1 while the group is being evicted.
-- A group is evicted over several steps so that no call grows with its size: the step that picks
-- it marks it draining and moves its unit to P:evict:draining; each later step drops up to its
-- budget of members. A draining group's members are gone for readers (OBJECT_NOT_FOUND), take
-- no task references, and the group takes no new members (NO_AVAILABLE_HANDLE) until the last
-- member is dropped and the group retires.

local K, S, now_ms, valid_tenant, CALL = Base.K, Base.S, Base.now_ms, Base.valid_tenant, Base.CALL
local tonumber_, find_, sub_, match_ -- (bound at the first call: Base.on_first_call)
Base.on_first_call(function() tonumber_, find_, sub_, match_ = tonumber, string.find, string.sub, string.match end)
local free_extent, hold_extent, count_objects = Alloc.free_extent, Alloc.hold_extent, Ledger.count_objects
local defer_zadd = Ledger.defer_zadd
local obj_key, obj_id, RADIX_MARK = Object.obj_key, Object.obj_id, Object.RADIX_MARK
local radix_hash, grp_key = Object.radix_hash, Object.grp_key
local grp_members_key, load_object, member_of = Object.grp_members_key, Object.load_object, Object.member_of
local add_member, remove_members = Members.add_member, Members.remove_members
local replicas_of = Object.replicas_of
local forget_guarantee = Guarantee.forget_guarantee
local is_disk_only, drop_disk_replicas = Disk.is_disk_only, Disk.drop_disk_replicas
local forget_offload_task = Disk.forget_offload_task

local TIER_ORDINARY, TIER_SOFT, SOFT_DEADLINES = K.tier_ordinary, K.tier_soft, K.deadline_soft_pin
local TIER_RETAINED, TIER_SOFT_RETAINED = K.tier_retained, K.tier_soft_retained
local DRAINING = K.draining
-- Tiers come in levels: a candidate is the least recently leased unit among the allowed tiers
-- of the first level that has one. Level 2 is the fallback: soft-pinned units and retained
-- groups side by side (least recently leased first across both); a unit that is both sits in
-- a tier of its own that needs both flags. The retention deadline is a record's, not a unit's
-- (a retained group may have no members): its index, P:deadline:retention, lives beside the
-- unit indexes and is swept by sweep_retention (lua/lib/35_retention.lua).
local TIERS = { TIER_ORDINARY, TIER_SOFT, TIER_RETAINED, TIER_SOFT_RETAINED } -- in eviction order
local TIER_LEVEL = { [TIER_ORDINARY] = 1, [TIER_SOFT] = 2, [TIER_RETAINED] = 2, [TIER_SOFT_RETAINED] = 2 }
local TIER_ALLOW = { -- the config flags that allow evicting a tier (all of a list); none: always
  [TIER_SOFT] = 'allow_evict_soft_pinned_objects',
  [TIER_RETAINED] = 'allow_evict_retained_groups',
  [TIER_SOFT_RETAINED] = { 'allow_evict_soft_pinned_objects', 'allow_evict_retained_groups' },
}
local DEADLINES = { soft_pin = SOFT_DEADLINES }     -- kind -> index
local DEADLINE_KINDS = { 'soft_pin' }
local AGG_KINDS = { 'soft_pin', 'guarantee' }      -- member deadlines a composite unit aggregates
local INDEXES = { -- every index a unit can be in
  TIER_ORDINARY, TIER_SOFT, SOFT_DEADLINES, DRAINING, TIER_RETAINED, TIER_SOFT_RETAINED }

local function object_unit(tenant, key) return 'o:' .. tenant .. ':' .. key end
-- object_unit(tenant, key) is object_unit_prefix(tenant) .. key (a batch builds the prefix once)
local function object_unit_prefix(tenant) return 'o:' .. tenant .. ':' end
local function group_unit(tenant, group)
  local h = radix_hash(group)
  if h then return 'r:' .. tenant .. ':' .. h end -- a radix node's unit
  return 'g:' .. tenant .. ':' .. group
end
-- group_unit(tenant, RADIX_MARK .. h) is node_unit_prefix(tenant) .. h
local function node_unit_prefix(tenant) return 'r:' .. tenant .. ':' end
local function agg_key(P, kind, unit) return P .. K.aggregate .. kind .. ':' .. unit end

-- Grouped radix keys (a put with a group id while the radix index is on). Such a key's eviction
-- unit is its radix node (its object has `node`, and its user group in the field `ugroup`, so
-- load_object's o.group is the node's internal group name); it is also a member of its user
-- group, kept apart from the group's own unit members (P:grpm, counted in `members`):
--   P:agg:indexed:g:<tenant>:<group>  zset key -> 0: the group's members whose unit is their node
--   P:agg:nodes:g:<tenant>:<group>    zset node hash -> the group's keys in that node
--   P:agg:groups:r:<tenant>:<hash>    zset group -> the node's keys in that group; the node's
--                                     record has grouped = 1 from the first such key on (kept
--                                     with the record), so a node that never had one reads none
-- The unit rule composes them: a node's facts are its keys' (processing, pins, tasks, guarantees,
-- lease), its children, and the latest active retention among its keys' groups, so a retained
-- member ranks its whole node in the fallback level, and through has_children every ancestor
-- stays while the node does. Bounds: a node has keys of at most MAX_NODE_GROUPS groups and a
-- group keys in at most MAX_GROUP_NODES nodes (put_start answers INVALID_PARAMS beyond), so a
-- node's placement reads at most MAX_NODE_GROUPS retention records and a retention change
-- re-places at most MAX_GROUP_NODES nodes.
local MAX_NODE_GROUPS, MAX_GROUP_NODES = 8, 64
local function user_unit(tenant, group) return 'g:' .. tenant .. ':' .. group end
local function node_unit(tenant, h) return 'r:' .. tenant .. ':' .. h end

-- The latest retention deadline among the groups of node h's keys (0: none).
local function node_retention(P, tenant, h)
  local best = 0
  for _, g in ipairs(redis.call('ZRANGE', agg_key(P, 'groups', node_unit(tenant, h)), 0, MAX_NODE_GROUPS - 1)) do
    local r = tonumber_(redis.call('HGET', grp_key(P, tenant, g), 'retained_until')) or 0
    if r > best then best = r end
  end
  return best
end

-- May a key of user group `group` join node h without passing a bound?
local function indexed_room(P, tenant, group, h)
  local gk, nk = agg_key(P, 'groups', node_unit(tenant, h)), agg_key(P, 'nodes', user_unit(tenant, group))
  if not redis.call('ZSCORE', gk, group) and redis.call('ZCARD', gk) >= MAX_NODE_GROUPS then return false end
  return redis.call('ZSCORE', nk, h) ~= false or redis.call('ZCARD', nk) < MAX_GROUP_NODES
end

local function join_indexed(P, tenant, key, group, h)
  if redis.call('ZADD', agg_key(P, 'indexed', user_unit(tenant, group)), 'NX', 0, key) == 0 then return end
  redis.call('ZINCRBY', agg_key(P, 'nodes', user_unit(tenant, group)), 1, h)
  if tonumber_(redis.call('ZINCRBY', agg_key(P, 'groups', node_unit(tenant, h)), 1, group)) == 1 then
    redis.call('HSET', P .. K.radix_node .. tenant .. ':' .. h, 'grouped', '1')
  end
end

-- The key leaves its user group (its node is re-placed or retired by the caller).
local function leave_indexed(P, tenant, key, group, h)
  if redis.call('ZREM', agg_key(P, 'indexed', user_unit(tenant, group)), key) == 0 then return end
  local nk, gk = agg_key(P, 'nodes', user_unit(tenant, group)), agg_key(P, 'groups', node_unit(tenant, h))
  if tonumber_(redis.call('ZINCRBY', nk, -1, h)) <= 0 then redis.call('ZREM', nk, h) end
  if tonumber_(redis.call('ZINCRBY', gk, -1, group)) <= 0 then redis.call('ZREM', gk, group) end
end

-- The group's members that are radix-indexed (their nodes are their units).
local function indexed_members(P, tenant, group)
  return redis.call('ZCARD', agg_key(P, 'indexed', user_unit(tenant, group)))
end

-- The indexes a unit can be in by the rule: an object unit never drains and never sits in a
-- retention tier, and one that never had a soft pin (soft_pin_until is written only by the first
-- put_end, when it commits a pin; older stores also wrote '0' at put_start) only in the ordinary
-- tier; so the hot paths (put_start, put_end, remove) touch one index or three, not all of them.
-- unplace clears every index, and repairs and eviction clear all three object indexes.
local OBJECT_INDEXES, UNPINNED_OBJECT_INDEXES = { TIER_ORDINARY, TIER_SOFT, SOFT_DEADLINES }, { TIER_ORDINARY }
local function indexes_of(unit)
  return sub_(unit, 1, 2) == 'o:' and OBJECT_INDEXES or INDEXES
end
local function ever_soft_pinned(o)
  local v = o.soft_pin_until
  return v ~= nil and v ~= '0' and (tonumber_(v) or 0) > 0 -- '0' (never pinned) is the common case
end
local function object_indexes(o)
  return ever_soft_pinned(o) and OBJECT_INDEXES or UNPINNED_OBJECT_INDEXES
end

local function unplace(P, unit)
  for _, index in ipairs(INDEXES) do redis.call('ZREM', P .. index, unit) end
end

-- A composite unit's record remembers which indexes its unit has entries in, in the field
-- MEMO_FIELD (`at`): their positions in INDEXES as digits ('13'; '' none; absent, as in a record
-- written before the field existed: any). A placement then writes those indexes and the rule's,
-- not all six. Every writer of a composite unit's entries keeps the memo a superset of them
-- (apply_composite, unplace_composite); the eviction re-check and fsck place with no memo (every
-- index), so an entry the memo missed costs a pop, never a wrong eviction or a stuck candidate.
local MEMO_FIELD = 'at'
local DIGITS = { '1', '2', '3', '4', '5', '6', '7', '8', '9' } -- an index's position as a memo writes it
-- Which index positions a memo lists ({ [i] = true }), by memo: a placement looks at every index,
-- and a find per index is a C call. Memos are the few subsets of INDEXES placements write (a
-- hand-edited one could be any string: bounded, dropped whole at MEMO_LISTS_MAX).
local MEMO_LISTS, memo_lists_n, MEMO_LISTS_MAX = {}, 0, 256
local function memo_list(at)
  local l = MEMO_LISTS[at]
  if l then return l end
  l = {}
  for i = 1, #DIGITS do l[i] = find_(at, DIGITS[i], 1, true) ~= nil end
  if memo_lists_n >= MEMO_LISTS_MAX then MEMO_LISTS, memo_lists_n = {}, 0 end
  MEMO_LISTS[at], memo_lists_n = l, memo_lists_n + 1
  return l
end
local function in_memo(at, i) return at == nil or memo_list(at)[i] end

-- Remove a composite unit's entries from the indexes its memo `at` lists (nil: all); the caller
-- drops the record or its memo.
local function unplace_composite(P, unit, at)
  local listed = at ~= nil and memo_list(at)
  for i = 1, #INDEXES do
    if not listed or listed[i] then redis.call('ZREM', P .. INDEXES[i], unit) end
  end
end

-- Was node record `nkey` written by this call for a new node (its first key's put, or its
-- registration), and neither placed nor linked to since? Then it exists, is not draining, has
-- no entries (its memo is empty) and no child: a link to it needs no read of its record
-- (Radix.radix_apply). Every write of a memo (apply_composite, place_protected), a node's
-- settling or retiring, and its first link end this.
local function fresh_node(nkey) return CALL.fresh_nodes ~= nil and CALL.fresh_nodes[nkey] == true end
local function new_node(nkey)
  CALL.fresh_nodes = CALL.fresh_nodes or {}
  CALL.fresh_nodes[nkey] = true
end
local function unfresh(nkey) if CALL.fresh_nodes then CALL.fresh_nodes[nkey] = nil end end

-- Write a composite unit's entries as the rule says and keep its memo (record `gkey`, memo as
-- read `at`, nil: any index). A memo that would say nothing more than its absence is not written,
-- so a placement never creates a record. `fields`: more field/value pairs of the record to
-- write in the same HSET.
local function apply_composite(P, gkey, unit, entries, now, at, fields)
  if CALL.fresh_nodes then CALL.fresh_nodes[gkey] = nil end -- (its memo may change: Units.fresh_node)
  local code, listed = '', at ~= nil and memo_list(at)
  for i = 1, #INDEXES do
    local index = INDEXES[i]
    local score = entries[index]
    if score ~= nil then
      code = code .. DIGITS[i]
      if score == false then
        redis.call('ZADD', P .. index, 'NX', S(now), unit)
      else
        redis.call('ZADD', P .. index, S(score), unit)
      end
    elseif not listed or listed[i] then
      redis.call('ZREM', P .. index, unit)
    end
  end
  if code ~= (at or '') then
    fields = fields or {}
    fields[#fields + 1], fields[#fields + 2] = MEMO_FIELD, code
  end
  if fields then redis.call('HSET', gkey, unpack(fields)) end
  return code
end

-- A composite unit the rule protects now (a member in progress; a radix node with a child)
-- has no entries unless it is draining: its entries go by its memo `at` (as read; nil: every
-- index), its facts unread.
local function place_protected(P, gkey, unit, at, draining, now)
  if CALL.fresh_nodes then CALL.fresh_nodes[gkey] = nil end
  if draining then return apply_composite(P, gkey, unit, { [DRAINING] = false }, now, at) end
  if at == '' then return end
  unplace_composite(P, unit, at)
  redis.call('HSET', gkey, MEMO_FIELD, '')
end

-- `o`, when given, narrows the indexes to those the object can be in (object_indexes).
local function unplace_object(P, unit, o)
  for _, index in ipairs(o and object_indexes(o) or OBJECT_INDEXES) do redis.call('ZREM', P .. index, unit) end
end

-- The rule. `f` holds a unit's facts: processing, hard_pinned, task_refs (counts or flags),
-- offload_pending (an object eviction queued for offload: its memory goes when that ends),
-- disk_only (an object kept only by its disk replicas, 27_disk.lua: nothing to free), has_disk
-- (an object with a disk replica field), empty (a group without members), draining, lease_until, and one deadline per kind
-- (soft_pin, guarantee). Returns why the unit is protected ('' when it is not) and the index entries it
-- should have: { [index] = score } (score false: any, for the draining index).
local function unit_rule(f, now)
  if f.draining then return 'draining', { [DRAINING] = false } end
  local why = (f.empty and 'no_members') or ((f.children or 0) > 0 and 'has_children') or (f.processing > 0 and 'processing')
    or (f.hard_pinned > 0 and 'hard_pin') or (f.task_refs > 0 and 'task_ref')
    or (f.offload_pending and 'offload_pending')
    or (f.disk_only and 'disk_only')
    or (f.guarantee > now and 'guaranteed') or ''
  if why ~= '' then return why, {} end
  if (f.retained_until or 0) > now then -- a group's active retention: the fallback level
    if f.soft_pin > now then
      return '', { [TIER_SOFT_RETAINED] = f.lease_until, [SOFT_DEADLINES] = f.soft_pin }
    end
    return '', { [TIER_RETAINED] = f.lease_until }
  end
  if f.soft_pin > now then
    return '', { [TIER_SOFT] = f.lease_until, [SOFT_DEADLINES] = f.soft_pin }
  end
  return '', { [TIER_ORDINARY] = f.lease_until }
end

local function object_facts(o)
  local disk_only, has_disk = is_disk_only(o)
  return { processing = o.status ~= 'complete' and 1 or 0, hard_pinned = o.hard_pin == '1' and 1 or 0,
    task_refs = tonumber_(o.task_refs) or 0, lease_until = tonumber_(o.lease_until) or 0,
    soft_pin = tonumber_(o.soft_pin_until) or 0, guarantee = tonumber_(o.guaranteed_until) or 0,
    disk_only = disk_only, has_disk = has_disk, offload_pending = o.offload_evict ~= nil }
end

-- The fields of a composite unit's record its facts are made of; a radix node's record is read
-- with its own after them (NODE_FIELDS: kid, the child its record lists (lua/lib/32_radix.lua),
-- then parent, parent_shard, link_pending, created at GROUP_N + 1 to + 5), so that one read
-- serves its placement and its settling.
local GROUP_FIELDS = { 'members', 'processing', 'hard_pinned', 'lease_until', 'task_refs', 'draining',
  'retained_until', 'grouped', MEMO_FIELD }
local GROUP_N = #GROUP_FIELDS
local NODE_FIELDS = {}
for i = 1, GROUP_N do NODE_FIELDS[i] = GROUP_FIELDS[i] end
NODE_FIELDS[GROUP_N + 1], NODE_FIELDS[GROUP_N + 2], NODE_FIELDS[GROUP_N + 3], NODE_FIELDS[GROUP_N + 4],
  NODE_FIELDS[GROUP_N + 5] = 'kid', 'parent', 'parent_shard', 'link_pending', 'created'

-- `g`, `children`: the record's GROUP_FIELDS (a radix node's NODE_FIELDS, or at least its
-- GROUP_FIELDS and kid) and a node's child count as just read (nil: read them). The members'
-- deadlines (the aggregates) count only for a unit nothing else protects (unit_rule), so they
-- are read only then, unless `all` (the audit's view). A node's facts carry its own fields too
-- (f.node: read with them).
local function group_facts(P, tenant, group, g, children, all)
  local h = radix_hash(group)
  g = g or redis.call('HMGET', grp_key(P, tenant, group), unpack(h and NODE_FIELDS or GROUP_FIELDS))
  local f = { members = tonumber_(g[1]) or 0, empty = (tonumber_(g[1]) or 0) <= 0, processing = tonumber_(g[2]) or 0,
    hard_pinned = tonumber_(g[3]) or 0, lease_until = tonumber_(g[4]) or 0, task_refs = tonumber_(g[5]) or 0,
    draining = g[6] == '1', retained_until = tonumber_(g[7]) or 0, at = g[9] or nil } -- at: the memo
  if h then -- a node with a live child stays; a retained key's group ranks its node as retained
    if #g >= GROUP_N + 5 then
      f.node, f.parent, f.parent_shard, f.link_pending = true, g[GROUP_N + 2] or nil, g[GROUP_N + 3] or nil,
        g[GROUP_N + 4] or nil
    end
    local kid = g[GROUP_N + 1]
    if #g >= GROUP_N then f.grouped = g[8] ~= false end -- (never grouped: no `groups` aggregate)
    if #g <= GROUP_N then kid = redis.call('HGET', grp_key(P, tenant, group), 'kid') end
    -- a child its record lists is a live child; else its children's zset says
    f.children = children or (kid and 1) or redis.call('ZCARD', P .. K.radix_kids .. tenant .. ':' .. h)
    f.retained_until = g[8] and node_retention(P, tenant, h) or 0 -- (never grouped: no groups to read)
  end
  f.soft_pin, f.guarantee = 0, 0
  if not all and (f.draining or f.empty or (f.children or 0) > 0 or f.processing > 0 or f.hard_pinned > 0
    or f.task_refs > 0) then
    return f
  end
  local unit = group_unit(tenant, group)
  local soft_key, guarantee_key = agg_key(P, 'soft_pin', unit), agg_key(P, 'guarantee', unit)
  if redis.call('EXISTS', soft_key, guarantee_key) == 0 then -- (an empty zset is no key)
    f.no_aggs = true
    return f
  end
  f.soft_pin = tonumber_(redis.call('ZREVRANGE', soft_key, 0, 0, 'WITHSCORES')[2]) or 0
  f.guarantee = tonumber_(redis.call('ZREVRANGE', guarantee_key, 0, 0, 'WITHSCORES')[2]) or 0
  return f
end

-- Write a unit's index entries as the rule says (entries it should not have are removed from
-- `indexes`, by default every index the unit's kind can be in). `deferred`: the scored entries
-- may wait for the end of the caller's batch (Ledger.defer_zadd: nothing in the call reads them).
local function apply_rule(P, unit, entries, now, indexes, deferred)
  for _, index in ipairs(indexes or indexes_of(unit)) do
    local score = entries[index]
    if score == nil then
      redis.call('ZREM', P .. index, unit)
    elseif score == false then
      redis.call('ZADD', P .. index, 'NX', S(now), unit)
    elseif deferred then
      defer_zadd(P .. index, S(score), unit)
    else
      redis.call('ZADD', P .. index, S(score), unit)
    end
  end
end

-- The tiers a unit may sit in, from what the reader loaded: an ungrouped object only in the
-- ordinary tier, or also the soft tier if it ever had a soft pin (one that expired may still sit
-- there until the sweep moves it, and its score must stay its lease); a group in any tier.
local OBJECT_TIERS, SOFT_OBJECT_TIERS = { TIER_ORDINARY }, { TIER_ORDINARY, TIER_SOFT }
local function possible_tiers(o)
  if o.group then return TIERS end
  return ever_soft_pinned(o) and SOFT_OBJECT_TIERS or OBJECT_TIERS
end

-- An ungrouped object's lease lives where the rule needs it: while its unit sits in a tier, in
-- that tier's score only (a read renews it with ZADD XX GT and writes nothing to the hash), else
-- (protected) in the hash's lease_until, which is otherwise the lease as of the unit's last
-- placement. So the lease is the larger of the two (the hash's alone for a group member: its
-- group holds the lease).
local function object_lease(P, unit, o)
  local lease = tonumber_(o.lease_until) or 0
  local tiers = possible_tiers(o)
  for i = 1, #tiers do
    local s = tonumber_(redis.call('ZSCORE', P .. tiers[i], unit))
    if s and s > lease then lease = s end
  end
  return lease
end

-- Before a re-placement may take the unit out of its tier: the tier's lease into the hash.
local function keep_lease(P, unit, okey, o)
  local lease = object_lease(P, unit, o)
  if lease > (tonumber_(o.lease_until) or 0) then
    o.lease_until = S(lease)
    redis.call('HSET', okey, 'lease_until', o.lease_until)
  end
end

-- The lease a reader of the object (remove's check, inspect) must respect: its group's, or its own.
local function lease_of(P, tenant, key, o)
  if o.group then return Object.lease_until(P, tenant, o) end
  return object_lease(P, object_unit(tenant, key), o)
end

-- `out_of_tiers`: the caller knows the unit sits in no tier (its put was in progress), so it has
-- no tier lease to keep, and its entries may wait for the end of the caller's batch.
local function place_object(P, tenant, key, o, now, out_of_tiers)
  local unit = object_unit(tenant, key)
  if not out_of_tiers then keep_lease(P, unit, obj_key(P, tenant, key), o) end
  local why, entries = unit_rule(object_facts(o), now)
  apply_rule(P, unit, entries, now, object_indexes(o), out_of_tiers)
  return why -- '' when the unit sits in a tier
end

-- `thorough`: ignore the memo (every index), for repairs and the eviction re-check; `g`,
-- `children` as for group_facts. Returns the facts, as now written (the memo with them).
local function place_group(P, tenant, group, now, thorough, g, children)
  local f = group_facts(P, tenant, group, g, children)
  local _, entries = unit_rule(f, now)
  f.at = apply_composite(P, grp_key(P, tenant, group), group_unit(tenant, group), entries, now,
    (not thorough) and f.at or nil)
  return f
end

-- Re-place the nodes of a group's indexed keys (its retention changed).
local function place_group_nodes(P, tenant, group, now)
  for _, h in ipairs(redis.call('ZRANGE', agg_key(P, 'nodes', user_unit(tenant, group)), 0, MAX_GROUP_NODES - 1)) do
    place_group(P, tenant, RADIX_MARK .. h, now)
  end
end

-- Re-place the unit an object belongs to after its state changed.
local function place_unit_of(P, tenant, key, o, now)
  if o.group then place_group(P, tenant, o.group, now) else place_object(P, tenant, key, o, now) end
end

-- What a unit's index entries should be at `now`, read from its records: why it is protected
-- ('' if it is not, 'missing' for no such unit, 'grouped' for the object unit of a group member,
-- whose group is the unit), { [index] = score }, and whether a guarantee of the unit ran out but
-- the sweep has not ended it yet (its entries then lag behind the rule until the sweep runs),
-- and a composite unit's memo (MEMO_FIELD, nil when absent). The audit asks this; nothing
-- re-derives it.
local function unit_state(P, unit, now)
  local kind, tenant, name = match_(unit, '^([ogr]):([^:]+):(.*)$')
  local f
  if kind == 'r' then kind, name = 'g', RADIX_MARK .. name end -- a radix node: the group machinery's
  if kind == 'g' and valid_tenant(tenant) then
    f = group_facts(P, tenant, name, nil, nil, true)
    if f.empty and not f.draining and redis.call('EXISTS', grp_key(P, tenant, name)) == 0 then return 'missing', {} end
  elseif kind == 'o' and valid_tenant(tenant) then
    local o = load_object(obj_key(P, tenant, name))
    if not o then return 'missing', {} end
    if o.group then return 'grouped', {} end
    f = object_facts(o)
    f.lease_until = object_lease(P, unit, o)
  else
    return 'missing', {}
  end
  local why, entries = unit_rule(f, now)
  return why, entries, f.guarantee > 0 and f.guarantee <= now, f.at
end

-- Re-derive one unit's index entries from its records.
local function replace_unit(P, unit, now)
  local kind, tenant, key = match_(unit, '^([ogr]):([^:]+):(.*)$')
  if kind and kind ~= 'o' and valid_tenant(tenant) then -- a composite unit: through its memo
    return place_group(P, tenant, kind == 'r' and RADIX_MARK .. key or key, now)
  end
  if kind and valid_tenant(tenant) then -- an object: its tier's lease into its hash first
    local okey = obj_key(P, tenant, key)
    local o = load_object(okey)
    if o and not o.group then keep_lease(P, unit, okey, o) end
  end
  local _, entries = unit_state(P, unit, now)
  apply_rule(P, unit, entries, now)
end

local function group_draining(P, tenant, group)
  return redis.call('HGET', grp_key(P, tenant, group), 'draining') == '1'
end

-- An object whose group is being evicted is gone for every caller but the eviction itself.
local function being_evicted(P, tenant, o)
  return o.group ~= nil and group_draining(P, tenant, o.group)
end

-- A read leases the object's unit (the object, or its whole group) until at least until_ms. A
-- renewal sets the lease to until_ms rounded up to a multiple of the slack (kv_lease_slack; 0:
-- until_ms itself), so that the reads of a key within one slack window set the same lease and
-- all but the first write nothing (no HSET, no ZADD that changes anything: nothing for the AOF
-- or the replicas). Where the lease goes is object_lease's rule: a group's in its hash (HSET)
-- and its tiers re-scored; an ungrouped object's in its tier alone (ZADD XX GT: a score only
-- grows), unless the rule keeps it out of every tier (or a guarantee's end is still to be swept),
-- when it goes to the hash. Re-scores are queued in `rescore` (one per call: tier -> {score,
-- unit, ...}, 'gt:' .. tier for the GT ones; until_ms -> its score string) for flush_rescore,
-- which sends one variadic ZADD per tier and kind for the whole batch.
local function rounded_lease(until_ms, slack)
  local r = slack > 0 and until_ms % slack or 0
  if r ~= 0 then until_ms = until_ms - r + slack end
  return until_ms
end

local function renewal(rescore, until_ms, slack)
  until_ms = rounded_lease(until_ms, slack)
  local score = rescore[until_ms] or S(until_ms) -- a batch's keys share one deadline: format it once
  rescore[until_ms] = score
  return until_ms, score
end

local GT_OF = {} -- tier -> its key in `rescore` for the GT re-scores
for i = 1, #TIERS do GT_OF[TIERS[i]] = 'gt:' .. TIERS[i] end

local function queue_rescore(rescore, tiers, names, score, unit)
  for i = 1, #tiers do
    local name = names and names[tiers[i]] or tiers[i]
    local q = rescore[name]
    if not q then q = {}; rescore[name] = q end
    q[#q + 1] = score
    q[#q + 1] = unit
  end
end

-- The tier an unprotected, ungrouped object without pins, guarantee, tasks or disk replicas
-- sits in, as the rule says (asked once: its facts are always the same).
local PLAIN_FACTS = { processing = 0, hard_pinned = 0, task_refs = 0, lease_until = 0, soft_pin = 0,
  guarantee = 0, disk_only = false, has_disk = false, offload_pending = false }
local plain_tier = nil
local function plain_object_tier(now)
  if not plain_tier then
    local why, entries = unit_rule(PLAIN_FACTS, now)
    for i = 1, #TIERS do
      if why == '' and entries[TIERS[i]] then plain_tier = TIERS[i] end
    end
  end
  return plain_tier
end

-- The lease a read gives such objects: their tier's score only (see extend_lease). Every plain
-- object a call reads gets the same one, so a call asks once: the lease (until_ms rounded up to
-- the slack), its score string, and the queue of the plain tier's GT re-scores in `rescore`, to
-- which the call appends (score, unit) pairs itself.
local function plain_lease(rescore, until_ms, slack, now)
  local score
  until_ms, score = renewal(rescore, until_ms, slack)
  local name = GT_OF[plain_object_tier(now)]
  local q = rescore[name]
  if not q then q = {}; rescore[name] = q end
  return until_ms, score, q
end

-- The same for a call of one key: its one re-score sent at once (no queue).
local function plain_lease_now(P, unit, until_ms, slack, now)
  until_ms = rounded_lease(until_ms, slack)
  redis.call('ZADD', P .. plain_object_tier(now), 'XX', 'GT', S(until_ms), unit)
  return until_ms
end

-- The tiers a composite unit's memo `at` lists (none for '': a protected unit sits in no tier).
local MEMO_TIERS = {} -- memo -> its tiers, filled as memos are met (at most 2^#INDEXES)
local function memo_tiers(at)
  local t = MEMO_TIERS[at]
  if not t then
    t = {}
    for i = 1, #INDEXES do
      if TIER_LEVEL[INDEXES[i]] and in_memo(at, i) then t[#t + 1] = INDEXES[i] end
    end
    MEMO_TIERS[at] = t
  end
  return t
end

-- A read's lease of a group (its record `gkey`, its unit, its lease `cur`): see extend_lease.
-- A group's lease lives in its record, which every re-check reads (eviction, placement), so a
-- tier score is only its rank: `tiers` may leave out tiers the group is not expected in (a
-- re-score that misses lags until the next placement, and costs a pop, never a wrong eviction).
local function lease_group(gkey, unit, cur, until_ms, slack, rescore, tiers)
  if until_ms <= cur then return cur end
  local score
  until_ms, score = renewal(rescore, until_ms, slack)
  redis.call('HSET', gkey, 'lease_until', score)
  queue_rescore(rescore, tiers or TIERS, nil, score, unit)
  return until_ms
end

-- The tiers a group is expected in by its retention (retained_until, as stored) at `now`; a
-- radix node that ever had a grouped key (`grouped`) takes its retention from its keys' groups
-- (node_retention), not from its record: any tier.
local RETAINED_TIERS, UNRETAINED_TIERS = { TIER_RETAINED, TIER_SOFT_RETAINED }, { TIER_ORDINARY, TIER_SOFT }
-- `at`: the unit's memo as read (nil: none), which names the tiers its entry can be in.
local function group_tiers(retained_until, now, grouped, at)
  if at then return memo_tiers(at) end
  if grouped then return TIERS end
  return (tonumber_(retained_until) or 0) > now and RETAINED_TIERS or UNRETAINED_TIERS
end

local function extend_lease(P, tenant, key, okey, o, until_ms, slack, rescore, now)
  local target, unit, cur = okey, object_unit(tenant, key), tonumber_(o.lease_until) or 0
  if o.group then
    target, unit = grp_key(P, tenant, o.group), group_unit(tenant, o.group)
    return lease_group(target, unit, tonumber_(redis.call('HGET', target, 'lease_until')) or 0, until_ms, slack,
      rescore)
  end
  if until_ms <= cur then return cur end
  local score
  until_ms, score = renewal(rescore, until_ms, slack)
  if not o.guaranteed_until and unit_rule(object_facts(o), now) == '' then
    queue_rescore(rescore, possible_tiers(o), GT_OF, score, unit)
    return until_ms
  end
  redis.call('HSET', target, 'lease_until', score)
  return until_ms
end

local function flush_rescore(P, rescore)
  for i = 1, #TIERS do
    local tier = TIERS[i]
    local q = rescore[tier]
    if q then redis.call('ZADD', P .. tier, 'XX', unpack(q)) end
    q = rescore[GT_OF[tier]]
    if q then redis.call('ZADD', P .. tier, 'XX', 'GT', unpack(q)) end
  end
end

-- `fresh`: the group is a radix node created in this call, its record not written yet: the
-- field/value pairs to write with the counters (Radix.radix_register).
local function join_group(P, tenant, key, group, hard_pin, guaranteed_until, now, fresh)
  -- (a node created in this call has no members: its first goes into the record's one HSET)
  if not fresh and add_member(P, tenant, group, member_of(group, key)) == 0 then return end
  local gkey, unit = grp_key(P, tenant, group), group_unit(tenant, group)
  if guaranteed_until then redis.call('ZADD', agg_key(P, 'guarantee', unit), S(guaranteed_until), key) end
  -- the new member is in progress: the rule protects the group. The first member finds no
  -- counters (retire_group dropped them) and no entries; a group being drained stays draining.
  if fresh or redis.call('HINCRBY', gkey, 'members', 1) == 1 then
    local first = fresh or { MEMO_FIELD, '' } -- (a new node's fields carry the memo)
    first[#first + 1], first[#first + 2], first[#first + 3], first[#first + 4] = 'members', '1', 'processing', '1'
    if hard_pin == '1' then first[#first + 1], first[#first + 2] = 'hard_pinned', '1' end
    if fresh then first[#first + 1], first[#first + 2] = member_of(group, key), '' end
    redis.call('HSET', gkey, unpack(first))
    if fresh then new_node(gkey) end
    return
  end
  redis.call('HINCRBY', gkey, 'processing', 1)
  if hard_pin == '1' then redis.call('HINCRBY', gkey, 'hard_pinned', 1) end
  local g = redis.call('HMGET', gkey, 'draining', MEMO_FIELD)
  place_protected(P, gkey, unit, g[2] or nil, g[1] == '1', now)
end

-- A member's put ended: it counts as complete, its soft pin extends the group's, and, as for an
-- object at put_end, the group's lease becomes max(lease, now) (so an unread group ranks by
-- its last completion, like an object).
local function group_member_completed(P, tenant, key, group, soft_pin_until, now, g)
  local gkey, unit = grp_key(P, tenant, group), group_unit(tenant, group)
  -- with the record as read in this call (g), the decrement goes into the one HSET below
  local processing = g and (tonumber_(g[2]) or 0) - 1 or redis.call('HINCRBY', gkey, 'processing', -1)
  local fields = g and { 'processing', S(processing) } or nil
  if (tonumber_(soft_pin_until) or 0) > 0 then redis.call('ZADD', agg_key(P, 'soft_pin', unit), soft_pin_until, key) end
  if processing > 0 then -- another member is in progress: the rule protects the group still
    if now > (tonumber_(g and g[4] or redis.call('HGET', gkey, 'lease_until')) or 0) then
      fields = fields or {}
      fields[#fields + 1], fields[#fields + 2] = 'lease_until', S(now)
    end
    if fields then redis.call('HSET', gkey, unpack(fields)) end
    return
  end
  if g then g[2] = processing end -- (g was read before the decrement; without it, group_facts reads now)
  local f = group_facts(P, tenant, group, g)
  if now > f.lease_until then
    fields = fields or {}
    fields[#fields + 1], fields[#fields + 2], f.lease_until = 'lease_until', S(now), now
  end
  local _, entries = unit_rule(f, now)
  apply_composite(P, gkey, unit, entries, now, f.at, fields)
end

-- The last member is gone: drop the group's unit and counters (a group record that carries
-- more than the counters, e.g. a retention declared ahead of members, stays). A radix node then
-- goes too unless it has children (Radix.node_retired, lua/lib/32_radix.lua).
local RETIRED_FIELDS = { 'members', 'processing', 'hard_pinned', 'lease_until', 'task_refs', 'draining', MEMO_FIELD }
local NO_FACTS = {} -- (a group's retirement names every key: only a node's facts spare some)
-- `f`: the group's facts, if read in this call and still current (a radix node's then spare a read);
-- `members`: the members just dropped and not removed yet (an eviction's last: a node's record
-- keeps them while it has children).
local function retire_group(P, tenant, group, now, f, members)
  local gkey = grp_key(P, tenant, group)
  local unit = group_unit(tenant, group)
  -- the keys that go with the members (a node's: a member set an older layout left), but for a
  -- node those its facts (`f`) know absent (a shorter DEL: docs/bench.md, "a radix node's last key")
  local h = radix_hash(group)
  local node_f = h and f or NO_FACTS
  local gone = {}
  if not node_f.no_legacy_set then gone[1] = grp_members_key(P, tenant, group) end
  if not node_f.no_aggs then
    for _, kind in ipairs(AGG_KINDS) do gone[#gone + 1] = agg_key(P, kind, unit) end
  end
  if h then
    if node_f.grouped ~= false then gone[#gone + 1] = agg_key(P, 'groups', unit) end
    return Radix.node_retired(P, tenant, h, now or now_ms(P), gone, f, members)
  end
  unplace_composite(P, unit, redis.call('HGET', gkey, MEMO_FIELD) or nil)
  redis.call('DEL', unpack(gone))
  redis.call('HDEL', gkey, unpack(RETIRED_FIELDS))
end

-- A radix node's last key leaves (its member field present, its record counting one member):
-- one read of the record, then the node retires with the member (no HDEL and HINCRBY of a
-- record about to go). nil when the key is not its record's last member: the general path.
local LAST_KEY_FIELDS = { 'members', MEMO_FIELD, 'parent', 'parent_shard', 'link_pending', 'kid', 'grouped' }
local function leave_node_as_last(P, tenant, group, member, h, now, o)
  local gkey = grp_key(P, tenant, group)
  local rec = redis.call('HMGET', gkey, member, unpack(LAST_KEY_FIELDS))
  if not rec[1] or (tonumber_(rec[2]) or 0) > 1 then return nil end
  local f = { node = true, at = rec[3] or nil, parent = rec[4] or nil, parent_shard = rec[5] or nil,
    link_pending = rec[6] or nil, children = rec[7] and 1 or redis.call('ZCARD', P .. K.radix_kids .. tenant .. ':' .. h),
    grouped = rec[8] ~= false,
    -- the one member is in the record, so no older layout's set holds any; the aggregates hold
    -- only members with a soft pin or a guarantee (one ever written stays on the object)
    no_legacy_set = true, no_aggs = not o.soft_pin_until and not o.guaranteed_until }
  local placed = CALL.placed
  if placed and placed.pending and placed.gkey == gkey then CALL.placed = nil end -- (never written: nothing to undo)
  retire_group(P, tenant, group, now, f, { member })
  return true
end

local function leave_group(P, tenant, key, o, now)
  local group = o.group
  if o.ugroup and o.node then leave_indexed(P, tenant, key, o.ugroup, o.node) end
  local member, h = member_of(group, key), radix_hash(group)
  if h and leave_node_as_last(P, tenant, group, member, h, now, o) then return end
  local gkey = grp_key(P, tenant, group)
  local placed = CALL.placed -- a batched remove's pending placement of this node is written first
  if placed and placed.pending and placed.gkey == gkey then Radix.flush_placed(P) end
  if remove_members(P, tenant, group, { member }) == 0 then return end
  if redis.call('HINCRBY', gkey, 'members', -1) <= 0 then -- the counters and aggregates go with it
    return retire_group(P, tenant, group, now)
  end
  if o.status ~= 'complete' then redis.call('HINCRBY', gkey, 'processing', -1) end
  if o.hard_pin == '1' then redis.call('HINCRBY', gkey, 'hard_pinned', -1) end
  local refs = tonumber_(o.task_refs) or 0
  if refs > 0 then redis.call('HINCRBY', gkey, 'task_refs', S(0 - refs)) end
  for _, kind in ipairs(AGG_KINDS) do redis.call('ZREM', agg_key(P, kind, group_unit(tenant, group)), key) end
  place_group(P, tenant, group, now)
end

-- An object eviction queued for offload (offload_evict) ends: it leaves P:offload_evict and its
-- bytes leave P.offload_evict_bytes (the caller deletes the object, or drops the field).
local function forget_offload_evict(P, tenant, key, o)
  redis.call('ZREM', P .. K.offload_evict, obj_id(tenant, key))
  redis.call('HINCRBY', P, 'offload_evict_bytes', S(-(tonumber_(o.size) or 0)))
  o.offload_evict = nil
end

-- Free an object's replicas (or hold them until `hold_until`; its disk replicas leave their disks
-- and their files are queued for removal) and drop its hash and counters: the KV event `event`
-- ('removed' when nil; eviction says 'evicted'). Returns the bytes its live replicas occupied.
local function drop_object(P, tenant, key, okey, o, hold_until, event)
  Events.emit(P, event or 'removed', tenant, key, okey, o)
  local bytes = 0
  local size = tonumber_(o.size) or 0
  local replicas, maybe_disk = replicas_of(P, o)
  if o.guaranteed_until then forget_guarantee(P, tenant, key, o, replicas) end
  if o.offload_client then forget_offload_task(P, tenant, key, o) end
  if o.offload_evict then forget_offload_evict(P, tenant, key, o) end
  if maybe_disk then drop_disk_replicas(P, tenant, key, o) end
  for _, r in ipairs(replicas) do
    if r.live and r.off then
      if hold_until then
        hold_extent(P, r.seg, r.mount, r.off, size, hold_until)
        bytes = bytes + size
      elseif free_extent(P, r.seg, r.off, size) then
        bytes = bytes + size
      end
    end
  end
  if o.status ~= 'complete' then redis.call('ZREM', P .. K.processing, obj_id(tenant, key)) end
  redis.call('DEL', okey)
  count_objects(P, -1)
  return bytes
end

-- Delete an object and keep its unit's indexes right.
local function delete_object(P, tenant, key, okey, o, hold_until, now)
  drop_object(P, tenant, key, okey, o, hold_until)
  if o.group then leave_group(P, tenant, key, o, now) else unplace_object(P, object_unit(tenant, key), o) end
end

-- A guarantee ends (its deadline passed, or expire_guaranteed): the object is an ordinary one
-- again, with its lease and soft pin as they were, and its unit goes where the rule says.
local function end_guarantee(P, tenant, key, okey, o, now)
  forget_guarantee(P, tenant, key, o, replicas_of(P, o))
  redis.call('HDEL', okey, 'guaranteed_until')
  o.guaranteed_until = nil
  if o.group then
    redis.call('ZREM', agg_key(P, 'guarantee', group_unit(tenant, o.group)), key)
    place_group(P, tenant, o.group, now)
  else
    place_object(P, tenant, key, o, now)
  end
end

-- A read with guaranteed_ttl_ms renews an active guarantee to max(current, until_ms); it never
-- creates one, nor revives one that ran out (the caller checks guaranteed_until > now).
local function renew_guarantee(P, tenant, key, okey, o, until_ms)
  redis.call('HSET', okey, 'guaranteed_until', S(until_ms))
  redis.call('ZADD', P .. K.guaranteed, S(until_ms), obj_id(tenant, key))
  if o.group then redis.call('ZADD', agg_key(P, 'guarantee', group_unit(tenant, o.group)), S(until_ms), key) end
end

-- End up to `limit` guarantees whose deadline is due. A stale entry (object gone, no guarantee,
-- or a later deadline) is dropped or re-scored.
local function sweep_guarantees(P, now, limit)
  local index = P .. K.guaranteed
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', index, '-inf', S(now), 'LIMIT', 0, limit)) do
    local tenant, key = match_(id, '^([^:]+):(.*)$')
    local okey = tenant and obj_key(P, tenant, key)
    local o = okey and load_object(okey)
    local until_ms = o and tonumber_(o.guaranteed_until)
    if not until_ms then
      redis.call('ZREM', index, id)
    elseif until_ms > now then
      redis.call('ZADD', index, S(until_ms), id)
    else
      end_guarantee(P, tenant, key, okey, o, now)
    end
  end
end

-- The one sweep of every deadline: guarantees that ran out end (each re-places its unit), then
-- units whose deadline is due in a deadline index are re-derived, then due group retentions
-- end (lua/lib/35_retention.lua; at most `limit` of each).
local function sweep_deadlines(P, now, limit)
  sweep_guarantees(P, now, limit)
  for _, kind in ipairs(DEADLINE_KINDS) do
    local index = P .. DEADLINES[kind]
    for _, unit in ipairs(redis.call('ZRANGEBYSCORE', index, '-inf', S(now), 'LIMIT', 0, limit)) do
      redis.call('ZREM', index, unit)
      replace_unit(P, unit, now)
    end
  end
  Retention.sweep_retention(P, now, limit)
end

return {
  DRAINING = DRAINING, TIERS = TIERS, TIER_LEVEL = TIER_LEVEL, TIER_ALLOW = TIER_ALLOW,
  DEADLINES = DEADLINES, DEADLINE_KINDS = DEADLINE_KINDS, INDEXES = INDEXES,
  object_unit = object_unit, object_unit_prefix = object_unit_prefix, node_unit_prefix = node_unit_prefix, group_unit = group_unit, agg_key = agg_key,
  ever_soft_pinned = ever_soft_pinned, unplace = unplace, unplace_object = unplace_object,
  MEMO_FIELD = MEMO_FIELD, in_memo = in_memo, unplace_composite = unplace_composite, apply_composite = apply_composite,
  place_protected = place_protected, fresh_node = fresh_node, new_node = new_node, unfresh = unfresh, GROUP_FIELDS = GROUP_FIELDS, GROUP_N = GROUP_N, NODE_FIELDS = NODE_FIELDS,
  RETIRED_FIELDS = RETIRED_FIELDS,
  unit_rule = unit_rule, object_facts = object_facts, group_facts = group_facts,
  apply_rule = apply_rule, place_object = place_object, place_group = place_group,
  place_unit_of = place_unit_of, unit_state = unit_state, group_draining = group_draining,
  being_evicted = being_evicted, extend_lease = extend_lease, plain_lease = plain_lease, plain_lease_now = plain_lease_now, lease_group = lease_group, group_tiers = group_tiers, lease_of = lease_of, keep_lease = keep_lease, flush_rescore = flush_rescore,
  MAX_NODE_GROUPS = MAX_NODE_GROUPS, MAX_GROUP_NODES = MAX_GROUP_NODES, indexed_room = indexed_room,
  join_indexed = join_indexed, leave_indexed = leave_indexed, indexed_members = indexed_members,
  place_group_nodes = place_group_nodes, node_retention = node_retention,
  join_group = join_group, group_member_completed = group_member_completed,
  retire_group = retire_group, leave_group = leave_group, drop_object = drop_object,
  forget_offload_evict = forget_offload_evict,
  delete_object = delete_object, end_guarantee = end_guarantee, renew_guarantee = renew_guarantee,
  sweep_guarantees = sweep_guarantees, sweep_deadlines = sweep_deadlines,
}
