#!lua flags=allow-oom
--[[ Release the heads of group lines of one shard into the due index, ahead of every other item
(see includes/glines.lua), up to each group's allowance: the forwarder's share of the group's
room (free slots) by weight. The claim that follows takes them first.
Input:
  KEYS[1] due, KEYS[2] leased, KEYS[3] ranked, KEYS[4] parked, KEYS[5] parked_why, KEYS[6] gready,
  KEYS[7..6+G] the lines of the G groups named
  ARGV[1] clock override ms ("0": server TIME)
  then per group 3 values: group key, allowance (most items to release), held until ms: when
          the group can take no more than its allowance (at its limit), the time to look again
          ("0": its room is not the bound, only this forwarder's share of the pass)
Output: {per group {released, due items still in its line, its gready score after the call
(-1: the line is empty, no entry)}, reset}: reset names the keys found holding another type (a
hand write, which holds no item): made to expire at once, and nothing released from them this
call (none at all when gready, parked or parked_why was one).
Only an item still parked for this group (its `due` score PARKED_MS, and its reason
"group:<key>" or none recorded: a producer's schedule records none) is released; other line entries (the item cancelled, rescheduled, replaced into another group)
are dropped, at most BUDGET per call. A released item's `due` score is its ready time minus
RELEASED_BIAS, its leased entry "<now>:deferred:<ready>" (the claim reads the true ready
time: lateness stays truthful), its rank's entry at the start of its band.
The group's gready becomes: no entry once its line is empty; "held until" while due items
remain and the group was bound by its room; now while due items remain; else its next head's
ready time. Cost: O((R + 1) log N + released) per group for R ranks present in its line, in a
few commands per batch of line heads (see release() below).
allow-oom: a line must drain a full store. ]]
--- @include "glines"
--- @include "batch"
local k = {
  due = KEYS[1], leased = KEYS[2], ranked = KEYS[3], parked = KEYS[4], parked_why = KEYS[5], gready = KEYS[6],
}
local now = now_ms(ARGV[1])
local BUDGET = 1000  -- most stale entries dropped per call
local budget = BUDGET
local out = {}

-- Whether the shard has parked items (a forwarder's refusals) and ranked ones: a line of a
-- producer's items alone then costs no read of those keys per item.
local has_parked = rcall('EXISTS', k.parked_why) == 1
local has_ranked = rcall('EXISTS', k.ranked) == 1

-- Release the line entries ids of group (read from line) that are still parked for it (no
-- other reason recorded): how many. A batch (at most CHUNK ids: unpack() takes no more) is read
-- with one ZMSCORE and one HMGET per hash and written with one variadic command per key; an
-- entry released or dropped leaves the line.
local function release(group, line, ids)
  local scores = rcall('ZMSCORE', k.due, unpack(ids))
  local whys = has_parked and hmget(k.parked_why, ids) or {}
  local helds = hmget(k.leased, ids)
  variadic('ZREM', line, ids)
  local due, leases, n = {}, {}, 0
  for i, id in ipairs(ids) do
    local recorded = whys[i]
    local held = finite(scores[i]) == PARKED_MS and (not recorded or recorded == 'group:' .. group) and helds[i]
    local ready = held and finite(string.match(held, '^%-?%d+:deferred:(%-?%d+)$'))
    if not ready then
      budget = budget - 1
    else
      local rank = has_ranked and rank_of(k.ranked, id) or 0
      due[2 * n + 1], due[2 * n + 2] = ms(ready - RELEASED_BIAS), id
      leases[2 * n + 1], leases[2 * n + 2] = id, ms(now) .. ':deferred:' .. ms(ready)
      n = n + 1
      if rank > 0 then set_rank(k.ranked, id, rank, 0) end
      if recorded then
        rcall('ZREM', k.parked, id)
        rcall('HDEL', k.parked_why, id)
      end
    end
  end
  variadic('ZADD', k.due, due, 'XX')
  hset_many(k.leased, leases)
  return n
end

local reset = {}
for _, key in ipairs({k.gready, k.parked, k.parked_why}) do
  if wrong_type({{key, key == k.parked_why and 'hash' or 'zset'}}) then
    rcall('PEXPIRE', key, 1)  -- a hand write holds no item: gone in a ms, and said
    reset[#reset + 1] = key
  end
end
if #reset > 0 then return {{}, table.concat(reset, ' ')} end
for i = 2, #ARGV, 3 do
  local group, allowance, held_until = ARGV[i], tonumber(ARGV[i + 1]) or 0, ARGV[i + 2]
  local line = KEYS[6 + (i + 1) / 3]
  local released, waiting, next_ready = 0, 0, nil
  local low = 0
  local bad = wrong_type({{line, 'zset'}})
  if bad then
    rcall('PEXPIRE', line, 1)
    reset[#reset + 1] = line
  end
  while budget > 0 and not bad do  -- each band present, highest rank first: one lookup finds the next
    local first = rcall('ZRANGEBYSCORE', line, ms(low), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    if #first == 0 then break end
    local score = finite(first[2])
    if not score or score < 0 or score >= band_of(0) + RANK_SPAN then
      rcall('ZREM', line, first[1])  -- a hand-written entry outside every band
      budget = budget - 1
    else
      low = math.floor(score / RANK_SPAN) * RANK_SPAN
      while released < allowance and budget > 0 do
        local ids = rcall('ZRANGEBYSCORE', line, ms(low), ms(low + now), 'LIMIT', 0, math.min(allowance - released, CHUNK))
        if #ids == 0 then break end
        released = released + release(group, line, ids)
      end
      waiting = waiting + rcall('ZCOUNT', line, ms(low), ms(low + now))
      local head = rcall('ZRANGEBYSCORE', line, ms(low), ms(low + RANK_SPAN - 1), 'WITHSCORES', 'LIMIT', 0, 1)
      if #head > 0 then
        local ready = finite(head[2]) - low
        if not next_ready or ready < next_ready then next_ready = ready end
      end
      low = low + RANK_SPAN
    end
  end
  local at
  if bad or rcall('EXISTS', line) == 0 then
    rcall('ZREM', k.gready, group)
    at = -1
  else
    if waiting > 0 then
      at = tonumber(held_until) > 0 and tonumber(held_until) or now
    else
      at = math.max(next_ready or now, now)
    end
    rcall('ZADD', k.gready, ms(at), group)
  end
  out[#out + 1] = {released, waiting, at}
end
return {out, table.concat(reset, ' ')}
