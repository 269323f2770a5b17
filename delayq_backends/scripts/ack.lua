#!lua flags=allow-oom
--[[ Delete delivered items, but only those still under our lease.
Input:
  KEYS[1..8] the shard's keys (see includes/common.lua)
  ARGV[1] our lease, "<deadline>:<token>" of the claim
  ARGV[2..] ids
Output: how many were deleted. An id cancelled, rescheduled or re-claimed since our claim
no longer carries our lease and is left alone. allow-oom: acks are how a full store drains. ]]
--- @include "common"
local n = 0
for i = 2, #ARGV do
  if our_lease(ARGV[i], ARGV[1]) then
    forget(ARGV[i])
    n = n + 1
  end
end
return n
