--[[ Move an existing item to a new ready time, keeping its envelope.
Input:
  KEYS[1..7] the shard's keys (see includes/common.lua)
  ARGV[1] id
  ARGV[2] new ready ms
  ARGV[3] wake channel
Output: 1 if it was there, else 0. Attempts start again and a lease on it is dropped, so a
late ack won't delete it. ]]
--- @include "common"
if rcall('HEXISTS', KEYS[2], ARGV[1]) == 0 then return 0 end
local before = head_score()
rcall('ZADD', KEYS[1], ARGV[2], ARGV[1])
rcall('HDEL', KEYS[3], ARGV[1])
rcall('HDEL', KEYS[4], ARGV[1])
wake_if_earlier(ARGV[3], before)
return 1
