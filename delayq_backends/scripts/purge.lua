--[[ Delete dead letters for good.
Input:
  KEYS[1..7] the shard's keys (see includes/common.lua)
  ARGV[1..] ids ("*" alone: every dead letter of the shard)
Output: how many were deleted. ]]
--- @include "common"
local ids = {}
for i = 1, #ARGV do ids[#ids + 1] = ARGV[i] end
if ids[1] == '*' then ids = rcall('ZRANGE', KEYS[5], 0, -1) end
local n = 0
for _, id in ipairs(ids) do
  n = n + rcall('ZREM', KEYS[5], id)
  rcall('HDEL', KEYS[6], id)
  rcall('HDEL', KEYS[7], id)
end
return n
