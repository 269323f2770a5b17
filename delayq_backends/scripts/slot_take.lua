#!lua flags=allow-oom
--[[ Take concurrency slots of one slot key (a group) for items about to be released, in the
key's order, as the group's policy allows (paused, throttled, its rate: includes/policy.lua).
Input:
  KEYS[1] holds    ZSET member -> ms at which the hold lapses (a running item's slot)
  KEYS[2] waiting  ZSET member -> order (rank band + ready ms): the line of items waiting
  KEYS[3] waits    ZSET member -> ms at which a waiting entry lapses unless its item asks again
  KEYS[4] limit    STRING: the key's limit set at runtime, else none
  KEYS[5] tokens   HASH member -> SHA-1 of the token minted with its hold (forwarders write it)
  KEYS[6] reports  HASH the workers' reports on their holds (see keys.slot_reports_key)
  KEYS[7] policy   HASH the group's runtime policy (see keys.group_policy_key), and the limit its
          items carry (field "carried", written here)
  KEYS[8] bucket   HASH the group's rate token bucket: tokens, at (ms of the last refill)
  ARGV[1] the asking items' limit, used while KEYS[4] holds none ("0": unlimited); recorded as the
          policy's "carried" when items ask, and the recorded one used when they carry none
          or none asks (a look: the forwarder's guess)
  ARGV[2] hold ms: how long a granted slot is held for its worker to start the item (the start
          window; only a start reported with the hold's token extends it)
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
  ARGV[6] most ms a reported start, beat or throttle holds from now (the cap, whatever a worker asks)
  ARGV[7] the asking items' rate ("N/s", "N/m", "N/h"; ""), used while KEYS[7] sets none
  ARGV[8] the asking items' weight (""), used while KEYS[7] sets none (else 1)
  ARGV[9..] member, order, token, cost: the asking items (token "": a hold any report may end;
          cost: the tokens of the group's rate the item takes, a whole number >= 1)
Output: {limit (0: none), holds after the call, reset, places, heads, reasons, paused,
throttled until, rate until, weight, rate}: places per asking item -1 (granted: its hold is taken), -2
(refused: "skip"/"buffer", the period is skipped) or its place in the line (0: next; 0 also for
an item refused with no line, its group unlimited), as an array of its own (a batch's items can
pass Lua's unpack limit). reset: "" or what was found out of place and dropped, for the caller
to log. heads: the first items in line a free slot waits for that do not ask now (at most 100;
"take" mode, or no item asking; none while the group can grant nothing), for the caller to
bring forward. reasons: per asking item "" (granted, or only joined or left) or why it was
refused: "limit", "rate", "paused", "throttled". paused: 1 when paused. throttled until: ms
(0: not throttled). rate until: when an item was refused for the rate (or, with none asking, the
bucket holds less than a token), the ms at which the bucket holds what the first refused one
costs (0: none). weight: the group's, as text. rate: the rate applied, tokens per second as
text ("": none).
The policy applies over the items' values: its limit over the older limit STRING (KEYS[4]) over
ARGV[1]; its rate over ARGV[7]; its weight over ARGV[8]. A paused or throttled group grants
nothing (its items take their places in line); otherwise a free slot goes to the head of the
line only while the rate's bucket holds the head's cost, and a refusal keeps the order (no
item behind it is granted in the call). An item that holds its slot already (a second copy)
keeps it, whatever the policy: it was admitted. A worker's report "throttle:<sha1 of its
hold's token>:<ms>" throttles the group for that long (at most ARGV[6]): a worker throttles
only a group whose item it runs (never by a tokenless hold: a periodic run's, an earlier
release's).
Workers only report (KEYS[6]); every hold is written here: a report counts only with the token
its hold was granted with (a start or beat names its SHA-1, an end the token itself), so a
worker credential can neither end nor extend a hold it was not given, nor add one. A start or
beat holds at most ARGV[6] from now. Reports are read first (at most BUDGET a call; while more
wait, no hold lapses this call: a slot is kept, never given away on a report not yet read).
A free slot goes to the head of the line, asking or not: an item that waits keeps its place
while it is deferred, so the items of a key go in their order. Lapsed holds (a worker that
died, a message never started) and lapsed waits (an item cancelled while it waited) are dropped
first. Garbage never blocks the line: a key of another type is made to expire at once and
nothing is granted this call; a hold lapsing further ahead than the cap or a wait over a day
ahead and a waiting entry with no wait are dropped; a runtime limit that is no whole number in
1..10^6 is ignored. An item that holds a slot already (a forwarder that crashed after taking
it, a second copy released) keeps it, under the new token and the one before (either copy may
report it).
allow-oom: a slotted key must drain a full store too (the entries are a few bytes). ]]
--- @include "numbers"
--- @include "policy"
--- @include "batch"
local holds, waiting, waits, tokens, reports = KEYS[1], KEYS[2], KEYS[3], KEYS[5], KEYS[6]
local policy_key, bucket_key = KEYS[7], KEYS[8]
local hold_ms, wait_ms, cap = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[6])
local now = now_ms(ARGV[4])
local MAX_AHEAD = 86400000
local BUDGET = 1000  -- most garbage entries dropped per call: a hostile line costs a few calls
local CARRIED_MS = 86400000  -- how long a carried limit holds after the last item that carried it
local CARRIED_REFRESH_MS = 60000  -- how often a take writes the same carried limit again
local CARRIED_SKEW_MS = 60000  -- a record this far ahead of the clock is garbage
local reset = {}
local join = ARGV[5] == 'join'
local n = (#ARGV - 8) / 4
local places, reasons = {}, {}
local pol = {weight = 1}
local rate_until
-- the reply: what the call did, and the group's state as this call found it
local function reply(limit, held, heads)
  return {
    limit, held, table.concat(reset, ' '), places, heads or {}, reasons, pol.paused and 1 or 0,
    pol.throttled_until or 0, rate_until or 0, string.format('%.6g', pol.weight),
    pol.per_ms and string.format('%.9g', pol.per_ms * 1000) or '',
  }
end
local wanted = {'zset', 'zset', 'zset', 'string', 'hash', 'hash', 'hash', 'hash'}
for i = 1, 8 do
  local kind = rcall('TYPE', KEYS[i])['ok']
  if kind ~= 'none' and kind ~= wanted[i] then
    rcall('PEXPIRE', KEYS[i], 1)
    reset[#reset + 1] = KEYS[i] .. ' type=' .. kind
  end
end
local overlap = ARGV[5] == 'skip' or ARGV[5] == 'buffer'
if #reset > 0 then  -- gone in a ms: the items ask again after a short wait (a period: skipped)
  for i = 1, n do
    places[i] = overlap and -2 or 0
    reasons[i] = 'limit'
  end
  return reply(0, 0)
end
-- item i's member (0), order (1), token (2), cost (3)
local function arg(i, k) return ARGV[5 + 4 * i + k] end
if ARGV[5] == 'leave' then
  for i = 1, n do
    rcall('ZREM', waiting, arg(i, 0))
    rcall('ZREM', waits, arg(i, 0))
    places[i] = -1
    reasons[i] = ''
  end
  return reply(0, 0)
end
-- the limit the items carry, recorded in the policy hash (field "carried": "<limit>:<ms seen>")
-- so that it holds for every forwarder whatever it learned, for an item of the group named by
-- key alone, and in a look with no item asking (the release step's room); it lapses a day after
-- the last item that carried it
local asked = whole(ARGV[1]) or 0
local recorded = rcall('HGET', policy_key, 'carried')
local carried, seen
if recorded then
  local v, at = string.match(recorded, '^(%d+):(%d+)$')
  v, at = whole(v), whole(at)
  if v and v >= 1 and v <= 1000000 and at and at <= now + CARRIED_SKEW_MS then
    if now - at < CARRIED_MS then carried, seen = v, at end
  else
    rcall('HDEL', policy_key, 'carried')
    reset[#reset + 1] = 'policy carried=' .. string.sub(recorded, 1, 40)
  end
end
local limit = asked
if n > 0 and asked >= 1 and asked <= 1000000 then
  if carried ~= asked or now - seen >= CARRIED_REFRESH_MS then
    rcall('HSET', policy_key, 'carried', ms(asked) .. ':' .. ms(now))
  end
elseif carried then
  limit = carried
end
local set = rcall('GET', KEYS[4])
if set then
  local v = whole(set)
  if v and v >= 1 and v <= 1000000 then limit = v else reset[#reset + 1] = 'limit=' .. string.sub(set, 1, 40) end
end
-- a server without it (fakeredis, the in-process testing store) keeps tokens as they are
local sha1hex = redis.sha1hex or function(s) return s end
local function drop_hold(m)
  rcall('ZREM', holds, m)
  rcall('HDEL', tokens, m)
end
-- a report counts only for a hold granted with the token it proves (or a tokenless hold, from
-- an earlier release, and a tokenless report): a start or beat names the token's SHA-1, an end
-- the token itself (shown only once the task is over)
local forged, late = 0, {}
local function fold(field, report)
  local m = string.match(field, '^(.*)\n[^\n]*$')
  local kind, proof, asked = string.match(report, '^(%a+):([^:]*):?(%d*)$')
  if not m or not kind then forged = forged + 1 return end
  local held, want = rcall('ZSCORE', holds, m), rcall('HGET', tokens, m) or ''
  if kind == 'end' then
    proof = proof ~= '' and sha1hex(proof) or ''
  elseif (kind ~= 'start' and kind ~= 'beat' and kind ~= 'throttle') or not whole(asked)
    or (kind == 'throttle' and proof == '') then  -- a throttle stops a whole group: never tokenless
    forged = forged + 1
    return
  end
  if not held then  -- lapsed, ended or given back before this report: nothing to do
    if kind == 'start' and #late < 5 then late[#late + 1] = string.sub(m, 1, 40) end
    return
  end
  -- want: the hold's token's SHA-1, and its previous one when a second copy took it over
  if proof ~= want and (proof == '' or not string.find(' ' .. want .. ' ', ' ' .. proof .. ' ', 1, true)) then
    forged = forged + 1
    return
  end
  if kind == 'end' then
    drop_hold(m)
  elseif kind == 'throttle' then
    throttle(policy_key, now + math.min(whole(asked), cap), 'worker:' .. string.sub(m, 1, 80))
  else
    rcall('ZADD', holds, ms(now + math.min(whole(asked), cap)), m)
  end
end
local listed = rcall('HSCAN', reports, 0, 'COUNT', BUDGET)
local read, ends = listed[2], {}
for i = 1, #read, 2 do  -- starts, beats, throttles first: a short task's start and end come in one read
  rcall('HDEL', reports, read[i])
  if string.sub(read[i + 1], 1, 4) == 'end:' then ends[#ends + 1] = i else fold(read[i], read[i + 1]) end
end
for _, i in ipairs(ends) do fold(read[i], read[i + 1]) end
if forged > 0 then reset[#reset + 1] = 'reports without their hold\'s token=' .. forged end
if #late > 0 then reset[#reset + 1] = 'started after their hold lapsed (may run over the limit)=' .. table.concat(late, ',') end
if listed[1] ~= '0' then
  reset[#reset + 1] = 'reports waiting past one call (no hold lapses until they are read)'
else
  for _, m in ipairs(rcall('ZRANGEBYSCORE', holds, '-inf', ms(now), 'LIMIT', 0, BUDGET)) do drop_hold(m) end
end
local ahead = rcall('ZRANGEBYSCORE', holds, '(' .. ms(now + math.max(cap, hold_ms)), '+inf', 'LIMIT', 0, BUDGET)
for _, m in ipairs(ahead) do drop_hold(m) end
if #ahead > 0 then reset[#reset + 1] = 'holds past the cap=' .. string.sub(ahead[1], 1, 40) end
local lapsed = rcall('ZRANGEBYSCORE', waits, '-inf', ms(now), 'LIMIT', 0, BUDGET)
for _, m in ipairs(rcall('ZRANGEBYSCORE', waits, '(' .. ms(now + MAX_AHEAD), '+inf', 'LIMIT', 0, BUDGET)) do
  lapsed[#lapsed + 1] = m
end
for _, m in ipairs(lapsed) do
  rcall('ZREM', waits, m)
  rcall('ZREM', waiting, m)
end
-- the policy over the items' values: its limit over the older STRING (read above) over theirs
local given_weight = finite(ARGV[8])
pol = read_policy(policy_key, {
  limit = limit,
  per_ms = rate_per_ms(ARGV[7]),
  weight = given_weight and given_weight > 0 and given_weight <= MAX_WEIGHT and given_weight or 1,
}, now, reset)
limit = pol.limit
local blocked = (pol.paused and 'paused') or (pol.throttled_until and 'throttled') or nil
local bucket = pol.per_ms and read_bucket(bucket_key, pol.per_ms, now, reset)
-- why an item costing `cost` may not go now (nil: it may, its tokens taken); after one refusal
-- for the rate every later item of the call is refused too, so none passes an earlier one
local function refusal(cost)
  if blocked then return blocked end
  if rate_until then return 'rate' end
  if bucket then
    rate_until = take_tokens(bucket, cost, now)
    if rate_until then return 'rate' end
  end
  return nil
end
local function cost_of(i) return math.max(1, whole(arg(i, 3)) or 1) end
local function grant(m, token)  -- a member held already (a second copy) keeps its last token too
  local before = rcall('ZSCORE', holds, m) and string.match(rcall('HGET', tokens, m) or '', '^%x+')
  rcall('ZADD', holds, ms(now + hold_ms), m)
  if token == '' then
    rcall('HDEL', tokens, m)
  else
    rcall('HSET', tokens, m, sha1hex(token) .. (before and (' ' .. before) or ''))
  end
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
-- the bucket's state, kept if tokens were taken; with none asking, when its next token comes
local function settle()
  if not bucket then return end
  save_bucket(bucket, now)
  if n == 0 and bucket.tokens < 1 then rate_until = now + math.ceil((1 - bucket.tokens) / bucket.per_ms) end
end
if overlap then
  for i = 1, n do
    local m, order = arg(i, 0), arg(i, 1)
    local first = head()
    local mine = not first or first == m
    local why = (not mine and 'limit') or (limit > 0 and rcall('ZCARD', holds) >= limit and 'limit') or refusal(cost_of(i))
    if not why then
      grant(m, arg(i, 2))
      places[i] = -1
    elseif mine and ARGV[5] == 'buffer' then
      rcall('ZADD', waiting, order, m)
      rcall('ZADD', waits, ms(now + wait_ms), m)
      places[i] = 0
    else
      places[i] = -2
    end
    reasons[i] = why or ''
  end
  settle()
  return reply(limit, rcall('ZCARD', holds))
end
-- The common take: nobody waits in line, the group is not stopped and has no rate. Items that
-- hold nothing then take free slots in their order with no place in line, written in bulk: a
-- release of a group's backlog costs a few commands per item, not a dozen. The first item that
-- finds no free slot joins the line as below, and so does every item after it.
local quick = not join and not blocked and not bucket and rcall('ZCARD', waiting) == 0
local free_now = limit > 0 and limit - rcall('ZCARD', holds) or nil
local quick_holds, quick_tokens = {}, {}
local function take_quick(i)
  local m, token = arg(i, 0), arg(i, 2)
  quick_holds[#quick_holds + 1], quick_holds[#quick_holds + 2] = ms(now + hold_ms), m
  if token == '' then
    rcall('HDEL', tokens, m)
  else
    quick_tokens[#quick_tokens + 1], quick_tokens[#quick_tokens + 2] = m, sha1hex(token)
  end
  places[i] = -1
end
local asking = {}
for i = 1, n do
  local m, order = arg(i, 0), arg(i, 1)
  reasons[i] = ''
  if rcall('ZSCORE', holds, m) then
    if not join then grant(m, arg(i, 2)) end
    places[i] = -1
  elseif quick and (not free_now or free_now > 0) then
    take_quick(i)
    free_now = free_now and free_now - 1
  elseif limit == 0 then  -- unlimited: no line to join
    local why = not join and refusal(cost_of(i))
    if not why then
      if not join then grant(m, arg(i, 2)) end
      places[i] = -1
    else
      places[i], reasons[i] = 0, why
    end
  else
    rcall('ZADD', waiting, order, m)
    rcall('ZADD', waits, ms(now + wait_ms), m)
    asking[m] = i
    quick = false
  end
end
variadic('ZADD', holds, quick_holds)
variadic('HSET', tokens, quick_tokens)
local stopped = blocked  -- why the line stopped before its free slots were taken
if limit > 0 and not join and not blocked then
  local free, offset, budget = limit - rcall('ZCARD', holds), 0, BUDGET
  while free > 0 and budget > 0 and not stopped do
    local line = rcall('ZRANGE', waiting, offset, offset + free - 1)
    if #line == 0 then break end
    for _, m in ipairs(line) do
      if stopped then break end
      if not rcall('ZSCORE', waits, m) then  -- no wait behind it: not an item's place
        rcall('ZREM', waiting, m)
        budget = budget - 1
        if #reset < 5 then reset[#reset + 1] = 'waiting entry=' .. string.sub(m, 1, 40) end
      elseif asking[m] then
        stopped = refusal(cost_of(asking[m]))
        if not stopped then
          free = free - 1
          grant(m, arg(asking[m], 2))
          places[asking[m]] = -1
        end
      else
        free = free - 1
        offset = offset + 1  -- its item is deferred: the place stays its own
      end
    end
  end
end
for m, i in pairs(asking) do
  if not places[i] then
    places[i] = rcall('ZRANK', waiting, m)
    reasons[i] = join and '' or stopped or 'limit'
  end
end
settle()
-- the places a free slot waits for (deferred items, not asking now): for the caller to bring
-- forward, so ends read here reach the head of the line within a pass (a take, or a look with no
-- item asking; not a pass's join); none while the group can grant nothing
local heads = {}
local held = rcall('ZCARD', holds)
if limit > held and (ARGV[5] == 'take' or n == 0) and not blocked and not rate_until then
  for _, m in ipairs(rcall('ZRANGE', waiting, 0, math.min(limit - held, 100) - 1)) do
    local lapses = finite(rcall('ZSCORE', waits, m))
    if lapses and lapses > now and not asking[m] then heads[#heads + 1] = m end
  end
end
return reply(limit, held, heads)
