#!lua flags=allow-oom
--[[ Park leased items this forwarder cannot release (see includes/parking.lua): out of the due
index, so no claim reads them again until a forwarder's re-check (unpark.lua) at ARGV[2].
Input:
  KEYS[1] due, KEYS[2] tries, KEYS[3] leased, KEYS[4] ranked, KEYS[5] parked, KEYS[6] parked_why
  ARGV[1] our lease, "<deadline>:<token>" of the claim
  ARGV[2] when to look again, ms
  ARGV[3..] pairs: id, reason ("format:<n>", "target:<kind>")
Output: {how many were parked, the parking key that holds another type or ""}.
The attempt is not counted, and the original ready time is kept (lateness stays truthful).
When `parked` or `parked_why` holds another type (a hand write), the items are deferred to
ARGV[2] instead (as defer.lua does: still in the due index, but not claimed before then) and
the key is named, so the forwarder says how to fix it and the line goes on. allow-oom: giving
items back must work in a full store. ]]
--- @include "lease"
--- @include "ranks"
--- @include "parking"
local due, tries, leased, ranked, parked, why = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local later = ARGV[2]
local bad = wrong_type({{parked, 'zset'}, {why, 'hash'}})
local at = bad and later or ms(PARKED_MS)  -- the due score: parked, or deferred when parking cannot be written
local n = 0
for i = 3, #ARGV, 2 do
  local id, reason = ARGV[i], ARGV[i + 1]
  local ready = our_lease(leased, id, ARGV[1])
  if ready then
    local rank = rank_of(ranked, id)
    rcall('ZADD', due, at, id)
    rcall('HSET', leased, id, at .. ':deferred:' .. ready)
    if rank > 0 then set_rank(ranked, id, rank, at) end
    uncount(tries, id)
    if not bad then
      rcall('ZADD', parked, later, id)
      rcall('HSET', why, id, reason)
    end
    n = n + 1
  end
end
return {n, bad or ''}
