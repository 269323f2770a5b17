--[[ Count sub-jobs into a batch before they are scheduled ("add"), or take back those whose
schedule failed ("remove"), so the batch's total is the number of sub-jobs that will run.
Adding a member already there counts nothing, closed or not (a retried add, a Celery retry).
Input:
  KEYS[1] the batch's hash, KEYS[2] its members SET
  ARGV[1] mode: "add" or "remove", ARGV[2..] the sub-jobs' ids
Output: the batch's total after the call; -1 a key holds garbage, -2 no such batch, -3 the
batch is closed and a member is new (nothing was added) ]]
local hash, members = KEYS[1], KEYS[2]
if redis.call('TYPE', hash)['ok'] ~= 'hash' then
  return redis.call('EXISTS', hash) == 1 and -1 or -2
end
local kind = redis.call('TYPE', members)['ok']
if kind ~= 'none' and kind ~= 'set' then return -1 end
local closed = redis.call('HGET', hash, 'closed')
if closed ~= '0' and closed ~= '1' then return -1 end
-- one call a member, not unpack(): a batch's members can pass Lua's unpack limit (~8,000)
if ARGV[1] == 'remove' then
  if closed == '1' then return -3 end  -- a closed batch may be complete: its count stays
  for i = 2, #ARGV do redis.call('SREM', members, ARGV[i]) end
  return redis.call('SCARD', members)
end
if closed == '1' then
  for i = 2, #ARGV do
    if redis.call('SISMEMBER', members, ARGV[i]) == 0 then return -3 end
  end
end
for i = 2, #ARGV do redis.call('SADD', members, ARGV[i]) end
return redis.call('SCARD', members)
