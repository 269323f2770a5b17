#!lua flags=allow-oom
--[[ Remove a scheduled item, leased or not.
Input:
  KEYS[1..8] the shard's keys (see includes/common.lua)
  ARGV[1] id
Output: 1 if it was removed, 2 if it was removed while leased to a forwarder (it may be
delivered anyway: the forwarder may have published it already), else 0.
allow-oom: removing frees memory. ]]
--- @include "common"
if rcall('HEXISTS', KEYS[2], ARGV[1]) == 0 and not rcall('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
local leased = rcall('HGET', KEYS[4], ARGV[1])
forget(ARGV[1])
if leased and not string.find(leased, ':deferred:', 1, true) then return 2 end
return 1
