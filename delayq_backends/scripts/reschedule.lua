--[[ Move an existing item to a new ready time, keeping its envelope and rank.
Input:
  KEYS[1] due, KEYS[2] items, KEYS[3] tries, KEYS[4] leased, KEYS[5] ranked
  ARGV[1] id
  ARGV[2] new ready ms
  ARGV[3] wake channel
Output: 1 if it was moved, 2 if it is leased to a forwarder (in flight: it may be published
already, so it is left as it is rather than delivered now and again at the new time), else 0.
Attempts start again; a deferred item (defer.lua) is not in flight and moves. The ranked entry moves too: the claim's lazy cleanup can only
catch an entry that is *earlier* than its item, not one left later. ]]
--- @include "ranks"
--- @include "wake"
local k = {due = KEYS[1], items = KEYS[2], tries = KEYS[3], leased = KEYS[4], ranked = KEYS[5]}
if rcall('HEXISTS', k.items, ARGV[1]) == 0 then return 0 end
local leased = rcall('HGET', k.leased, ARGV[1])
if leased and not string.find(leased, ':deferred:', 1, true) then return 2 end
local before = head_score(k.due)
rcall('ZADD', k.due, ARGV[2], ARGV[1])
rcall('HDEL', k.tries, ARGV[1])
rcall('HDEL', k.leased, ARGV[1])
set_rank(k.ranked, ARGV[1], rank_of(k.ranked, ARGV[1]), ARGV[2])
wake_if_earlier(k.due, ARGV[3], before)
return 1
