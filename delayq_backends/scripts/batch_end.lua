--[[ Close a batch ("close") or record one sub-job's final end ("finish"); then, in the same
call, complete the batch if it is closed and every member has finished: its on_complete item is
written into this shard ready now (includes/schedule_item.lua), the summary is published on the
batch's channel, the batch is marked completed and its keys expire after the TTL. Completion is
checked on every call, so it happens once, and a call that failed midway (a garbage shard key)
is repaired by the next finish or close of the batch.
A member that finishes twice (a redelivery) counts once: the done SET.
What the producer role can write into the batch's keys by hand is not trusted:
- finished means finished members: ids in the done SET that are no members count nothing
  (SINTERCARD, run only once the done SET is as large as the members SET);
- the batch fires once: completion moves a fresh hash (KEYS[11]) to the fired mark (KEYS[10])
  with RENAMENX, which fails when the mark is there. The producer and worker roles may write the
  mark only as RENAMENX's target (acl.py), so they can neither delete it, change it nor shorten
  its TTL: resetting the hash's `completed` never fires the batch again;
- counts: a `failed` below the failed ids listed or above the total, or not matching the list
  while the list is not full, is garbage; the summary's failed ids are members that finished,
  each once.
Input:
  KEYS[1] due, KEYS[2] items, KEYS[3] tries, KEYS[4] leased, KEYS[5] ranked (the shard of the
          on_complete item, whose hash tag the batch's keys share)
  KEYS[6] the batch's hash, KEYS[7] its members SET, KEYS[8] its done SET, KEYS[9] its failed
          LIST, KEYS[10] its fired mark, KEYS[11] the mark's makings (a scratch key)
  ARGV[1] mode: "close" or "finish", ARGV[2] now ms, ARGV[3] the wake channel,
  ARGV[4] the batch's channel, ARGV[5] the on_complete item's id, ARGV[6] the batch key (in the
  summary), ARGV[7] failed ids kept at most, ARGV[8] the member (finish), ARGV[9] "1" it
  succeeded, "0" it failed (finish)
The batch's hash holds the TTL of its keys once completed (batch_open.lua).
Output: {code, completed}; code 1: counted (closed), 0: counted before (closed before), -1: a key
holds garbage (nothing written), -2: no such batch, -4: not a member of the batch, -6: keys or
names that are not the batch's; completed 1 when this call completed the batch ]]
--- @include "schedule_item"
--- @include "numbers"
--- @include "batch_own"
local hash, members, done, failed, fired, firing = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11]
local mode, now, key = ARGV[1], ARGV[2], ARGV[6]

local own = {members, done, failed, fired, firing}
if not batch_own(hash, key, own, {'batch_members', 'batch_done', 'batch_failed', 'fired', 'batch_firing'})
  or ARGV[5] ~= 'batch-' .. key or string.sub(ARGV[4], -#(':batch:' .. key)) ~= ':batch:' .. key then
  return {-6, 0}
end
if redis.call('TYPE', hash)['ok'] ~= 'hash' then
  return {redis.call('EXISTS', hash) == 1 and -1 or -2, 0}
end
for _, pair in ipairs({{members, 'set'}, {done, 'set'}, {failed, 'list'}}) do
  local kind = redis.call('TYPE', pair[1])['ok']
  if kind ~= 'none' and kind ~= pair[2] then return {-1, 0} end
end
local state = redis.call('HMGET', hash, 'closed', 'completed', 'failed', 'ttl')
local closed, completed, failures, ttl = state[1], state[2], whole(state[3]), whole(state[4])
if (closed ~= '0' and closed ~= '1') or (completed ~= '0' and completed ~= '1') or not failures
  or not ttl or ttl < 1 or redis.call('SCARD', members) > MAX_MEMBERS then
  return {-1, 0}
end

local code = 0
if mode == 'close' then
  if closed == '0' then
    redis.call('HSET', hash, 'closed', '1')
    closed, code = '1', 1
  end
else
  local member = ARGV[8]
  if redis.call('SISMEMBER', members, member) == 0 then return {-4, 0} end
  if redis.call('SADD', done, member) == 1 then
    code = 1
    if ARGV[9] ~= '1' then
      failures = redis.call('HINCRBY', hash, 'failed', 1)
      if redis.call('LLEN', failed) < tonumber(ARGV[7]) then redis.call('RPUSH', failed, member) end
    end
  end
end

local total = redis.call('SCARD', members)
if closed ~= '1' or completed == '1' or redis.call('SCARD', done) < total
  or redis.call('EXISTS', fired) == 1 then
  return {code, 0}
end
if redis.call('SINTERCARD', 2, members, done) < total then return {code, 0} end

-- the failed ids in the summary: members that finished, each once (the list is bounded)
local listed, ids, seen = redis.call('LRANGE', failed, 0, -1), {}, {}
for _, id in ipairs(listed) do
  if not seen[id] and redis.call('SISMEMBER', members, id) == 1 and redis.call('SISMEMBER', done, id) == 1 then
    seen[id] = true
    ids[#ids + 1] = cjson.encode(id)
  end
end
if failures < #ids or failures > total or (#listed < tonumber(ARGV[7]) and failures ~= #ids) then
  return {-1, 0}
end

-- complete: the summary, as JSON (cjson would write an empty list as {})
local summary = '{"batch":' .. cjson.encode(key) .. ',"total":' .. total .. ',"succeeded":' ..
  (total - failures) .. ',"failed":' .. failures .. ',"failed_ids":[' .. table.concat(ids, ',') .. ']}'
local meta = redis.call('HMGET', hash, 'on_complete', 'mark')
local envelope, mark = meta[1], meta[2]
if envelope and #envelope > 0 then
  if mark and #mark > 0 then  -- the last "<mark>": the body, which comes last in an envelope
    local quoted, at, from = '"' .. mark .. '"', nil, 1
    while true do
      local found = string.find(envelope, quoted, from, true)
      if not found then break end
      at, from = found, found + 1
    end
    if at then envelope = string.sub(envelope, 1, at - 1) .. summary .. string.sub(envelope, at + #quoted) end
  end
  -- first: a garbage shard key fails the call here, before the batch is marked completed
  schedule_item(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[5], now, envelope, 0, ARGV[3])
end
-- the fired mark: a fresh hash moved into place (absent, as checked above: RENAMENX moves it)
redis.call('DEL', firing)
redis.call('HSET', firing, 'at', now)
redis.call('PEXPIRE', firing, ms(ttl))
redis.call('RENAMENX', firing, fired)
redis.call('HSET', hash, 'completed', '1', 'completed_at', now)
redis.call('PUBLISH', ARGV[4], summary)
for i = 6, 9 do redis.call('PEXPIRE', KEYS[i], ms(ttl)) end
return {code, 1}
