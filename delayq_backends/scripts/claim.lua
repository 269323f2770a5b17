#!lua flags=allow-oom
--[[ Lease up to ARGV[1] due items of one shard: ranked items first (highest rank first, then
earliest), then the rest earliest first.
Input:
  KEYS[1] due, KEYS[2] items, KEYS[3] tries, KEYS[4] leased, KEYS[5] dead, KEYS[6] dead_items,
  KEYS[7] dead_info, KEYS[8] ranked (see includes/lease.lua, bury.lua, ranks.lua)
  ARGV[1] limit, at most MAX_CLAIM (a caller's bigger number is cut to it: any user allowed to
          call this script could otherwise hold the server for as long as the shard is big)
  ARGV[2] lease ms
  ARGV[3] max attempts: an item claimed more often goes to the dead letters instead
  ARGV[4] clock override ms ("0": server TIME, one clock for every forwarder)
  ARGV[5] claim token, unique per claim: the lease is "<deadline>:<token>", so two claims
          that happen to share a deadline (different lease lengths) never share a lease
  ARGV[6] most dead letters kept per shard (0: no cap), ARGV[7] dead-letter expiry ms (0: none)
  ARGV[8] max_payload_bytes: a bigger envelope (a producer that skipped the check, or a hand
          write) is buried with its size instead of sent to the forwarder ("0" or absent: no cap)
Output: {deadline, id, envelope, attempts, ready ms, id, envelope, ...}
A leased item's score becomes its deadline: if it is not acked by then, it is due again.
An item whose stored values are unusable (see defect() in includes/checks.lua) is buried with
the reason instead of leased; the rest of the batch is claimed as usual. allow-oom: a store at
maxmemory must still drain, and a claim adds next to nothing.

Cost: O((R + 1) log N + limit + S) for R ranks present in the shard's index and S stale index
entries met, in a few commands per batch: the plain due ids are read with one ZRANGEBYSCORE and
one HMGET per hash (none of leased or tries while they are empty), and leased with one ZADD XX
and two HSETs (into hashtables from 32 items on: see hset_many in includes/batch.lua). With no ranked item, the index is one lookup of a missing key. A stale entry is met
once (its item is gone: removed; or not due and not leased: moved to the item's score), except
while its item is leased (at most the shard's in-flight ranked items), where it stays so a
release or an expired lease finds it again at its ready time. A deferred item is not leased:
its entry moves to its not-before time (defer.lua does so itself; entries written before it
did are moved here, once each), so deferred items cost a claim nothing. ]]
--- @include "checks"
--- @include "bury"
--- @include "batch"
local k = {
  due = KEYS[1], items = KEYS[2], tries = KEYS[3], leased = KEYS[4],
  dead = KEYS[5], dead_items = KEYS[6], dead_info = KEYS[7], ranked = KEYS[8],
}
-- Must match forwarder.MAX_BATCH.
local MAX_CLAIM = 10000
local bad_types, sizes = check_types(k)
if bad_types then return bad_types end
-- leased and tries while they are still empty (no forwarder holds an item of the shard, and this
-- claim has written none yet): take() reads nothing from them instead of a false per id.
local empty = {[k.leased] = sizes.leased == 0, [k.tries] = sizes.tries == 0}
local now = now_ms(ARGV[4])
local deadline = ms(now + tonumber(ARGV[2]))
local lease = deadline .. ':' .. ARGV[5]
local held_by = lease .. ':'  -- a lease entry: held_by .. ready
local max_attempts = tonumber(ARGV[3])
local budget = math.min(tonumber(ARGV[1]) or 0, MAX_CLAIM)
local max_bytes = tonumber(ARGV[8]) or 0
local out = {deadline}

-- Lease the due ids (or bury them), spending one unit of the budget each. scores holds each
-- id's score in `due` (its ready time unless it sat under an expired lease). The whole batch is
-- read with one HMGET per hash and written with one variadic command per key; an item whose
-- stored values are unusable, or that is out of attempts, is buried alone with the reason.
local function take(ids, scores)
  local n = #ids
  if n == 0 then return end
  budget = budget - n
  local envelopes = hmget(k.items, ids)
  local helds = empty[k.leased] and {} or hmget(k.leased, ids)
  local tries = empty[k.tries] and {} or hmget(k.tries, ids)
  local deadlines, leases, counts = {}, {}, {}
  local m, o = 0, #out  -- counters, not #t: a length is a search on each read
  for i = 1, n do
    local id, envelope, held, count = ids[i], envelopes[i], helds[i], tries[i]
    local ready = held and string.match(held, ':(%-?%d+)$') or scores[i]
    local wrong = defect(id, envelope, held, count, ready)
    if not wrong and max_bytes > 0 and #envelope > max_bytes then  -- #: the length Lua keeps, O(1)
      wrong = 'its envelope is ' .. #envelope .. ' bytes, over max_payload_bytes=' .. max_bytes ..
        ': store large data elsewhere and schedule a reference to it'
    end
    if wrong then
      bury(k, id, envelope, ready, whole(count) or 0, 'not delivered: ' .. wrong, now, ARGV[6], ARGV[7])
    else
      local attempts = count and whole(count) + 1 or 1  -- defect() found a tries entry whole
      if attempts > max_attempts then
        bury(k, id, envelope, ready, attempts,
          'claimed ' .. attempts .. ' times without an ack: forwarders crashed or timed out on it', now, ARGV[6], ARGV[7])
      else
        ready = ms(finite(ready))
        deadlines[m + 1], deadlines[m + 2] = deadline, id
        leases[m + 1], leases[m + 2] = id, held_by .. ready
        counts[m + 1], counts[m + 2] = id, attempts == 1 and '1' or ms(attempts)  -- 1: no format
        out[o + 1], out[o + 2], out[o + 3], out[o + 4] = id, envelope, attempts, ready
        m, o = m + 2, o + 4
      end
    end
  end
  variadic('ZADD', k.due, deadlines, 'XX')
  hset_many(k.leased, leases)
  hset_many(k.tries, counts)
  empty[k.leased], empty[k.tries] = false, false
end

-- Claim the due entries of one rank's band, in index order; returns when the band has no more
-- due entries or the budget is spent. `kept` counts the entries of the window that stay in it
-- (leased ones), so the next page starts after them.
local function claim_band(low)
  local kept = 0
  while budget > 0 do
    local ids = rcall('ZRANGEBYSCORE', k.ranked, ms(low), ms(low + now), 'LIMIT', kept, budget)
    if #ids == 0 then return end
    for _, id in ipairs(ids) do
      local score = rcall('ZSCORE', k.due, id)
      local held = score and rcall('HGET', k.leased, id)
      if not score then
        rcall('ZREM', k.ranked, id)  -- the item is gone (acked, cancelled, buried)
      elseif tonumber(score) <= now then
        take({id}, {score})
        if rcall('ZSCORE', k.ranked, id) then kept = kept + 1 end  -- leased, not buried
      elseif held and not string.find(held, ':deferred:', 1, true) then
        kept = kept + 1  -- leased: back at its ready time if released or the lease expires
      else
        -- not due yet (a deferred item: its not-before time): moved later
        rcall('ZADD', k.ranked, ms(low + math.min(tonumber(score), RANK_SPAN - 1)), id)
      end
    end
  end
end

-- Visit each band present in the index, highest rank first: one lookup finds the next. Scores
-- pass through ms(): a Lua number given to redis.call prints with 14 digits only.
local low = 0
while budget > 0 do
  local first = rcall('ZRANGEBYSCORE', k.ranked, ms(low), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if #first == 0 then break end
  local score = finite(first[2])
  if not score or score >= band_of(0) then
    rcall('ZREM', k.ranked, first[1])  -- a hand-written entry outside every band: not an index entry
  else
    low = math.floor(score / RANK_SPAN) * RANK_SPAN
    claim_band(low)
    low = low + RANK_SPAN
  end
end

if budget > 0 then
  local ids, scores = {}, {}
  local due = rcall('ZRANGEBYSCORE', k.due, '-inf', ms(now), 'WITHSCORES', 'LIMIT', 0, budget)
  for i = 1, #due, 2 do
    local j = (i + 1) / 2
    ids[j], scores[j] = due[i], due[i + 1]
  end
  take(ids, scores)
end
return out
