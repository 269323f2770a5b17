#!lua flags=allow-oom
--[[ Take tokens from a queue's forwarding-rate bucket, shared by every forwarder; book
later slots, at the rate, for what cannot go now.
Input:
  KEYS[1] the queue's bucket, a HASH: tokens, at (ms of the last refill), horizon (ms up to
          which refused items already hold slots)
  ARGV[1] rate, tokens per second (may be fractional)
  ARGV[2] burst: most tokens the bucket holds
  ARGV[3] tokens wanted
  ARGV[4] clock override ms ("0": server TIME, one clock for every forwarder)
Output: {granted, first slot ms, now ms, reset}. reset: "" or what was found out of range
and reset ("tokens=<v> at=<v>"), for the caller to log. The wanted - granted refused items
may go from the first slot on, one every 1000/rate ms: the horizon moves past them, so refusals of all
forwarders together book slots at the rate instead of all retrying at once.
A new or expired bucket starts full. A field out of range (the producer role can write the
bucket) is reset as if new: tokens outside 0..burst, ``at`` after now (nothing would refill),
``horizon`` over MAX_HORIZON_MS ahead (items would be booked years away), or a key of
another type.
allow-oom: rate-capped queues must drain a full store too (the bucket is a few bytes). ]]
--- @include "numbers"
local rate, burst, wanted = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms(ARGV[4])
local state = redis.pcall('HMGET', KEYS[1], 'tokens', 'at', 'horizon')
if state.err then  -- not a hash: gone in a ms (PEXPIRE, no DEL right needed), then a new bucket
  rcall('PEXPIRE', KEYS[1], 1)
  return {0, ms(now + math.ceil(1000 / rate)), ms(now), 'type=not a hash'}
end
local reset = {}
-- a legitimate horizon is the refused backlog at the rate: more than a week ahead is garbage
local MAX_HORIZON_MS = 7 * 86400000
-- a field read back, or its new-bucket value when it is absent, not a number or out of lo..hi
local function field(i, name, lo, hi, fresh)
  local n = finite(state[i])
  if n and n >= lo and n <= hi then return n end
  if state[i] then reset[#reset + 1] = name .. '=' .. string.sub(tostring(state[i]), 1, 40) end
  return fresh
end
local tokens = field(1, 'tokens', 0, burst, burst)
local at = field(2, 'at', 0, now, now)
local horizon = field(3, 'horizon', 0, now + MAX_HORIZON_MS, 0)
if now > at then tokens = math.min(burst, tokens + (now - at) * rate / 1000) end
local granted = math.min(wanted, math.floor(tokens))
tokens = tokens - granted
local step = 1000 / rate
-- the next whole token comes (1 - tokens) / rate from now
local first = math.max(horizon, now + math.ceil(math.max(0, 1 - tokens) * step))
if wanted > granted then horizon = first + (wanted - granted) * step end
rcall('HSET', KEYS[1], 'tokens', string.format('%.6f', tokens), 'at', ms(math.max(now, at)), 'horizon', ms(horizon))
-- an idle bucket is full again after burst / rate: then it may go (a missing one starts full)
rcall('PEXPIRE', KEYS[1], ms(math.max(horizon - now, 0) + math.ceil(burst * step) + 1000))
return {granted, ms(first), ms(now), table.concat(reset, ' ')}
