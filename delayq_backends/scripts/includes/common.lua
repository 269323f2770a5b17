--[[ Helpers shared by the shard scripts. Every script takes the same KEYS:
  KEYS[1] due        ZSET id -> ready ms (lease deadline ms while leased)
  KEYS[2] items      HASH id -> envelope
  KEYS[3] tries      HASH id -> delivery attempts
  KEYS[4] leased     HASH id -> "<deadline ms>:<claim token>:<ready ms>"
  KEYS[5] dead       ZSET id -> time of death ms
  KEYS[6] dead_items HASH id -> envelope
  KEYS[7] dead_info  HASH id -> JSON {error, attempts, ready_ms, rank}
  KEYS[8] ranked     ZSET id -> (MAX_RANK - rank) * RANK_SPAN + ready ms, for rank > 0 only
The ranked index is exact about *which* items have a rank (schedule, reschedule, requeue and
bury set or drop an id's entry) but lazy about the rest: an entry may outlive its item, and its ready part may
lag behind the item's score; the claim cleans up what it meets (see claim.lua).
Times cross into Redis as strings made with %d, never through tostring() (which would
print 13+ digit numbers in exponent form on Lua 5.1). ]]
local rcall = redis.call

-- Server time in ms, unless the caller passes a clock override (> 0) for tests.
local function now_ms(override)
  local o = tonumber(override)
  if o and o > 0 then return o end
  local t = rcall('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function ms(n) return string.format('%d', n) end

-- Ranks 1..MAX_RANK each own a band of RANK_SPAN ms scores in the ranked index, the highest
-- rank the lowest band, so the index reads in claim order. 255 * 2^44 + 2^44 = 2^52 is exact
-- in a double; ready times past 2^44 ms (year 2527) are indexed at the band's end, which
-- never comes due. Must match keys.MAX_RANK and keys.RANK_SPAN.
local MAX_RANK = 255
local RANK_SPAN = 17592186044416

local function band_of(rank) return (MAX_RANK - rank) * RANK_SPAN end

-- The rank id's entry in the ranked index says it has (0 without one).
local function rank_of(id)
  local score = rcall('ZSCORE', KEYS[8], id)
  if not score then return 0 end
  return MAX_RANK - math.floor(tonumber(score) / RANK_SPAN)
end

-- Whether the shard's ranked index exists, read once per script call (nil: not read yet), so
-- rank-0 writes to a shard that never had a ranked item cost no command per item.
local ranked_exists = nil

-- Give id rank's entry at ready time ready; rank 0 removes any entry.
local function set_rank(id, rank, ready)
  if rank > 0 then
    rcall('ZADD', KEYS[8], ms(band_of(rank) + math.min(tonumber(ready), RANK_SPAN - 1)), id)
    ranked_exists = true
    return
  end
  if ranked_exists == nil then ranked_exists = rcall('EXISTS', KEYS[8]) == 1 end
  if ranked_exists then rcall('ZREM', KEYS[8], id) end
end

local function head_score()
  local head = rcall('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return tonumber(head[2])
end

-- Publish the new head's ready time when a change made the shard's head earlier, so
-- sleeping forwarders wake for it now instead of at their next safety poll.
local function wake_if_earlier(channel, before)
  local after = head_score()
  if after and (not before or after < before) then rcall('PUBLISH', channel, ms(after)) end
end

-- The original ready time of id if it is held under our lease ("<deadline>:<token>"), else nil.
local function our_lease(id, lease)
  local held = rcall('HGET', KEYS[4], id)
  if held and string.sub(held, 1, #lease + 1) == lease .. ':' then
    return string.sub(held, #lease + 2)
  end
  return nil
end

local function forget(id)
  rcall('ZREM', KEYS[1], id)
  rcall('HDEL', KEYS[2], id)
  rcall('HDEL', KEYS[3], id)
  rcall('HDEL', KEYS[4], id)
end

-- Move id to the dead letters, keeping its envelope (if any), its rank and why it died.
local function bury(id, envelope, ready, attempts, err, now)
  local rank = rank_of(id)
  forget(id)
  set_rank(id, 0)
  rcall('ZADD', KEYS[5], ms(now), id)
  if envelope then rcall('HSET', KEYS[6], id, envelope) end
  rcall('HSET', KEYS[7], id, cjson.encode({error = err, attempts = attempts, ready_ms = ready, rank = rank}))
end
