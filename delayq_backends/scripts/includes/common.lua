--[[ Helpers shared by the shard scripts. Every script takes the same KEYS:
  KEYS[1] due        ZSET id -> ready ms (lease deadline ms while leased)
  KEYS[2] items      HASH id -> envelope
  KEYS[3] tries      HASH id -> delivery attempts
  KEYS[4] leased     HASH id -> "<deadline ms>:<claim token>:<ready ms>", or for an item given
                     back by defer.lua "<not-before ms>:deferred:<ready ms>" (not a lease: claimable
                     from its not-before time, see claim.lua); for an item published in lossless
                     mode and awaiting its start (keep.lua) "<due ms>:published:<ready ms>"
  KEYS[5] dead       ZSET id -> time of death ms
  KEYS[6] dead_items HASH id -> envelope
  KEYS[7] dead_info  HASH id -> JSON {error, attempts, ready_ms, rank}
  KEYS[8] ranked     ZSET id -> (MAX_RANK - rank) * RANK_SPAN + ready ms, for rank > 0 only
The ranked index is exact about *which* items have a rank (schedule, reschedule, requeue and
bury set or drop an id's entry) but lazy about the rest: an entry may outlive its item, and its ready part may
lag behind the item's score; the claim cleans up what it meets (see claim.lua).
Times cross into Redis as strings made with %d, never through tostring() (which would
print 13+ digit numbers in exponent form on Lua 5.1).
Anything read back may have been written by hand (the producer role can write these keys): it
is checked before use, so a bad value buries its item with the reason instead of failing the
script after earlier writes (see check_types and the parsers below). ]]
local rcall = redis.call

-- Largest integer exact in a double: a time or count past it is garbage, not data.
local MAX_EXACT = 9007199254740992

-- A finite number in -MAX_EXACT..MAX_EXACT from a Redis reply string, else nil.
local function finite(s)
  local n = tonumber(s)
  if n and n == n and n >= -MAX_EXACT and n <= MAX_EXACT then return n end
  return nil
end

-- A whole number written as HINCRBY writes it (digits, optional minus), else nil.
local function whole(s)
  if type(s) ~= 'string' or #s > 15 or not string.match(s, '^%-?%d+$') then return nil end
  return tonumber(s)
end

-- Whether s is valid UTF-8 (RFC 3629: no overlongs, no surrogates, nothing past U+10FFFF).
local function is_utf8(s)
  if not string.find(s, '[\128-\255]') then return true end  -- ASCII (every Celery and RQ id): one C scan
  local i, n = 1, #s
  while i <= n do
    local c = string.byte(s, i)
    local len, low, high = 0, 0x80, 0xBF
    if c < 0x80 then len = 1
    elseif c >= 0xC2 and c <= 0xDF then len = 2
    elseif c >= 0xE0 and c <= 0xEF then
      len = 3
      if c == 0xE0 then low = 0xA0 elseif c == 0xED then high = 0x9F end
    elseif c >= 0xF0 and c <= 0xF4 then
      len = 4
      if c == 0xF0 then low = 0x90 elseif c == 0xF4 then high = 0x8F end
    else return false end
    for k = 1, len - 1 do
      local b = string.byte(s, i + k)
      if not b or b < (k == 1 and low or 0x80) or b > (k == 1 and high or 0xBF) then return false end
    end
    i = i + len
  end
  return true
end

-- Refuse, before anything is written, a shard whose keys hold another type than ours (a hand
-- write): every later command on them would fail midway. The error names the key.
-- ZCARD/HLEN rather than TYPE: the roles' ACLs grant those already.
local KEY_TYPES = {'zset', 'hash', 'hash', 'hash', 'zset', 'hash', 'hash', 'zset'}
local function check_types()
  for i, want in ipairs(KEY_TYPES) do
    local reply = redis.pcall(want == 'zset' and 'ZCARD' or 'HLEN', KEYS[i])
    if type(reply) == 'table' and reply.err then
      return redis.error_reply('WRONGTYPE delayq key ' .. KEYS[i] .. ' is not a ' .. want ..
        ': it was written by another tool; move it away (RENAME) so the shard can run again')
    end
  end
  return nil
end

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
  local score = finite(rcall('ZSCORE', KEYS[8], id))
  if not score then return 0 end
  local rank = MAX_RANK - math.floor(score / RANK_SPAN)
  if rank < 1 or rank > MAX_RANK then return 0 end  -- a hand-written entry outside every band
  return rank
end

-- Whether the shard's ranked index exists, read once per script call (nil: not read yet), so
-- rank-0 writes to a shard that never had a ranked item cost no command per item.
local ranked_exists = nil

-- Give id rank's entry at ready time ready; rank 0 removes any entry.
local function set_rank(id, rank, ready)
  if rank > 0 then
    rcall('ZADD', KEYS[8], ms(band_of(rank) + math.max(0, math.min(finite(ready) or 0, RANK_SPAN - 1))), id)
    ranked_exists = true
    return
  end
  if ranked_exists == nil then ranked_exists = rcall('EXISTS', KEYS[8]) == 1 end
  if ranked_exists then rcall('ZREM', KEYS[8], id) end
end

local function head_score()
  local head = rcall('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return finite(head[2])
end

-- Publish the new head's ready time when a change made the shard's head earlier, so
-- sleeping forwarders wake for it now instead of at their next safety poll.
local function wake_if_earlier(channel, before)
  local after = head_score()
  if after and (not before or after < before) then rcall('PUBLISH', channel, ms(after)) end
end

-- Give back one counted attempt of id (release, defer), whatever its tries entry holds.
local function uncount(id)
  local tries = whole(rcall('HGET', KEYS[3], id))
  if tries and tries > 1 then rcall('HSET', KEYS[3], id, ms(tries - 1)) else rcall('HDEL', KEYS[3], id) end
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
-- A ready time that is no finite number is recorded as absent (JSON null), so readers never
-- meet "-inf". dead_max > 0 keeps only the newest dead_max dead letters of the shard (the oldest
-- go for good); dead_ttl_ms > 0 drops those buried longer ago than that. Both cost O(log N) plus
-- what they remove, and are optional (Config.dead_letter_max / dead_letter_ttl_seconds).
local function bury(id, envelope, ready, attempts, err, now, dead_max, dead_ttl_ms)
  local rank = rank_of(id)
  forget(id)
  set_rank(id, 0)
  rcall('ZADD', KEYS[5], ms(now), id)
  if envelope then rcall('HSET', KEYS[6], id, envelope) end
  rcall('HSET', KEYS[7], id, cjson.encode({error = err, attempts = attempts, ready_ms = finite(ready), rank = rank}))
  local old = {}
  local ttl, cap = tonumber(dead_ttl_ms) or 0, tonumber(dead_max) or 0
  if ttl > 0 then old = rcall('ZRANGEBYSCORE', KEYS[5], '-inf', '(' .. ms(now - ttl), 'LIMIT', 0, 100) end
  if cap > 0 then
    local over = rcall('ZCARD', KEYS[5]) - cap
    if over > 0 then
      for _, gone in ipairs(rcall('ZRANGE', KEYS[5], 0, math.min(over, 100) - 1)) do old[#old + 1] = gone end
    end
  end
  for _, gone in ipairs(old) do
    rcall('ZREM', KEYS[5], gone)
    rcall('HDEL', KEYS[6], gone)
    rcall('HDEL', KEYS[7], gone)
  end
end

-- Why a claimed id cannot be delivered as stored, or nil: checked before anything is written.
-- held is its leased entry, tries its tries entry, ready its original ready time (strings or false).
local function tries_defect(tries)
  return 'its tries entry ' .. string.format('%q', string.sub(tries, 1, 40)) .. ' is not a whole number (a count HINCRBY can add to)'
end

local function defect(id, envelope, held, tries, ready)
  if not is_utf8(id) then return 'the id is not UTF-8 text (written by another tool)' end
  if not envelope then return 'no envelope stored for this id (store corrupted or written by another tool)' end
  if tries and not whole(tries) then return tries_defect(tries) end
  -- "<deadline>:<ready>" is the lease of the first releases, before claim tokens
  if held and not (string.match(held, '^%d+:[%w]+:%-?%d+$') or string.match(held, '^%d+:%-?%d+$')) then
    return 'its leased entry ' .. string.format('%q', string.sub(held, 1, 40)) .. ' is not "<deadline>:<token>:<ready>"'
  end
  if not finite(ready) then return 'its ready time ' .. tostring(ready) .. ' is not a finite number of ms' end
  return nil
end
