#!lua flags=allow-oom
--[[ Delete dead letters for good.
Input:
  KEYS[1] dead, KEYS[2] dead_items, KEYS[3] dead_info (see includes/bury.lua)
  ARGV[1] "all" (the shard's ARGV[2] oldest dead letters) or "ids" (those in ARGV[2..])
  ARGV[2..] ids
Output: how many were deleted. The caller pages through "all" (store.purge_dead), so no call
holds the server for long. allow-oom: deleting frees memory. ]]
local rcall = redis.call
local dead, dead_items, dead_info = KEYS[1], KEYS[2], KEYS[3]
local ids = {}
for i = 2, #ARGV do ids[#ids + 1] = ARGV[i] end
if ARGV[1] == 'all' then ids = rcall('ZRANGE', dead, 0, tonumber(ARGV[2]) - 1) end
local n = 0
for _, id in ipairs(ids) do
  n = n + rcall('ZREM', dead, id)
  rcall('HDEL', dead_items, id)
  rcall('HDEL', dead_info, id)
end
return n
