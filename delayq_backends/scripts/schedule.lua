--[[ Schedule items on one shard.
Input:
  KEYS[1] due, KEYS[2] items, KEYS[3] tries, KEYS[4] leased, KEYS[5] ranked
  ARGV[1] mode: "replace" (an existing id takes the new time, envelope and rank) or "keep"
  ARGV[2] wake channel
  ARGV[3] fields per item: "3" (id, ready ms, envelope: rank 0) or "4" (and rank 0..MAX_RANK,
          higher claimed first), so a batch without ranks sends no rank per item
  ARGV[4..] the items
Output: {added, replaced, kept}
A replaced item loses its lease and attempts: a forwarder's late ack will not delete it.
Rank 0 costs one EXISTS per call, and one ZREM per item only on a shard that has ranked items
(it also drops a stale entry left by an earlier item of that id). ]]
--- @include "ranks"
--- @include "wake"
local k = {due = KEYS[1], items = KEYS[2], tries = KEYS[3], leased = KEYS[4], ranked = KEYS[5]}
local keep = ARGV[1] == 'keep'
local before = head_score(k.due)
local added, replaced, kept = 0, 0, 0
local width = tonumber(ARGV[3])
for i = 4, #ARGV, width do
  local id, ready = ARGV[i], ARGV[i + 1]
  local exists = rcall('HEXISTS', k.items, id) == 1
  if exists and keep then
    kept = kept + 1
  else
    if exists then
      replaced = replaced + 1
      rcall('HDEL', k.tries, id)
      rcall('HDEL', k.leased, id)
    else
      added = added + 1
    end
    rcall('ZADD', k.due, ready, id)
    rcall('HSET', k.items, id, ARGV[i + 2])
    set_rank(k.ranked, id, width == 4 and tonumber(ARGV[i + 3]) or 0, ready)
  end
end
wake_if_earlier(k.due, ARGV[2], before)
return {added, replaced, kept}
