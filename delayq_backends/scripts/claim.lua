--[[ Lease up to ARGV[1] due items of one shard.
Input:
  KEYS[1..7] the shard's keys (see includes/common.lua)
  ARGV[1] limit
  ARGV[2] lease ms
  ARGV[3] max attempts: an item claimed more often goes to the dead letters instead
  ARGV[4] clock override ms ("0": server TIME, one clock for every forwarder)
  ARGV[5] claim token, unique per claim: the lease is "<deadline>:<token>", so two claims
          that happen to share a deadline (different lease lengths) never share a lease
Output: {deadline, id, envelope, attempts, ready ms, id, envelope, ...}
A leased item's score becomes its deadline: if it is not acked by then, it is due again. ]]
--- @include "common"
local now = now_ms(ARGV[4])
local deadline = ms(now + tonumber(ARGV[2]))
local lease = deadline .. ':' .. ARGV[5]
local max_attempts = tonumber(ARGV[3])
local out = {deadline}
local ids = rcall('ZRANGEBYSCORE', KEYS[1], '-inf', ms(now), 'LIMIT', 0, tonumber(ARGV[1]))
for _, id in ipairs(ids) do
  local envelope = rcall('HGET', KEYS[2], id)
  local held = rcall('HGET', KEYS[4], id)
  local ready = held and string.match(held, ':(%d+)$') or rcall('ZSCORE', KEYS[1], id)
  local attempts = rcall('HINCRBY', KEYS[3], id, 1)
  if not envelope then
    bury(id, false, ready, attempts, 'no envelope stored for this id (store corrupted or written by another tool)', now)
  elseif attempts > max_attempts then
    bury(id, envelope, ready, attempts,
      'claimed ' .. attempts .. ' times without an ack: forwarders crashed or timed out on it', now)
  else
    rcall('ZADD', KEYS[1], 'XX', deadline, id)
    rcall('HSET', KEYS[4], id, lease .. ':' .. ready)
    out[#out + 1] = id
    out[#out + 1] = envelope
    out[#out + 1] = attempts
    out[#out + 1] = ready
  end
end
return out
