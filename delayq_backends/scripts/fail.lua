#!lua flags=allow-oom
--[[ Record a failed delivery of leased items: retry later, or bury in the dead letters once
out of attempts (or at once for a permanent error).
Input:
  KEYS[1..8] the shard's keys (see includes/common.lua)
  ARGV[1] our lease, "<deadline>:<token>" of the claim
  ARGV[2] max attempts
  ARGV[3] clock override ms ("0": server TIME)
  ARGV[4] most dead letters kept per shard (0: no cap), ARGV[5] dead-letter expiry ms (0: none)
  ARGV[6..] triples: id, retry-at ms ("" for a permanent error), error text
Output: {retried, buried}
No wake-up: the retry time lies ahead, and the failing forwarder re-reads the heads anyway.
allow-oom: a full store must be able to settle failed deliveries. ]]
--- @include "common"
local now = now_ms(ARGV[3])
local max_attempts = tonumber(ARGV[2])
local retried, buried = 0, 0
for i = 6, #ARGV, 3 do
  local id, retry_at, err = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local ready = our_lease(id, ARGV[1])
  if ready then
    local attempts = whole(rcall('HGET', KEYS[3], id)) or max_attempts  -- garbage: out of attempts
    if retry_at == '' or attempts >= max_attempts then
      bury(id, rcall('HGET', KEYS[2], id), ready, attempts, err, now, ARGV[4], ARGV[5])
      buried = buried + 1
    else
      rcall('ZADD', KEYS[1], retry_at, id)
      rcall('HDEL', KEYS[4], id)
      retried = retried + 1
    end
  end
end
return {retried, buried}
