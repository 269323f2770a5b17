#!lua flags=allow-oom
--[[ Delete delivered items, but only those still under our lease.
Input:
  KEYS[1] due, KEYS[2] items, KEYS[3] tries, KEYS[4] leased (see includes/lease.lua)
  ARGV[1] our lease, "<deadline>:<token>" of the claim
  ARGV[2..] ids
Output: how many were deleted. An id cancelled, rescheduled or re-claimed since our claim
no longer carries our lease and is left alone. allow-oom: acks are how a full store drains. ]]
--- @include "lease"
local k = {due = KEYS[1], items = KEYS[2], tries = KEYS[3], leased = KEYS[4]}
local n = 0
for i = 2, #ARGV do
  if our_lease(k.leased, ARGV[i], ARGV[1]) then
    forget(k, ARGV[i])
    n = n + 1
  end
end
return n
