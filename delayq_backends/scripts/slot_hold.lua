--[[ Start or extend the holds of running items on one slot key (workers; slot_end.lua ends them).
Input:
  KEYS[1] holds  ZSET member -> ms at which the hold lapses
  ARGV[1] mode: "start" (hold from now: the item runs, held or not), "beat" (extend the holds
          still there)
  ARGV[2] hold ms: a hold lapses this long after the last start or beat
  ARGV[3] clock override ms ("0": server TIME)
  ARGV[4..] members (one call a member in the loop, not unpack(): a batch's members can pass
          Lua's unpack limit, ~8,000)
Output: how many of the members were held before the call; -1 when KEYS[1] is not a ZSET (a
hand write: left to slot_take.lua, which drops it; the worker runs on).
A beat never brings back a hold that lapsed or ended: a slot given back stays free. ]]
--- @include "numbers"
local mode, hold_ms = ARGV[1], tonumber(ARGV[2])
local kind = rcall('TYPE', KEYS[1])['ok']
if kind ~= 'none' and kind ~= 'zset' then return -1 end
local until_ms = ms(now_ms(ARGV[3]) + hold_ms)
local held = 0
for i = 4, #ARGV do
  if mode == 'beat' then  -- only the holds still there: a slot given back stays free
    if rcall('ZSCORE', KEYS[1], ARGV[i]) then
      held = held + 1
      rcall('ZADD', KEYS[1], until_ms, ARGV[i])
    end
  else
    held = held + 1 - rcall('ZADD', KEYS[1], until_ms, ARGV[i])
  end
end
return held
