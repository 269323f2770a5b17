#!lua flags=allow-oom
--[[ Bring deferred items of one shard forward to now: the head of a slot key's line when a
worker gives a slot back, so the item asks for it at once instead of at its recheck time.
Input:
  KEYS[1] due, KEYS[2] leased, KEYS[3] ranked (see includes/lease.lua, ranks.lua)
  ARGV[1] clock override ms ("0": server TIME)
  ARGV[2] wake channel
  ARGV[3..] ids
Output: how many were brought forward.
Only an item given back by defer.lua ("<not-before>:deferred:<ready>" in leased) whose
not-before time lies ahead moves, with its leased and ranked entries as defer.lua writes them: an
item gone (acked, cancelled) is not brought back, a leased one keeps its lease, a lossless one
awaiting its start stays, and a parked one stays parked (in its group's line, which releases it
in its order; or for a newer release). Publishes a wake-up when the shard's head became earlier, so a
sleeping forwarder claims it now. allow-oom: a slotted key must drain a full store too. ]]
--- @include "ranks"
--- @include "wake"
--- @include "parking"
local due, leased, ranked = KEYS[1], KEYS[2], KEYS[3]
local now = ms(now_ms(ARGV[1]))
local before = head_score(due)
local n = 0
for i = 3, #ARGV do
  local id = ARGV[i]
  local score = finite(rcall('ZSCORE', due, id))
  local held = score and score > tonumber(now) and score ~= PARKED_MS and rcall('HGET', leased, id)
  local ready = held and string.match(held, '^%-?%d+:deferred:(%-?%d+)$')
  if ready then
    local rank = rank_of(ranked, id)  -- read before its writes: a bad ranked key leaves the item as it was
    rcall('ZADD', due, 'XX', now, id)
    rcall('HSET', leased, id, now .. ':deferred:' .. ready)
    if rank > 0 then set_rank(ranked, id, rank, tonumber(now)) end
    n = n + 1
  end
end
if n > 0 then wake_if_earlier(due, ARGV[2], before) end
return n
