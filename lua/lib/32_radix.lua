-- The radix index (MasterConfig.enable_radix_tree). A node is a prefix hash of one tenant, kept
-- on the shard its hash routes to, with its keys (all of them live on that shard):
--   P:rnode:<tenant>:<hash>  hash: created (ms), parent, parent_shard (absent for a root),
--                            link_pending (seq of a link to a parent on another shard not yet
--                            delivered), and the composite unit's counters (members,
--                            processing, hard_pinned, lease_until, task_refs, draining: 30_units)
--                            and its keys, one field each (lua/lib/22_members.lua; their objects
--                            carry `node`, where the hash sits in the key)
--                            and kid / kid_seq: its first child and the seq of that link, when
--                            the call that created the node linked it (a chain put in one batch)
--   P:rkids:<tenant>:<hash>  zset child hash -> seq of the link that added it: its other children
--   P:routbox                zset entry -> ms written: deferred halves of cross-shard steps
-- The node's keys are one eviction unit, "r:<tenant>:<hash>" (evicted all together, ranked by
-- the latest lease of its keys); unit_rule protects a node with a live child ('has_children'),
-- so eviction takes leaves first and a parent becomes a candidate when its last child goes.
--
-- A link or unlink of a child on shard A with its parent on shard B: when A == B it is applied
-- in the same call; otherwise A's call writes its own half plus an outbox entry
--   "<op> <seq> <parent shard> <tenant> <#parent> <parent><child>"
-- which a drainer (workers, the putting or evicting client) applies on B (mc_radix_apply), then
-- acknowledges on A (mc_radix_ack). seq comes from A's counter P.radix_seq, so every step about
-- one child is ordered: a link applies unless the parent already holds a later one, an unlink
-- only removes a link older than itself. Replays are harmless, and a lost or reordered step
-- leaves at worst a parent listing a child that is gone (a phantom), which reconciliation
-- removes; never a live child its parent does not list, because a child's keys cannot complete
-- (put_end: RADIX_LINK_PENDING) while its link is still in the outbox.

local K, E, S, int_arg, valid_name = Base.K, Base.E, Base.S, Base.int_arg, Base.valid_name
local tonumber_, sub_, match_ -- (bound at the first call: Base.on_first_call)
Base.on_first_call(function() tonumber_, sub_, match_ = tonumber, string.sub, string.match end)
local RADIX_MARK = Object.RADIX_MARK
local unplace_composite, place_group, MEMO_FIELD = Units.unplace_composite, Units.place_group, Units.MEMO_FIELD
local place_protected, GROUP_N, NODE_FIELDS = Units.place_protected, Units.GROUP_N, Units.NODE_FIELDS
local RETIRED_FIELDS, group_facts, unit_rule = Units.RETIRED_FIELDS, Units.group_facts, Units.unit_rule
local apply_composite, TIER_LEVEL = Units.apply_composite, Units.TIER_LEVEL
local fresh_node, new_node, unfresh = Units.fresh_node, Units.new_node, Units.unfresh

-- A node's record as radix_settle reads it (NODE_FIELDS): its unit's fields (members 1,
-- draining 6, the memo N), then its own (kid N + 1, parent N + 2, parent_shard, link_pending,
-- created N + 5). (CALL also holds the eviction's note: Evict.evict_unit.)
local N = GROUP_N

local MAX_CASCADE = 32 -- same-shard unlinks one call follows up the tree; the rest go to the outbox

local function rnode_key(P, tenant, h) return P .. K.radix_node .. tenant .. ':' .. h end
local function rkids_key(P, tenant, h) return P .. K.radix_kids .. tenant .. ':' .. h end
local function radix_group(h) return RADIX_MARK .. h end
local function radix_unit(tenant, h) return 'r:' .. tenant .. ':' .. h end
local shard_index = Base.shard_number -- (memoised per shard key: a match is three new strings)
local CALL = Base.CALL
-- The next seq of the shard, for an outbox entry.
local function radix_seq(P)
  CALL.link_seq = nil -- a link after this entry must be newer than it
  return redis.call('HINCRBY', P, 'radix_seq', 1)
end
-- The seq of a link applied at once (its parent on this shard). Such links of one call share
-- one seq, newer than every step written before them: a probe (mc_radix_probe) sees the whole
-- call or none of it, and a call's outbox entry makes its next link take a seq of its own.
local function link_seq(P)
  local seq = CALL.link_seq
  if not seq then
    seq = radix_seq(P)
    CALL.link_seq = seq
  end
  return seq
end

local function outbox_entry(op, seq, pshard, tenant, ph, h)
  return op .. ' ' .. S(seq) .. ' ' .. S(pshard) .. ' ' .. tenant .. ' ' .. S(#ph) .. ' ' .. ph .. h
end

-- op, seq, parent shard, tenant, parent, child of an outbox entry (nil when malformed).
local function parse_outbox_entry(e)
  local op, seq, pshard, tenant, plen, rest = match_(e, '^(%l+) (%d+) (%d+) ([^ ]+) (%d+) (.*)$')
  if not op or (op ~= 'link' and op ~= 'unlink') then return nil end
  plen = tonumber_(plen)
  if plen < 1 or #rest <= plen then return nil end
  return op, tonumber_(seq), tonumber_(pshard), tenant, sub_(rest, 1, plen), sub_(rest, plen + 1)
end

local radix_settle -- (defined below; radix_apply and it call each other)

-- The parent's half of a link or unlink, on the parent's shard. An unlink with no seq is the
-- child's own shard's, in the call that drops the child: whatever link the parent holds goes.
-- `at_once`: a link the child's shard makes in the same call (see below). A parent this call
-- created (a chain of pages put in one batch) lists its first child in its record (kid,
-- kid_seq): no zset of its own; any other child goes into P:rkids.
local function radix_apply(P, op, seq, tenant, ph, h, now, depth, at_once)
  local kids, nkey = rkids_key(P, tenant, ph), rnode_key(P, tenant, ph)
  if not seq then
    local rec = redis.call('HMGET', nkey, unpack(NODE_FIELDS)) -- (read once: radix_settle takes it)
    if rec[N + 1] == h then
      redis.call('HDEL', nkey, 'kid', 'kid_seq')
      rec[N + 1] = false
      radix_settle(P, tenant, ph, now, depth, rec)
    elseif redis.call('ZREM', kids, h) == 1 then
      radix_settle(P, tenant, ph, now, depth, rec)
    end
    return
  end
  if op == 'link' then
    if at_once and fresh_node(nkey) then -- a node this call created, childless: no read
      redis.call('HSET', nkey, 'kid', h, 'kid_seq', S(seq))
      unfresh(nkey) -- (a second child reads the record)
      return
    end
    local rec = redis.call('HMGET', nkey, 'created', 'draining', MEMO_FIELD, 'kid', 'kid_seq')
    if rec[4] == h then -- listed in the record: only its seq may move
      if (tonumber_(rec[5]) or 0) < seq then redis.call('HSET', nkey, 'kid_seq', S(seq)) end
      return
    end
    -- (a link made at once carries the newest seq of the child's shard, so no later step about
    -- the child can be listed: it needs no look first)
    local cur = not at_once and tonumber_(redis.call('ZSCORE', kids, h))
    if cur and cur >= seq then return end
    if redis.call('ZADD', kids, S(seq), h) == 0 then return end -- (it was listed: only its seq moved)
    if not rec[1] then -- a parent not known yet starts as a shell (no entries)
      redis.call('HSET', nkey, 'created', S(now), MEMO_FIELD, '')
      rec[3] = ''
    end
    -- with a child the parent is no candidate: its entries go
    place_protected(P, nkey, radix_unit(tenant, ph), rec[3] or nil, rec[2] == '1', now)
    return
  end
  local rec = redis.call('HMGET', nkey, 'kid', 'kid_seq')
  if rec[1] == h then
    if (tonumber_(rec[2]) or 0) <= seq then
      redis.call('HDEL', nkey, 'kid', 'kid_seq')
      radix_settle(P, tenant, ph, now, depth)
    end
    return
  end
  local cur = tonumber_(redis.call('ZSCORE', kids, h))
  if cur and cur <= seq then
    redis.call('ZREM', kids, h)
    radix_settle(P, tenant, ph, now, depth)
  end
end

-- The children of node h: the one its record lists, then its zset's.
local function children_of(P, tenant, h)
  local out = redis.call('ZRANGE', rkids_key(P, tenant, h), 0, -1)
  local kid = redis.call('HGET', rnode_key(P, tenant, h), 'kid')
  if kid then
    for i = #out, 1, -1 do out[i + 1] = out[i] end
    out[1] = kid
  end
  return out
end

-- Tell the parent (here or on its shard) that child h is gone.
-- (An unlink applied at once needs no seq: no later step about the child can be pending.)
local function radix_unlink_up(P, tenant, h, ph, pshard, now, depth)
  if pshard == shard_index(P) and depth < MAX_CASCADE then
    radix_apply(P, 'unlink', nil, tenant, ph, h, now, depth + 1)
  else
    local seq = radix_seq(P)
    redis.call('ZADD', P .. K.radix_outbox, S(now), outbox_entry('unlink', seq, pshard, tenant, ph, h))
  end
end

-- Tell the parent that child h exists: at once on the same shard, else through the outbox (the
-- child's keys cannot complete until the entry is acknowledged). Returns the seq of a link left
-- in the outbox (the child's record must say link_pending = seq), else nil.
local function radix_link(P, tenant, h, ph, pshard, now)
  if pshard == shard_index(P) then
    radix_apply(P, 'link', link_seq(P), tenant, ph, h, now, 0, true)
    return nil
  end
  local seq = radix_seq(P)
  redis.call('ZADD', P .. K.radix_outbox, S(now), outbox_entry('link', seq, pshard, tenant, ph, h))
  return seq
end

-- Node h is gone (its record deleted, its unit unplaced): its parent forgets it (`parent`,
-- `pshard`, `link_pending` as its record held them).
local function node_dropped(P, tenant, h, parent, pshard, link_pending, now, depth)
  if not parent then return end
  pshard = tonumber_(pshard) or shard_index(P)
  if link_pending then -- its link never reached the parent: take it back
    redis.call('ZREM', P .. K.radix_outbox, outbox_entry('link', tonumber_(link_pending), pshard, tenant, parent, h))
  end
  radix_unlink_up(P, tenant, h, parent, pshard, now, depth)
end

-- An eviction step's placement left pending (CALL.placed.pending, see place_node) is written:
-- the step picks another unit next, places another node, or ends (a ledger's end: at_end).
local function flush_placed(P)
  local p = CALL.placed
  if not (p and p.pending) then return end
  p.pending = nil
  p.f.at = apply_composite(P, p.gkey, p.unit, p.entries, p.now, p.f.at)
end
Ledger.at_end(flush_placed)

-- The one tier a unit's entries name, when they name nothing else (nil otherwise).
local function sole_tier(entries)
  local tier = next(entries)
  if tier == nil or next(entries, tier) ~= nil or not TIER_LEVEL[tier] then return nil end
  return tier
end

-- Place node h's unit (`rec`, `kids`: its record and child count as read). Within an eviction
-- step (CALL.noting) the node is noted for the next eviction, which is often of it (its last
-- child just went: Evict.evict_unit); within mc_evict's loop (noting == 'defer') a node whose
-- one entry is a tier's is not written at all yet: the step's next pick weighs it against the
-- tier's head (Evict.next_candidate), so a node evicted next costs no ZADD, HSET and ZREM.
local function place_node(P, tenant, h, nkey, now, rec, kids)
  local unit = radix_unit(tenant, h)
  if CALL.noting == 'defer' then
    local f = group_facts(P, tenant, radix_group(h), rec, kids)
    local _, entries = unit_rule(f, now)
    local tier = sole_tier(entries)
    flush_placed(P)
    if tier then
      CALL.placed = { unit = unit, f = f, pending = true, gkey = nkey, entries = entries, now = now, tier = tier,
        score = entries[tier] }
      return
    end
    f.at = apply_composite(P, nkey, unit, entries, now, f.at)
    CALL.placed = { unit = unit, f = f }
    return
  end
  local f = place_group(P, tenant, radix_group(h), now, false, rec, kids)
  if CALL.noting then CALL.placed = { unit = unit, f = f } end
end

-- Node h's keys or children changed: a node with neither goes (and its parent forgets it);
-- otherwise its unit is placed as the rule says.
-- (`rec`: its NODE_FIELDS as read in this call, if still current.)
radix_settle = function(P, tenant, h, now, depth, rec)
  local nkey = rnode_key(P, tenant, h)
  unfresh(nkey)
  rec = rec or redis.call('HMGET', nkey, unpack(NODE_FIELDS))
  local kids = rec[N + 1] and 1 or redis.call('ZCARD', rkids_key(P, tenant, h))
  if not rec[N + 5] and not rec[1] then return end -- no such node
  if (tonumber_(rec[1]) or 0) > 0 or rec[6] == '1' or kids > 0 then
    return place_node(P, tenant, h, nkey, now, rec, kids)
  end
  redis.call('DEL', nkey)
  unplace_composite(P, radix_unit(tenant, h), rec[N] or nil)
  node_dropped(P, tenant, h, rec[N + 2], rec[N + 3], rec[N + 4], now, depth or 0)
end

-- Node h's keys are gone (retire_group, lua/lib/30_units.lua, with `gone`: the keys that go
-- with them, and `members`: those still in its record): its unit is unplaced; it stays, without
-- its unit's counters and members, while it has children, else it goes.
local function node_retired(P, tenant, h, now, gone, f, members)
  local nkey = rnode_key(P, tenant, h)
  unfresh(nkey)
  if not (f and f.node) then -- (facts read with the node's fields, in this call, serve as they are)
    local rec = redis.call('HMGET', nkey, MEMO_FIELD, 'parent', 'parent_shard', 'link_pending', 'kid')
    f = { at = rec[1] or nil, parent = rec[2] or nil, parent_shard = rec[3] or nil, link_pending = rec[4] or nil,
      children = rec[5] and 1 or redis.call('ZCARD', rkids_key(P, tenant, h)) }
  end
  unplace_composite(P, radix_unit(tenant, h), f.at)
  if f.children > 0 then
    if #gone > 0 then redis.call('DEL', unpack(gone)) end
    local fields = RETIRED_FIELDS
    if members and #members > 0 then
      fields = { unpack(RETIRED_FIELDS) }
      for i = 1, #members do fields[#fields + 1] = members[i] end
    end
    redis.call('HDEL', nkey, unpack(fields))
    return
  end
  gone[#gone + 1] = nkey
  redis.call('DEL', unpack(gone))
  node_dropped(P, tenant, h, f.parent, f.parent_shard, f.link_pending, now, 0)
end

-- Checks for registering key(s) under node h with parent ph (nil: none) before anything is
-- written: an error code, or nil and the node's record as read ({created, parent, draining,
-- memo}), which radix_register and radix_hold take while nothing else has written the node.
local function radix_check(P, tenant, h, ph, pshard, shards)
  if not valid_name(h, 256) then return E.INVALID_PARAMS end
  if ph and (not valid_name(ph, 256) or ph == h or not pshard or pshard >= shards) then return E.INVALID_PARAMS end
  local rec = redis.call('HMGET', rnode_key(P, tenant, h), 'created', 'parent', 'draining', MEMO_FIELD)
  if ph and rec[2] and rec[2] ~= ph then return E.INVALID_PARAMS end -- a chained hash has one parent
  return nil, rec
end

-- Register node h (created as needed) under parent ph; run radix_check first (`rec`: its
-- record as read, if still current; nil: read it again). True when it created the node, but with
-- `defer` a new node's record is not written: its field/value pairs are returned instead, for
-- the caller to write with its first key's counters (put_start: Units.join_group) or, when that
-- key is refused, before it settles the node. Nothing reads a node's record in between: a node
-- without keys or children is in no index and no eviction reaches it.
-- (One HMGET and at most one HSET of the node's record: this runs for every key a put indexes.)
local function radix_register(P, tenant, h, ph, pshard, now, rec, defer)
  local nkey = rnode_key(P, tenant, h)
  rec = rec or redis.call('HMGET', nkey, 'created', 'parent')
  local link = ph and not rec[2]
  local fields
  if not rec[1] then -- a new node: no keys yet, so no entries (its memo says so)
    fields = { 'created', S(now), MEMO_FIELD, '' }
  end
  if link then
    fields = fields or {}
    fields[#fields + 1], fields[#fields + 2], fields[#fields + 3], fields[#fields + 4] =
      'parent', ph, 'parent_shard', S(pshard)
    local pending = radix_link(P, tenant, h, ph, pshard, now)
    if pending then fields[#fields + 1], fields[#fields + 2] = 'link_pending', S(pending) end
  end
  if defer and not rec[1] then return fields end
  if fields then redis.call('HSET', nkey, unpack(fields)) end
  if not rec[1] then new_node(nkey) end
  return not rec[1]
end

-- A put into node h (not new: `at`, its memo as radix_check read it) is under way: the node is
-- no candidate from now on, so that the put's evict-on-put cannot evict the node it joins
-- (its counters and its link would go with it). A refused put re-places it (radix_settle).
local function radix_hold(P, tenant, h, at, now)
  place_protected(P, rnode_key(P, tenant, h), radix_unit(tenant, h), at, false, now)
end

-- The parent and shard of a row's optional fields parent / parent_shard ('' = none).
local function radix_parent_of(row)
  if row.parent == nil or row.parent == '' then return nil, nil end
  return row.parent, int_arg(row.parent_shard or '', 0, 16383)
end

return {
  rnode_key = rnode_key, rkids_key = rkids_key, radix_group = radix_group, radix_unit = radix_unit,
  shard_index = shard_index, parse_outbox_entry = parse_outbox_entry, radix_settle = radix_settle,
  radix_apply = radix_apply, node_retired = node_retired, radix_check = radix_check,
  radix_register = radix_register, radix_hold = radix_hold, radix_parent_of = radix_parent_of,
  flush_placed = flush_placed, children_of = children_of,
}
