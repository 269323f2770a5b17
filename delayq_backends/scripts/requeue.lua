--[[ Move dead letters back into the schedule with fresh attempts.
Input:
  KEYS[1..8] the shard's keys (see includes/common.lua)
  ARGV[1] ready ms
  ARGV[2] wake channel
  ARGV[3] "all" (a page of the shard's dead letters, oldest first: ARGV[4] offset, ARGV[5] count)
          or "ids" (those in ARGV[4..])
  ARGV[4..] ids
Output: {requeued, skipped, seen}: skipped = no envelope kept, or the id is scheduled again
already (it stays a dead letter); seen = dead letters of the page. The caller pages through
"all" (store.requeue_dead), so no call holds the server for long whatever the count.
An item keeps the rank it died with (recorded in dead_info; letters buried before ranks: 0). ]]
--- @include "common"
local ids = {}
for i = 4, #ARGV do ids[#ids + 1] = ARGV[i] end
if ARGV[3] == 'all' then
  local offset = tonumber(ARGV[4])
  ids = rcall('ZRANGE', KEYS[5], offset, offset + tonumber(ARGV[5]) - 1)
end
local before = head_score()
local requeued, skipped = 0, 0
for _, id in ipairs(ids) do
  local envelope = rcall('HGET', KEYS[6], id)
  if envelope and rcall('HEXISTS', KEYS[2], id) == 0 then
    rcall('ZADD', KEYS[1], ARGV[1], id)
    rcall('HSET', KEYS[2], id, envelope)
    local ok, info = pcall(cjson.decode, rcall('HGET', KEYS[7], id) or '{}')
    set_rank(id, ok and type(info) == 'table' and tonumber(info.rank) or 0, ARGV[1])
    rcall('ZREM', KEYS[5], id)
    rcall('HDEL', KEYS[6], id)
    rcall('HDEL', KEYS[7], id)
    requeued = requeued + 1
  elseif rcall('ZSCORE', KEYS[5], id) then
    skipped = skipped + 1
  end
end
wake_if_earlier(ARGV[2], before)
return {requeued, skipped, #ids}
