--[[ The ranked index (a shard's `ranked` ZSET: id -> (MAX_RANK - rank) * RANK_SPAN + ready ms,
for rank > 0 only), passed in as `ranked`.
The index is exact about *which* items have a rank (schedule, reschedule, requeue and bury set
or drop an id's entry) but lazy about the rest: an entry may outlive its item, and its ready
part may lag behind the item's score; the claim cleans up what it meets (see claim.lua). ]]
--- @include "numbers"

-- Ranks 1..MAX_RANK each own a band of RANK_SPAN ms scores in the ranked index, the highest
-- rank the lowest band, so the index reads in claim order. 255 * 2^44 + 2^44 = 2^52 is exact
-- in a double; ready times past 2^44 ms (year 2527) are indexed at the band's end, which
-- never comes due. Must match keys.MAX_RANK and keys.RANK_SPAN.
local MAX_RANK = 255
local RANK_SPAN = 17592186044416

local function band_of(rank) return (MAX_RANK - rank) * RANK_SPAN end

-- The rank id's entry in the ranked index says it has (0 without one).
local function rank_of(ranked, id)
  local score = finite(rcall('ZSCORE', ranked, id))
  if not score then return 0 end
  local rank = MAX_RANK - math.floor(score / RANK_SPAN)
  if rank < 1 or rank > MAX_RANK then return 0 end  -- a hand-written entry outside every band
  return rank
end

-- Whether the shard's ranked index exists, read once per script call (nil: not read yet), so
-- rank-0 writes to a shard that never had a ranked item cost no command per item.
local ranked_exists = nil

-- Give id rank's entry at ready time ready; rank 0 removes any entry.
local function set_rank(ranked, id, rank, ready)
  if rank > 0 then
    rcall('ZADD', ranked, ms(band_of(rank) + math.max(0, math.min(finite(ready) or 0, RANK_SPAN - 1))), id)
    ranked_exists = true
    return
  end
  if ranked_exists == nil then ranked_exists = rcall('EXISTS', ranked) == 1 end
  if ranked_exists then rcall('ZREM', ranked, id) end
end
