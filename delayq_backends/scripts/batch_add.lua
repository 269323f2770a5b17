--[[ Count sub-jobs into a batch before they are scheduled ("add"), or take back those whose
schedule failed ("remove"), so the batch's total is the number of sub-jobs that will run.
Adding a member already there counts nothing, closed or not (a retried add, a Celery retry).
A batch holds at most MAX_MEMBERS sub-jobs (includes/batch_own.lua).
Input:
  KEYS[1] the batch's hash, KEYS[2] its members SET
  ARGV[1] mode: "add" or "remove", ARGV[2] the batch key, ARGV[3..] the sub-jobs' ids
Output: the batch's total after the call; -1 a key holds garbage, -2 no such batch, -3 the
batch is closed and a member is new (nothing was added), -6 keys that are not the batch's,
-7 the batch would pass MAX_MEMBERS (nothing was added) ]]
--- @include "batch_own"
local hash, members = KEYS[1], KEYS[2]
if not batch_own(hash, ARGV[2], {members}, {'batch_members'}) then return -6 end
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
  for i = 3, #ARGV do redis.call('SREM', members, ARGV[i]) end
  return redis.call('SCARD', members)
end
local new = 0
for i = 3, #ARGV do
  if redis.call('SISMEMBER', members, ARGV[i]) == 0 then
    if closed == '1' then return -3 end
    new = new + 1
  end
end
if redis.call('SCARD', members) + new > MAX_MEMBERS then return -7 end
for i = 3, #ARGV do redis.call('SADD', members, ARGV[i]) end
return redis.call('SCARD', members)
