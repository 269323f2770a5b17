--[[ Move dead letters back into the schedule with fresh attempts.
Input:
  KEYS[1] due, KEYS[2] items, KEYS[3] dead, KEYS[4] dead_items, KEYS[5] dead_info, KEYS[6] ranked
  ARGV[1] ready ms
  ARGV[2] wake channel
  ARGV[3] "all" (a page of the shard's dead letters, oldest first: ARGV[4] offset, ARGV[5] count)
          or "ids" (those in ARGV[4..])
  ARGV[4..] ids
Output: {requeued, skipped, seen}: skipped = no envelope kept, or the id is scheduled again
already (it stays a dead letter); seen = dead letters of the page. The caller pages through
"all" (store.requeue_dead, DEAD_CHUNK a call); at most MAX_DEAD letters per call whatever the
caller asks (ids past it are left), so no call, a caller's own FCALL included, holds the server long.
An item keeps the rank it died with (recorded in dead_info; letters buried before ranks: 0). ]]
--- @include "ranks"
--- @include "wake"
local k = {
  due = KEYS[1], items = KEYS[2], dead = KEYS[3], dead_items = KEYS[4], dead_info = KEYS[5], ranked = KEYS[6],
}
-- Must be >= reader.DEAD_CHUNK.
local MAX_DEAD = 1000
local ids = {}
for i = 4, math.min(#ARGV, MAX_DEAD + 3) do ids[#ids + 1] = ARGV[i] end
if ARGV[3] == 'all' then
  local offset, count = math.max(tonumber(ARGV[4]) or 0, 0), math.min(tonumber(ARGV[5]) or 0, MAX_DEAD)
  ids = count >= 1 and rcall('ZRANGE', k.dead, offset, offset + count - 1) or {}
end
local before = head_score(k.due)
local requeued, skipped = 0, 0
for _, id in ipairs(ids) do
  local envelope = rcall('HGET', k.dead_items, id)
  if envelope and rcall('HEXISTS', k.items, id) == 0 then
    rcall('ZADD', k.due, ARGV[1], id)
    rcall('HSET', k.items, id, envelope)
    local ok, info = pcall(cjson.decode, rcall('HGET', k.dead_info, id) or '{}')
    set_rank(k.ranked, id, ok and type(info) == 'table' and tonumber(info.rank) or 0, ARGV[1])
    rcall('ZREM', k.dead, id)
    rcall('HDEL', k.dead_items, id)
    rcall('HDEL', k.dead_info, id)
    requeued = requeued + 1
  elseif rcall('ZSCORE', k.dead, id) then
    skipped = skipped + 1
  end
end
wake_if_earlier(k.due, ARGV[2], before)
return {requeued, skipped, #ids}
