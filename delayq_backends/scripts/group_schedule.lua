--[[ Schedule grouped items on one shard, born parked in the lines of their groups (see
includes/glines.lua): a grouped item costs no claim anything until its group can take it.
Input:
  KEYS[1] due, KEYS[2] items, KEYS[3] tries, KEYS[4] leased, KEYS[5] ranked, KEYS[6] gready,
  KEYS[7..6+G] the lines (gline) of the G groups named
  ARGV[1] mode: "replace" (an existing id takes the new time, envelope, rank and group) or "keep"
  ARGV[2] wake channel, ARGV[3] G, ARGV[4..3+G] the group keys (KEYS[6 + g]'s group)
  then per item 5 values: id, ready ms, envelope, rank (0..MAX_RANK), g (1..G)
Output: {added, replaced, kept}, as schedule.lua's.
As schedule.lua, a replaced item loses its lease and attempts; in "keep" mode an existing id
stays unless it awaits its start (lossless mode). A line entry an item leaves behind (replaced
into another group, cancelled) is dropped by the release that meets it. A producer writes no
parking key (`parked`, `parked_why`: forwarders' alone): the line is the item's place. Publishes a wake-up
when a group's release time in this shard became earlier than the shard's earliest. When
`gready` or a group's line holds another type (a hand write), that group's items are scheduled
into the due index as schedule.lua does: a forwarder's admission then decides, and says so. ]]
--- @include "glines"
--- @include "schedule_item"
local k = {due = KEYS[1], items = KEYS[2], tries = KEYS[3], leased = KEYS[4], ranked = KEYS[5], gready = KEYS[6]}
local keep = ARGV[1] == 'keep'
local g = tonumber(ARGV[3])
local first = 3 + g
local before = not wrong_type({{k.gready, 'zset'}}) and head_score(k.gready)
local added, replaced, kept = 0, 0, 0
local lined = {}  -- per group: whether its line (and gready) can be written
local gready_bad = wrong_type({{k.gready, 'zset'}})
for n = 1, g do lined[n] = not gready_bad and not wrong_type({{KEYS[6 + n], 'zset'}}) end
for i = first + 1, #ARGV, 5 do
  local id, ready, envelope, rank, n = ARGV[i], ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4])
  local exists = rcall('HEXISTS', k.items, id) == 1
  if keep and exists and not string.find(rcall('HGET', k.leased, id) or '', ':published:', 1, true) then
    kept = kept + 1
  else
    if exists then replaced = replaced + 1 else added = added + 1 end
    if lined[n] then
      rcall('HSET', k.items, id, envelope)  -- first: at maxmemory it is refused before the item's other writes
      rcall('HDEL', k.tries, id)
      to_line(k, KEYS[6 + n], ARGV[3 + n], id, ready, rank, ready)
    else
      schedule_item(k.due, k.items, k.tries, k.leased, k.ranked, id, ready, envelope, rank, ARGV[2])
    end
  end
end
if not gready_bad then wake_if_earlier(k.gready, ARGV[2], before) end
return {added, replaced, kept}
