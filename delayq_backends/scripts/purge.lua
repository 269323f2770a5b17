#!lua flags=allow-oom
--[[ Delete dead letters for good.
Input:
  KEYS[1..8] the shard's keys (see includes/common.lua)
  ARGV[1] "all" (the shard's ARGV[2] oldest dead letters) or "ids" (those in ARGV[2..])
  ARGV[2..] ids
Output: how many were deleted. The caller pages through "all" (store.purge_dead), so no call
holds the server for long. allow-oom: deleting frees memory. ]]
--- @include "common"
local ids = {}
for i = 2, #ARGV do ids[#ids + 1] = ARGV[i] end
if ARGV[1] == 'all' then ids = rcall('ZRANGE', KEYS[5], 0, tonumber(ARGV[2]) - 1) end
local n = 0
for _, id in ipairs(ids) do
  n = n + rcall('ZREM', KEYS[5], id)
  rcall('HDEL', KEYS[6], id)
  rcall('HDEL', KEYS[7], id)
end
return n
