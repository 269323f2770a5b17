--[[ Schedule items on one shard.
Input:
  KEYS[1..7] the shard's keys (see includes/common.lua)
  ARGV[1] mode: "replace" (an existing id takes the new time and envelope) or "keep"
  ARGV[2] wake channel
  ARGV[3..] triples: id, ready ms, envelope
Output: {added, replaced, kept}
A replaced item loses its lease and attempts: a forwarder's late ack will not delete it. ]]
--- @include "common"
local keep = ARGV[1] == 'keep'
local before = head_score()
local added, replaced, kept = 0, 0, 0
for i = 3, #ARGV, 3 do
  local id = ARGV[i]
  if rcall('HEXISTS', KEYS[2], id) == 1 then
    if keep then
      kept = kept + 1
    else
      replaced = replaced + 1
      rcall('HDEL', KEYS[3], id)
      rcall('HDEL', KEYS[4], id)
      rcall('ZADD', KEYS[1], ARGV[i + 1], id)
      rcall('HSET', KEYS[2], id, ARGV[i + 2])
    end
  else
    added = added + 1
    rcall('ZADD', KEYS[1], ARGV[i + 1], id)
    rcall('HSET', KEYS[2], id, ARGV[i + 2])
  end
end
wake_if_earlier(ARGV[2], before)
return {added, replaced, kept}
