#!lua flags=allow-oom
--[[ Take concurrency slots of one slot key for items about to be released, in the key's order.
Input:
  KEYS[1] holds    ZSET member -> ms at which the hold lapses (a running item's slot)
  KEYS[2] waiting  ZSET member -> order (rank band + ready ms): the line of items waiting
  KEYS[3] waits    ZSET member -> ms at which a waiting entry lapses unless its item asks again
  KEYS[4] limit    STRING: the key's limit set at runtime, else none
  ARGV[1] the asking items' limit, used while KEYS[4] holds none ("0": unlimited)
  ARGV[2] hold ms: how long a granted slot is held before the worker starts its item
  ARGV[3] wait ms: how long a waiting entry lasts unless its item asks again
  ARGV[4] clock override ms ("0": server TIME, one clock for every forwarder)
  ARGV[5] "take"; "join": the items only take their places in the line (a forwarder's pass
          puts all its claims' items in line before it takes slots for any, so the slots go in
          the key's order across shards); "leave": they give up their places (not to be
          published: found started by lossless mode, or failed); "skip" and "buffer": a
          periodic entry's run at fire time (overlap policies, see delayq_backends/overlap.py):
          granted only while the key is under its limit and no other item waits, its own hold
          counting as taken (an RQ job's runs share one member); else "buffer" joins the line
          when it is empty (or keeps its place: at most one waits), and the rest are refused
  ARGV[6..] member, order: the asking items
Output: {limit (0: none), holds after the call, reset, places}: places per asking item -1
(granted: its hold is taken), -2 (refused: "skip"/"buffer", the period is skipped) or its
place in the line (0: next), as an array of its own (a batch's items can pass Lua's unpack
limit). reset: "" or what was found out of place and
dropped, for the caller to log.
A free slot goes to the head of the line, asking or not: an item that waits keeps its place
while it is deferred, so the items of a key go in their order. Lapsed holds (a worker that
died) and lapsed waits (an item cancelled while it waited) are dropped first. Garbage (the
producer role can write these keys) never blocks the line: a key of another type is made to
expire at once and nothing is granted this call; a hold or wait lapsing over a day ahead and a
waiting entry with no wait are dropped; a runtime limit that is no whole number in 1..10^6 is
ignored. An item that holds a slot already (a forwarder that crashed after taking it) keeps it.
allow-oom: a slotted key must drain a full store too (the entries are a few bytes). ]]
--- @include "numbers"
local holds, waiting, waits = KEYS[1], KEYS[2], KEYS[3]
local hold_ms, wait_ms = tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms(ARGV[4])
local MAX_AHEAD = 86400000
local BUDGET = 1000  -- most garbage entries dropped per call: a hostile line costs a few calls
local reset = {}
local join = ARGV[5] == 'join'
local n = (#ARGV - 5) / 2
local places = {}
local wanted = {'zset', 'zset', 'zset', 'string'}
for i = 1, 4 do
  local kind = rcall('TYPE', KEYS[i])['ok']
  if kind ~= 'none' and kind ~= wanted[i] then
    rcall('PEXPIRE', KEYS[i], 1)
    reset[#reset + 1] = KEYS[i] .. ' type=' .. kind
  end
end
local overlap = ARGV[5] == 'skip' or ARGV[5] == 'buffer'
if #reset > 0 then  -- gone in a ms: the items ask again after a short wait (a period: skipped)
  for i = 1, n do places[i] = overlap and -2 or 0 end
  return {0, 0, table.concat(reset, ' '), places}
end
if ARGV[5] == 'leave' then
  for i = 1, n do
    rcall('ZREM', waiting, ARGV[4 + 2 * i])
    rcall('ZREM', waits, ARGV[4 + 2 * i])
    places[i] = -1
  end
  return {0, 0, '', places}
end
local limit = whole(ARGV[1]) or 0
local set = rcall('GET', KEYS[4])
if set then
  local v = whole(set)
  if v and v >= 1 and v <= 1000000 then limit = v else reset[#reset + 1] = 'limit=' .. string.sub(set, 1, 40) end
end
rcall('ZREMRANGEBYSCORE', holds, '-inf', ms(now))
rcall('ZREMRANGEBYSCORE', holds, '(' .. ms(now + MAX_AHEAD), '+inf')
local lapsed = rcall('ZRANGEBYSCORE', waits, '-inf', ms(now), 'LIMIT', 0, BUDGET)
for _, m in ipairs(rcall('ZRANGEBYSCORE', waits, '(' .. ms(now + MAX_AHEAD), '+inf', 'LIMIT', 0, BUDGET)) do
  lapsed[#lapsed + 1] = m
end
for _, m in ipairs(lapsed) do
  rcall('ZREM', waits, m)
  rcall('ZREM', waiting, m)
end
local function grant(m)
  rcall('ZADD', holds, ms(now + hold_ms), m)
  rcall('ZREM', waiting, m)
  rcall('ZREM', waits, m)
end
local function head()  -- the first item waiting, dropping entries with no wait behind them
  for _ = 1, BUDGET do
    local first = rcall('ZRANGE', waiting, 0, 0)[1]
    if not first or rcall('ZSCORE', waits, first) then return first end
    rcall('ZREM', waiting, first)
    if #reset < 5 then reset[#reset + 1] = 'waiting entry=' .. string.sub(first, 1, 40) end
  end
  return nil
end
if overlap then
  for i = 1, n do
    local m, order = ARGV[4 + 2 * i], ARGV[5 + 2 * i]
    local first = head()
    local mine = not first or first == m
    if mine and (limit == 0 or rcall('ZCARD', holds) < limit) then
      grant(m)
      places[i] = -1
    elseif mine and ARGV[5] == 'buffer' then
      rcall('ZADD', waiting, order, m)
      rcall('ZADD', waits, ms(now + wait_ms), m)
      places[i] = 0
    else
      places[i] = -2
    end
  end
  return {limit, rcall('ZCARD', holds), table.concat(reset, ' '), places}
end
local asking = {}
for i = 1, n do
  local m, order = ARGV[4 + 2 * i], ARGV[5 + 2 * i]
  if rcall('ZSCORE', holds, m) then
    if not join then grant(m) end
    places[i] = -1
  elseif limit == 0 then  -- unlimited: no line to join
    if not join then grant(m) end
    places[i] = -1
  else
    rcall('ZADD', waiting, order, m)
    rcall('ZADD', waits, ms(now + wait_ms), m)
    asking[m] = i
  end
end
if limit > 0 and not join then
  local free, offset, budget = limit - rcall('ZCARD', holds), 0, BUDGET
  while free > 0 and budget > 0 do
    local line = rcall('ZRANGE', waiting, offset, offset + free - 1)
    if #line == 0 then break end
    for _, m in ipairs(line) do
      if not rcall('ZSCORE', waits, m) then  -- no wait behind it: not an item's place
        rcall('ZREM', waiting, m)
        budget = budget - 1
        if #reset < 5 then reset[#reset + 1] = 'waiting entry=' .. string.sub(m, 1, 40) end
      else
        free = free - 1
        if asking[m] then
          grant(m)
          places[asking[m]] = -1
        else
          offset = offset + 1  -- its item is deferred: the place stays its own
        end
      end
    end
  end
end
for m, i in pairs(asking) do
  if not places[i] then places[i] = rcall('ZRANK', waiting, m) end
end
return {limit, rcall('ZCARD', holds), table.concat(reset, ' '), places}
