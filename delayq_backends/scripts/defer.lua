--[[ Give back leased items not before given times (flow control: a paused or rate-capped
queue), without counting the attempt and keeping each item's original ready time.
Input:
  KEYS[1..8] the shard's keys (see includes/common.lua)
  ARGV[1] our lease, "<deadline>:<token>" of the claim
  ARGV[2..] pairs: id, not-before ms
Output: how many were deferred.
The item's score becomes its not-before time, and its `leased` entry becomes
"<not-before>:deferred:<ready>": no claim token is "deferred", so no ack, release or fail
matches it, and claim.lua reads the original ready time from it as from any lease, so the
lateness measured at the final publish stays truthful. No wake-up: the new times lie ahead. ]]
--- @include "common"
local n = 0
for i = 2, #ARGV, 2 do
  local id, not_before = ARGV[i], ARGV[i + 1]
  local ready = our_lease(id, ARGV[1])
  if ready then
    rcall('ZADD', KEYS[1], not_before, id)
    rcall('HSET', KEYS[4], id, not_before .. ':deferred:' .. ready)
    if rcall('HINCRBY', KEYS[3], id, -1) <= 0 then rcall('HDEL', KEYS[3], id) end
    n = n + 1
  end
end
return n
