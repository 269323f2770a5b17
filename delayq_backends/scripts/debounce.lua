--[[ Debounce or throttle one key: however many calls, one pending run per item id.
Input:
  KEYS[1] due, KEYS[2] items, KEYS[3] tries, KEYS[4] leased, KEYS[5] ranked
  KEYS[6] calls: the id's call counter, a HASH {calls}
  ARGV[1] mode: "debounce" (each call moves the pending run to its own ready time, so the run
          fires at the LAST call's time) or "throttle" (the pending run keeps the FIRST call's time)
  ARGV[2] keep: "first" or "last": whose envelope (arguments) and rank the run delivers
  ARGV[3] wake channel
  ARGV[4] id, ARGV[5] this call's ready ms, ARGV[6] this call's envelope, ARGV[7] its rank
  ARGV[8] ms the counter outlives the run's ready time (or the server's now, if later)
Output: {calls, run's ready ms, stored, superseded}: calls collapsed into the pending run (this
one included; 1: this call started a new run), whether this call's envelope is the one stored,
and the envelope this call replaced without it being delivered ("" if none).
Pending: the item exists and no forwarder holds it (no leased entry, or one given back by flow
control, "...:deferred:..."). Anything else starts a new run: an absent item, or one under a
forwarder's lease, which may be published already. The new run takes the id as schedule.lua's
replace does (leased and tries entries dropped), so the old forwarder's late ack finds no lease
of its own and leaves the new run alone; the old one is delivered, not superseded.
A debounce that moves a deferred item drops its deferred entry: its booked slot was for the
old time, and the next claim books again if its queue is still capped. ]]
--- @include "ranks"
--- @include "wake"
local k = {due = KEYS[1], items = KEYS[2], tries = KEYS[3], leased = KEYS[4], ranked = KEYS[5], calls = KEYS[6]}
-- Refuse, before any write, keys of another type than ours (a hand write), naming the key.
local KEY_TYPES = {{'due', 'zset'}, {'items', 'hash'}, {'tries', 'hash'}, {'leased', 'hash'}, {'ranked', 'zset'},
  {'calls', 'hash'}}
for _, pair in ipairs(KEY_TYPES) do
  local reply = redis.pcall(pair[2] == 'zset' and 'ZCARD' or 'HLEN', k[pair[1]])
  if type(reply) == 'table' and reply.err then
    return redis.error_reply('WRONGTYPE delayq key ' .. k[pair[1]] .. ' is not a ' .. pair[2] ..
      ': it was written by another tool; move it away (RENAME) so this key can be debounced again')
  end
end
local debounce, keep_last = ARGV[1] == 'debounce', ARGV[2] == 'last'
local id, ready, envelope, rank = ARGV[4], tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7])
local before = head_score(k.due)
local old = rcall('HGET', k.items, id)
local held = rcall('HGET', k.leased, id)
local deferred = held and string.find(held, ':deferred:', 1, true)
local score = finite(rcall('ZSCORE', k.due, id))
local calls, stored, superseded = 1, 1, ''
if old and score and (not held or deferred) then
  -- a pending run: this call joins it
  calls = (whole(rcall('HGET', k.calls, 'calls')) or 1) + 1
  if debounce then
    if deferred then rcall('HDEL', k.leased, id) end
    rcall('ZADD', k.due, ms(ready), id)
  else
    ready = score
    if deferred then ready = finite(string.match(held, ':(%-?%d+)$')) or score end
  end
  if keep_last then
    superseded = old
    rcall('HSET', k.items, id, envelope)
  else
    stored = 0
    rank = rank_of(k.ranked, id)
  end
  set_rank(k.ranked, id, rank, debounce and ready or score)
else
  -- no run, or one a forwarder holds (it may be out already): this call starts the next
  rcall('HDEL', k.tries, id)
  rcall('HDEL', k.leased, id)
  rcall('ZADD', k.due, ms(ready), id)
  rcall('HSET', k.items, id, envelope)
  set_rank(k.ranked, id, rank, ready)
end
rcall('HSET', k.calls, 'calls', calls)
-- counted until ARGV[8] ms after the run is due, or after now for a run already overdue
local due = math.max(finite(rcall('ZSCORE', k.due, id)), now_ms('0'))
rcall('PEXPIREAT', k.calls, ms(due + tonumber(ARGV[8])))
wake_if_earlier(k.due, ARGV[3], before)
return {calls, ms(ready), stored, superseded}
