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
Output: {granted, first slot ms, now ms}. The wanted - granted refused items may go from the
first slot on, one every 1000/rate ms: the horizon moves past them, so refusals of all
forwarders together book slots at the rate instead of all retrying at once.
A new or expired bucket starts full.
allow-oom: rate-capped queues must drain a full store too (the bucket is a few bytes). ]]
--- @include "numbers"
local rate, burst, wanted = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms(ARGV[4])
local state = rcall('HMGET', KEYS[1], 'tokens', 'at', 'horizon')
local tokens = finite(state[1]) or burst  -- a hand-written bucket reads as a new one
local at = finite(state[2]) or now
local horizon = finite(state[3]) or 0
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
return {granted, ms(first), ms(now)}
