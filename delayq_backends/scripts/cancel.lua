--[[ Remove a scheduled item, leased or not.
Input:
  KEYS[1..8] the shard's keys (see includes/common.lua)
  ARGV[1] id
Output: 1 if it was there, else 0. ]]
--- @include "common"
if rcall('HEXISTS', KEYS[2], ARGV[1]) == 0 and not rcall('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
forget(ARGV[1])
return 1
