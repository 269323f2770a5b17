--[[ Debounce or throttle one key: however many calls, one pending run per item id.
Input:
  KEYS[1..8] the shard's keys (see includes/common.lua)
  KEYS[9] the id's call counter, a HASH {calls}
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
--- @include "common"
local debounce, keep_last = ARGV[1] == 'debounce', ARGV[2] == 'last'
local id, ready, envelope, rank = ARGV[4], tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7])
local bad_types = check_types()
if bad_types then return bad_types end
local counter = redis.pcall('HLEN', KEYS[9])
if type(counter) == 'table' and counter.err then
  return redis.error_reply('WRONGTYPE delayq key ' .. KEYS[9] .. ' is not a hash: it was written by another ' ..
    'tool; move it away (RENAME) so this key can be debounced again')
end
local before = head_score()
local old = rcall('HGET', KEYS[2], id)
local held = rcall('HGET', KEYS[4], id)
local deferred = held and string.find(held, ':deferred:', 1, true)
local score = finite(rcall('ZSCORE', KEYS[1], id))
local calls, stored, superseded = 1, 1, ''
if old and score and (not held or deferred) then
  -- a pending run: this call joins it
  calls = (whole(rcall('HGET', KEYS[9], 'calls')) or 1) + 1
  if debounce then
    if deferred then rcall('HDEL', KEYS[4], id) end
    rcall('ZADD', KEYS[1], ms(ready), id)
  else
    ready = score
    if deferred then ready = finite(string.match(held, ':(%-?%d+)$')) or score end
  end
  if keep_last then
    superseded = old
    rcall('HSET', KEYS[2], id, envelope)
  else
    stored = 0
    rank = rank_of(id)
  end
  set_rank(id, rank, debounce and ready or score)
else
  -- no run, or one a forwarder holds (it may be out already): this call starts the next
  rcall('HDEL', KEYS[3], id)
  rcall('HDEL', KEYS[4], id)
  rcall('ZADD', KEYS[1], ms(ready), id)
  rcall('HSET', KEYS[2], id, envelope)
  set_rank(id, rank, ready)
end
rcall('HSET', KEYS[9], 'calls', calls)
-- counted until ARGV[8] ms after the run is due, or after now for a run already overdue
local due = math.max(finite(rcall('ZSCORE', KEYS[1], id)), now_ms('0'))
rcall('PEXPIREAT', KEYS[9], ms(due + tonumber(ARGV[8])))
wake_if_earlier(ARGV[3], before)
return {calls, ms(ready), stored, superseded}
