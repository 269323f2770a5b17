--[[ Move an existing item to a new ready time, keeping its envelope and rank.
Input:
  KEYS[1..8] the shard's keys (see includes/common.lua)
  ARGV[1] id
  ARGV[2] new ready ms
  ARGV[3] wake channel
Output: 1 if it was moved, 2 if it is leased to a forwarder (in flight: it may be published
already, so it is left as it is rather than delivered now and again at the new time), else 0.
Attempts start again; a deferred item (defer.lua) is not in flight and moves. The ranked entry moves too: the claim's lazy cleanup can only
catch an entry that is *earlier* than its item, not one left later. ]]
--- @include "common"
if rcall('HEXISTS', KEYS[2], ARGV[1]) == 0 then return 0 end
local leased = rcall('HGET', KEYS[4], ARGV[1])
if leased and not string.find(leased, ':deferred:', 1, true) then return 2 end
local before = head_score()
rcall('ZADD', KEYS[1], ARGV[2], ARGV[1])
rcall('HDEL', KEYS[3], ARGV[1])
rcall('HDEL', KEYS[4], ARGV[1])
set_rank(ARGV[1], rank_of(ARGV[1]), ARGV[2])
wake_if_earlier(ARGV[3], before)
return 1
