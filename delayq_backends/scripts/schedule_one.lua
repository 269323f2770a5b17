--[[ Schedule one item on one shard, replacing an item of that id: schedule.lua's replace mode for
a batch of one, which is every apply_async and enqueue_at. The same writes, without the column
machinery and the batch helpers schedule.lua includes: their closures alone are a third of a
single-item call's server time (19 -> 13 us per call between a producer's round trips).
Input:
  KEYS[1] due, KEYS[2] items, KEYS[3] tries, KEYS[4] leased, KEYS[5] ranked
  ARGV[1] id, ARGV[2] ready ms, ARGV[3] envelope, ARGV[4] rank (0..MAX_RANK), ARGV[5] wake channel
Output: {added, replaced, 0}, as schedule.lua's {added, replaced, kept}
A replaced item loses its lease and attempts, so a forwarder's late ack will not delete it. Rank 0
costs one EXISTS, and one ZREM only on a shard that has ranked items (it drops a stale entry of an
earlier item of this id). The head is read again only when the item is earlier than it. ]]
--- @include "ranks"
--- @include "wake"
local id, ready = ARGV[1], ARGV[2]
local before = head_score(KEYS[1])
rcall('ZADD', KEYS[1], ready, id)  -- first: at maxmemory it is refused before anything is written
local added = rcall('HSET', KEYS[2], id, ARGV[3])
if added == 0 then
  rcall('HDEL', KEYS[3], id)
  rcall('HDEL', KEYS[4], id)
end
set_rank(KEYS[5], id, tonumber(ARGV[4]), ready)
if not before or tonumber(ready) < before then wake_if_earlier(KEYS[1], ARGV[5], before) end
return {added, 1 - added, 0}
