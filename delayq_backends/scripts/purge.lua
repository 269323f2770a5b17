#!lua flags=allow-oom
--[[ Delete dead letters for good.
Input:
  KEYS[1] dead, KEYS[2] dead_items, KEYS[3] dead_info (see includes/bury.lua)
  ARGV[1] "all" (the shard's ARGV[2] oldest dead letters) or "ids" (those in ARGV[2..])
  ARGV[2..] ids
Output: how many were deleted. At most MAX_DEAD letters per call, whatever the caller asks (ids
past it are left): the caller pages (store.purge_dead, DEAD_CHUNK a call), so no call holds the
server for long, and any user allowed to call this function cannot make one that does.
allow-oom: deleting frees memory. ]]
local rcall = redis.call
-- Must be >= reader.DEAD_CHUNK.
local MAX_DEAD = 1000
local dead, dead_items, dead_info = KEYS[1], KEYS[2], KEYS[3]
local ids = {}
for i = 2, math.min(#ARGV, MAX_DEAD + 1) do ids[#ids + 1] = ARGV[i] end
if ARGV[1] == 'all' then
  local count = math.min(tonumber(ARGV[2]) or 0, MAX_DEAD)
  ids = count >= 1 and rcall('ZRANGE', dead, 0, count - 1) or {}
end
local n = 0
for _, id in ipairs(ids) do
  n = n + rcall('ZREM', dead, id)
  rcall('HDEL', dead_items, id)
  rcall('HDEL', dead_info, id)
end
return n
