--[[ A forwarder gives back holds of one slot key: the target did not take their items (failed,
unsent), or a periodic run was not moved. Workers report their ends instead (keys.slot_reports_key),
checked against the hold's token by slot_take.lua.
Input:
  KEYS[1] holds    ZSET member -> ms at which the hold lapses
  KEYS[2] tokens   HASH member -> SHA-1 of the hold's token
  KEYS[3] waiting  ZSET member -> order: the key's line (see slot_take.lua)
  ARGV[1] the groups' wake channel (keys.group_wake_channel): when a hold ended, the key is
          published there (ARGV[2]), so forwarders hand the slot to its line at once
  ARGV[2] the slot key (the group) as named
  ARGV[3..] members (one call a member, not unpack(): a batch's members can pass Lua's unpack
          limit, ~8,000)
Output: {ended, heads}: how many of the members were held before the call (-1: KEYS[1] is not a
ZSET, a hand write left to slot_take.lua, which drops it), and as many members from the head of
the line, for the caller to bring their items forward (promote.lua): the free slots go to the
head of the line at its next take. ]]
local holds, tokens, waiting = KEYS[1], KEYS[2], KEYS[3]
local kind = redis.call('TYPE', holds)['ok']
if kind ~= 'none' and kind ~= 'zset' then return {-1, {}} end
local clean = redis.call('TYPE', tokens)['ok'] == 'hash'  -- else slot_take.lua drops it
local ended = 0
for i = 3, #ARGV do
  ended = ended + redis.call('ZREM', holds, ARGV[i])
  if clean then redis.call('HDEL', tokens, ARGV[i]) end
end
if ended > 0 then redis.call('PUBLISH', ARGV[1], ARGV[2]) end
if ended == 0 or redis.call('TYPE', waiting)['ok'] ~= 'zset' then return {ended, {}} end
return {ended, redis.call('ZRANGE', waiting, 0, ended - 1)}
