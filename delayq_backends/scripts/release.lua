#!lua flags=allow-oom
--[[ Give back leased items that were not published, at their original ready time, without
counting the attempt (graceful shutdown, broker outage).
Input:
  KEYS[1..8] the shard's keys (see includes/common.lua)
  ARGV[1] our lease, "<deadline>:<token>" of the claim
  ARGV[2] wake channel
  ARGV[3..] ids
Output: how many were released. allow-oom: a full store must be able to give items back. ]]
--- @include "common"
local before = head_score()
local n = 0
for i = 3, #ARGV do
  local id = ARGV[i]
  local ready = our_lease(id, ARGV[1])
  if ready then
    rcall('ZADD', KEYS[1], ready, id)
    rcall('HDEL', KEYS[4], id)
    uncount(id)
    n = n + 1
  end
end
wake_if_earlier(ARGV[2], before)
return n
