--[[ Helpers shared by the shard scripts. Every script takes the same KEYS:
  KEYS[1] due        ZSET id -> ready ms (lease deadline ms while leased)
  KEYS[2] items      HASH id -> envelope
  KEYS[3] tries      HASH id -> delivery attempts
  KEYS[4] leased     HASH id -> "<deadline ms>:<claim token>:<ready ms>"
  KEYS[5] dead       ZSET id -> time of death ms
  KEYS[6] dead_items HASH id -> envelope
  KEYS[7] dead_info  HASH id -> JSON {error, attempts, ready_ms}
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

-- Move id to the dead letters, keeping its envelope (if any) and why it died.
local function bury(id, envelope, ready, attempts, err, now)
  forget(id)
  rcall('ZADD', KEYS[5], ms(now), id)
  if envelope then rcall('HSET', KEYS[6], id, envelope) end
  rcall('HSET', KEYS[7], id, cjson.encode({error = err, attempts = attempts, ready_ms = ready}))
end
