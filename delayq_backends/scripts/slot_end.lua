#!lua flags=allow-oom
--[[ End the holds of items on one slot key (a worker's task ended; a forwarder's publish failed)
and pass each slot given back to the head of the key's line, so the next item takes it within a
pass instead of at its next ask.
Input:
  KEYS[1] holds    ZSET member -> ms at which the hold lapses
  KEYS[2] waiting  ZSET member -> order: the line (see slot_take.lua)
  KEYS[3] waits    ZSET member -> ms at which a place in line lapses
  KEYS[4] limit    STRING: the key's limit set at runtime, else none
  ARGV[1] hold ms of a passed slot: how long it waits for its item to ask (a place's wait; the
          item is brought forward and asks within a pass, and slot_take.lua then holds it as
          granted; an item cancelled meanwhile frees it when this lapses)
  ARGV[2] clock override ms ("0": server TIME)
  ARGV[3..] members
Output: {ended, passed}: how many of the members were held before the call (-1: KEYS[1] is not
a ZSET, a hand write left to slot_take.lua, which drops it), and the members that got the
slots, in line order, for the caller to bring their items forward (promote.lua).
A slot is passed only for a hold this call ended (a lapsed one was freed before), to a place
that has not lapsed, and no further than a runtime limit allows (lowered meanwhile): the key
never holds more than before the call. A member that ends and waits in line at once (an RQ job's
runs share one member: a periodic run buffered behind its previous run) is brought forward but
not held for: slot_take.lua's overlap modes read a held own member as a run still running. Its item finds the slot held when it asks (slot_take.lua
keeps a held member's slot). A line of another type passes nothing (slot_take.lua drops it).
allow-oom: a slot given back must be passed in a full store too. ]]
--- @include "numbers"
local holds, waiting, waits = KEYS[1], KEYS[2], KEYS[3]
local kind = rcall('TYPE', holds)['ok']
if kind ~= 'none' and kind ~= 'zset' then return {-1, {}} end
-- one call a member, not unpack(): a batch's members can pass Lua's unpack limit (~8,000)
local room, ending = 0, {}
for i = 3, #ARGV do
  room = room + rcall('ZREM', holds, ARGV[i])
  ending[ARGV[i]] = true
end
local ended, passed = room, {}
if room == 0 or rcall('TYPE', waiting)['ok'] ~= 'zset' or rcall('TYPE', waits)['ok'] ~= 'zset' then
  return {ended, passed}
end
if rcall('TYPE', KEYS[4])['ok'] == 'string' then
  local limit = whole(rcall('GET', KEYS[4]))
  if limit and limit >= 1 then room = math.min(room, limit - rcall('ZCARD', holds)) end
end
if room < 1 then return {ended, passed} end
local now = now_ms(ARGV[2])
local until_ms = ms(now + tonumber(ARGV[1]))
for _, m in ipairs(rcall('ZRANGE', waiting, 0, room + 99)) do  -- past a few lapsed places at most
  local lapses = finite(rcall('ZSCORE', waits, m))
  if lapses and lapses > now then
    if not ending[m] then
      rcall('ZADD', holds, until_ms, m)
      rcall('ZREM', waiting, m)
      rcall('ZREM', waits, m)
    end  -- else its own next run (an RQ job's runs share a member): first in line, it takes the free slot when it asks
    passed[#passed + 1] = m
    if #passed >= room then break end
  end
end
return {ended, passed}
