#!lua flags=allow-oom
--[[ Remove a scheduled item, leased or not.
Input:
  KEYS[1] due, KEYS[2] items, KEYS[3] tries, KEYS[4] leased (see includes/lease.lua)
  ARGV[1] id
Output: 1 if it was removed, 2 if it was removed while leased to a forwarder (it may be
delivered anyway: the forwarder may have published it already), else 0.
allow-oom: removing frees memory. ]]
--- @include "lease"
local k = {due = KEYS[1], items = KEYS[2], tries = KEYS[3], leased = KEYS[4]}
if rcall('HEXISTS', k.items, ARGV[1]) == 0 and not rcall('ZSCORE', k.due, ARGV[1]) then return 0 end
local leased = rcall('HGET', k.leased, ARGV[1])
forget(k, ARGV[1])
if leased and not string.find(leased, ':deferred:', 1, true) then return 2 end
return 1
