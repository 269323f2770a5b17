#!lua flags=allow-oom
--[[ Replace one item's ready time, envelope and rank in one step, if it is as the caller saw it.
For periodic entries: a forwarder that fired an entry schedules its next run under the lease
it fired it with (the ack and the next schedule are this one call), and a sync changes an
entry only while no forwarder is firing it.
Input:
  KEYS[1] due, KEYS[2] items, KEYS[3] tries, KEYS[4] leased, KEYS[5] ranked
  ARGV[1] lease "<deadline>:<token>" the item must still be held under; or "" : it must not be
          held by a live lease (a deferred item, or a lease past its deadline, is not held)
  ARGV[2] the envelope the item must still have, or "" for any
  ARGV[3] now ms (0: the server's TIME), for "past its deadline"
  ARGV[4] wake channel
  ARGV[5] id, ARGV[6] new ready ms, ARGV[7] new envelope, ARGV[8] new rank
Output: 1 replaced; 0 no such item; 2 held (not under the given lease, or under a live lease
when none was given); 3 its envelope is not the one expected.
A replaced item's attempts start again and its lease is dropped, so a late ack or a second
rearm under the same lease finds nothing of its own. allow-oom: it swaps one envelope for
another of about its size, and a refused rearm would fire the entry again after every lease. ]]
--- @include "lease"
--- @include "ranks"
--- @include "wake"
local k = {due = KEYS[1], items = KEYS[2], tries = KEYS[3], leased = KEYS[4], ranked = KEYS[5]}
local id = ARGV[5]
if rcall('HEXISTS', k.items, id) == 0 then return 0 end
local held = rcall('HGET', k.leased, id)
if ARGV[1] ~= '' then
  if not our_lease(k.leased, id, ARGV[1]) then return 2 end
elseif held and not string.find(held, ':deferred:', 1, true) then
  local deadline = finite(string.match(held, '^(%d+):'))
  if not deadline or deadline > now_ms(ARGV[3]) then return 2 end
end
if ARGV[2] ~= '' and rcall('HGET', k.items, id) ~= ARGV[2] then return 3 end
local before = head_score(k.due)
rcall('ZADD', k.due, ARGV[6], id)
rcall('HSET', k.items, id, ARGV[7])
rcall('HDEL', k.tries, id)
rcall('HDEL', k.leased, id)
set_rank(k.ranked, id, tonumber(ARGV[8]) or 0, ARGV[6])
wake_if_earlier(k.due, ARGV[4], before)
return 1
