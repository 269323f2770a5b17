--[[ Delete dead letters for good.
Input:
  KEYS[1..8] the shard's keys (see includes/common.lua)
  ARGV[1] "all" (every dead letter of the shard) or "ids" (those in ARGV[2..])
  ARGV[2..] ids
Output: how many were deleted. ]]
--- @include "common"
local ids = {}
for i = 2, #ARGV do ids[#ids + 1] = ARGV[i] end
if ARGV[1] == 'all' then ids = rcall('ZRANGE', KEYS[5], 0, -1) end
local n = 0
for _, id in ipairs(ids) do
  n = n + rcall('ZREM', KEYS[5], id)
  rcall('HDEL', KEYS[6], id)
  rcall('HDEL', KEYS[7], id)
end
return n
