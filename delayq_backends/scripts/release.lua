#!lua flags=allow-oom
--[[ Give back leased items that were not published, at their original ready time, without
counting the attempt (graceful shutdown, broker outage).
Input:
  KEYS[1] due, KEYS[2] tries, KEYS[3] leased
  ARGV[1] our lease, "<deadline>:<token>" of the claim
  ARGV[2] wake channel
  ARGV[3..] ids
Output: how many were released. allow-oom: a full store must be able to give items back. ]]
--- @include "lease"
--- @include "wake"
local due, tries, leased = KEYS[1], KEYS[2], KEYS[3]
local before = head_score(due)
local n = 0
for i = 3, #ARGV do
  local id = ARGV[i]
  local ready = our_lease(leased, id, ARGV[1])
  if ready then
    rcall('ZADD', due, ready, id)
    rcall('HDEL', leased, id)
    uncount(tries, id)
    n = n + 1
  end
end
wake_if_earlier(due, ARGV[2], before)
return n
