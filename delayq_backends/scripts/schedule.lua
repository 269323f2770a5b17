--[[ Schedule items on one shard.
Input:
  KEYS[1..8] the shard's keys (see includes/common.lua)
  ARGV[1] mode: "replace" (an existing id takes the new time, envelope and rank) or "keep"
  ARGV[2] wake channel
  ARGV[3..] quadruples: id, ready ms, envelope, rank (0..MAX_RANK; higher is claimed first)
Output: {added, replaced, kept}
A replaced item loses its lease and attempts: a forwarder's late ack will not delete it.
Rank 0 costs one ZREM, which also drops a stale entry left by an earlier item of that id. ]]
--- @include "common"
local keep = ARGV[1] == 'keep'
local before = head_score()
local added, replaced, kept = 0, 0, 0
for i = 3, #ARGV, 4 do
  local id, ready = ARGV[i], ARGV[i + 1]
  local exists = rcall('HEXISTS', KEYS[2], id) == 1
  if exists and keep then
    kept = kept + 1
  else
    if exists then
      replaced = replaced + 1
      rcall('HDEL', KEYS[3], id)
      rcall('HDEL', KEYS[4], id)
    else
      added = added + 1
    end
    rcall('ZADD', KEYS[1], ready, id)
    rcall('HSET', KEYS[2], id, ARGV[i + 2])
    set_rank(id, tonumber(ARGV[i + 3]), ready)
  end
end
wake_if_earlier(ARGV[2], before)
return {added, replaced, kept}
