#!lua flags=allow-oom
--[[ Record a failed delivery of leased items: retry later, or bury in the dead letters once
out of attempts (or at once for a permanent error).
Input:
  KEYS[1] due, KEYS[2] items, KEYS[3] tries, KEYS[4] leased, KEYS[5] dead, KEYS[6] dead_items,
  KEYS[7] dead_info, KEYS[8] ranked (see includes/lease.lua, bury.lua, ranks.lua)
  ARGV[1] our lease, "<deadline>:<token>" of the claim
  ARGV[2] max attempts
  ARGV[3] clock override ms ("0": server TIME)
  ARGV[4] most dead letters kept per shard (0: no cap), ARGV[5] dead-letter expiry ms (0: none)
  ARGV[6..] triples: id, retry-at ms ("" for a permanent error), error text
Output: {retried, buried, the buried ids...} (the forwarder tells their targets: see targets.BuryTarget)
No wake-up: the retry time lies ahead, and the failing forwarder re-reads the heads anyway.
allow-oom: a full store must be able to settle failed deliveries. ]]
--- @include "bury"
local k = {
  due = KEYS[1], items = KEYS[2], tries = KEYS[3], leased = KEYS[4],
  dead = KEYS[5], dead_items = KEYS[6], dead_info = KEYS[7], ranked = KEYS[8],
}
local now = now_ms(ARGV[3])
local max_attempts = tonumber(ARGV[2])
local retried, buried = 0, 0
local out = {0, 0}
for i = 6, #ARGV, 3 do
  local id, retry_at, err = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local ready = our_lease(k.leased, id, ARGV[1])
  if ready then
    local attempts = whole(rcall('HGET', k.tries, id)) or max_attempts  -- garbage: out of attempts
    if retry_at == '' or attempts >= max_attempts then
      bury(k, id, rcall('HGET', k.items, id), ready, attempts, err, now, ARGV[4], ARGV[5])
      buried = buried + 1
      out[buried + 2] = id
    else
      rcall('ZADD', k.due, retry_at, id)
      rcall('HDEL', k.leased, id)
      retried = retried + 1
    end
  end
end
out[1], out[2] = retried, buried
return out
