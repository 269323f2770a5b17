--[[ Schedule one item on one shard, replacing an item of that id: the writes of schedule.lua's
replace mode for a batch of one, without its column machinery and batch helpers (their closures
alone were a third of a single-item call's server time). schedule_one.lua runs it alone,
rq_schedule.lua beside an RQ job's own writes.
A replaced item loses its lease and attempts, so a forwarder's late ack will not delete it. Rank 0
costs one EXISTS, and one ZREM only on a shard that has ranked items (it drops a stale entry of an
earlier item of this id). The head is read again only when the item is earlier than it. ]]
--- @include "ranks"
--- @include "wake"

-- Keys: the shard's due, items, tries, leased, ranked. Returns 1 when added, 0 when replaced.
local function schedule_item(due, items, tries, leased, ranked, id, ready, envelope, rank, wake)
  local before = head_score(due)
  rcall('ZADD', due, ready, id)  -- first: at maxmemory it is refused before any write of the item
  local added = rcall('HSET', items, id, envelope)
  if added == 0 then
    rcall('HDEL', tries, id)
    rcall('HDEL', leased, id)
  end
  set_rank(ranked, id, tonumber(rank), ready)
  if not before or tonumber(ready) < before then wake_if_earlier(due, wake, before) end
  return added
end
