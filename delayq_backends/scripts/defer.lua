#!lua flags=allow-oom
--[[ Give back leased items not before given times (flow control: a paused or rate-capped
queue), without counting the attempt and keeping each item's original ready time.
Input:
  KEYS[1] due, KEYS[2] tries, KEYS[3] leased, KEYS[4] ranked
  ARGV[1] our lease, "<deadline>:<token>" of the claim
  ARGV[2..] pairs: id, not-before ms
Output: how many were deferred.
The item's score becomes its not-before time, and its `leased` entry becomes
"<not-before>:deferred:<ready>": no claim token is "deferred", so no ack, release or fail
matches it, and claim.lua reads the original ready time from it as from any lease, so the
lateness measured at the final publish stays truthful. No wake-up: the new times lie ahead.
A ranked item's index entry moves to the not-before time, so claims do not step over deferred
items (claim.lua). allow-oom: giving items back must work in a full store. ]]
--- @include "lease"
--- @include "ranks"
local due, tries, leased, ranked = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local n = 0
for i = 2, #ARGV, 2 do
  local id, not_before = ARGV[i], ARGV[i + 1]
  local ready = our_lease(leased, id, ARGV[1])
  if ready then
    rcall('ZADD', due, not_before, id)
    rcall('HSET', leased, id, not_before .. ':deferred:' .. ready)
    local rank = rank_of(ranked, id)
    if rank > 0 then set_rank(ranked, id, rank, not_before) end
    uncount(tries, id)
    n = n + 1
  end
end
return n
