#!lua flags=allow-oom
--[[ Lossless mode's ack: keep published items until a worker reports their start.
Input:
  KEYS[1] due, KEYS[2] leased, KEYS[3] ranked
  ARGV[1] our lease, "<deadline>:<token>" of the claim
  ARGV[2] clock override ms ("0": server TIME)
  ARGV[3..] pairs: id, window ms (the item is due again at server now + window)
Output: how many were kept.
Each id still under our lease is due again at now + its window, and its `leased` entry becomes
"<due>:published:<ready>" (no claim token is "published", so no ack, release or fail matches
it; claim.lua reads the original ready time from it as from any lease, so a late run's
lateness stays truthful). The claim's attempt stays counted: a task no worker ever starts (it
expired, the workers do not know it) is published at most max attempts times, then the
forwarder buries it with the reason. When it comes due, a forwarder claims it as usual, finds
the run's "started" record (dedupe) and acks it, or publishes it again. A ranked item's index
entry moves to the new due time, as defer.lua moves it. allow-oom: settling must work in a
full store. ]]
--- @include "lease"
--- @include "ranks"
local due, leased, ranked = KEYS[1], KEYS[2], KEYS[3]
local now = now_ms(ARGV[2])
local n = 0
for i = 3, #ARGV, 2 do
  local id, until_ms = ARGV[i], ms(now + tonumber(ARGV[i + 1]))
  local ready = our_lease(leased, id, ARGV[1])
  if ready then
    rcall('ZADD', due, until_ms, id)
    rcall('HSET', leased, id, until_ms .. ':published:' .. ready)
    local rank = rank_of(ranked, id)
    if rank > 0 then set_rank(ranked, id, rank, until_ms) end
    n = n + 1
  end
end
return n
