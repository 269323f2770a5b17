#!lua flags=allow-oom
--[[ Push back the lease deadline of items still under our lease, while their publish runs.
Input:
  KEYS[1] due, KEYS[2] leased
  ARGV[1] our lease, "<deadline>:<token>" of the claim
  ARGV[2] lease ms: the new deadline is server now + this
  ARGV[3] clock override ms ("0": server TIME)
  ARGV[4..] ids
Output: {new deadline, id, id, ...}: the ids still ours, now held until the new deadline.
Only the score (when the item is due again) moves: the `leased` value, and with it the lease
that ack, release, fail and defer present, stays the claim's. An id acked, cancelled,
rescheduled or claimed again since our claim no longer carries our lease and is left alone.
Runs at maxmemory (allow-oom): it only rewrites existing scores. ]]
--- @include "lease"
local due, leased = KEYS[1], KEYS[2]
local deadline = ms(now_ms(ARGV[3]) + tonumber(ARGV[2]))
local out = {deadline}
for i = 4, #ARGV do
  if our_lease(leased, ARGV[i], ARGV[1]) then
    rcall('ZADD', due, 'XX', deadline, ARGV[i])
    out[#out + 1] = ARGV[i]
  end
end
return out
