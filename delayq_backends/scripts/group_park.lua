#!lua flags=allow-oom
--[[ Put leased items a group refused (another forwarder took its room first, or an item from a
producer that wrote it into the due index: an earlier release's) back in their groups' lines
(see includes/glines.lua), instead of deferring them: a claim reads none of them again until
their group releases them.
Input:
  KEYS[1] due, KEYS[2] tries, KEYS[3] leased, KEYS[4] ranked, KEYS[5] parked, KEYS[6] parked_why,
  KEYS[7] gready, KEYS[8..7+G] the lines of the G groups named
  ARGV[1] our lease, "<deadline>:<token>" of the claim
  ARGV[2] when a forwarder's parked re-check looks at the items, ms
  ARGV[3] G, ARGV[4..3+G] the group keys (KEYS[7 + g]'s group)
  then per item 4 values: id, g (1..G), rank, until ms (when its group may take it: its gready
  moves there if that is earlier)
Output: {how many were still under our lease, how many of those were deferred to their until
instead}: when a key this writes holds another type (a hand write), an item is deferred as
defer.lua does (still in the due index, not claimed before then), so its group goes on.
The attempt is not counted, and the original ready time is kept. allow-oom: giving items back
must work in a full store. ]]
--- @include "lease"
--- @include "glines"
local k = {
  due = KEYS[1], tries = KEYS[2], leased = KEYS[3], ranked = KEYS[4], parked = KEYS[5], parked_why = KEYS[6],
  gready = KEYS[7],
}
local g = tonumber(ARGV[3])
local bad = wrong_type({{k.gready, 'zset'}, {k.parked, 'zset'}, {k.parked_why, 'hash'}})
local n, deferred = 0, 0
for i = 4 + g, #ARGV, 4 do
  local id, which, rank, at = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), ARGV[i + 3]
  local ready = our_lease(k.leased, id, ARGV[1])
  if ready then
    uncount(k.tries, id)
    if bad or wrong_type({{KEYS[7 + which], 'zset'}}) then  -- as defer.lua: claimed again at `at`
      rcall('ZADD', k.due, at, id)
      rcall('HSET', k.leased, id, at .. ':deferred:' .. ready)
      if rank > 0 then set_rank(k.ranked, id, rank, at) end
      deferred = deferred + 1
    else
      to_line(k, KEYS[7 + which], ARGV[3 + which], id, ready, rank, at)
      rcall('ZADD', k.parked, ARGV[2], id)
      rcall('HSET', k.parked_why, id, 'group:' .. ARGV[3 + which])
    end
    n = n + 1
  end
end
return {n, deferred}
