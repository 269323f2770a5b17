#!lua flags=allow-oom
--[[ A forwarder's re-check of parked items (see includes/parking.lua) whose time to look again
has come: those it can release now go back to the due index, due at their ready time (past: a
claim takes them at once, beside items as old); the others are looked
at again later. The caller read their reasons (ZRANGEBYSCORE parked, HMGET parked_why) and
decided; this moves only items still parked, so a stale entry is dropped whatever it says.
Input:
  KEYS[1] due, KEYS[2] leased, KEYS[3] ranked, KEYS[4] parked, KEYS[5] parked_why
  ARGV[1] clock override ms ("0": server TIME)
  ARGV[2] wake channel
  ARGV[3] when to look again at the items kept parked, ms
  ARGV[4] how many ids follow to release; then those ids, then the ids to keep parked
Output: {released, kept parked, stale entries dropped}.
A released item keeps its original ready time (its leased entry "<ready>:deferred:<ready>", as
defer.lua writes it): the claim that takes it measures its lateness truthfully. Publishes a
wake-up when the shard's head became earlier. allow-oom: releasing must work in a full store. ]]
--- @include "ranks"
--- @include "wake"
--- @include "parking"
local due, leased, ranked, parked, why = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local now = ms(now_ms(ARGV[1]))
local later = ARGV[3]
local releasing = tonumber(ARGV[4]) or 0
local before = head_score(due)
local released, kept, stale = 0, 0, 0
for i = 5, #ARGV do
  local id = ARGV[i]
  local held = is_parked(due, id) and rcall('HGET', leased, id)
  local ready = held and string.match(held, '^%-?%d+:deferred:(%-?%d+)$')
  if not ready then
    -- gone, moved since it was parked, or its leased entry rewritten: no longer parked
    rcall('ZREM', parked, id)
    rcall('HDEL', why, id)
    stale = stale + 1
  elseif i - 4 <= releasing then
    local rank = rank_of(ranked, id)
    local at = ms(math.min(tonumber(ready), tonumber(now)))  -- due since its ready time: claimed in that order
    rcall('ZADD', due, 'XX', at, id)
    rcall('HSET', leased, id, at .. ':deferred:' .. ready)
    if rank > 0 then set_rank(ranked, id, rank, tonumber(at)) end
    rcall('ZREM', parked, id)
    rcall('HDEL', why, id)
    released = released + 1
  else
    rcall('ZADD', parked, 'XX', later, id)
    kept = kept + 1
  end
end
if released > 0 then wake_if_earlier(due, ARGV[2], before) end
return {released, kept, stale}
