--[[ A group's policy and rate bucket (keys.group_policy_key, keys.group_bucket_key), read and
applied by the script that takes the group's slots (slot_take.lua). The keys come as
parameters: the including script lists them in its KEYS.
Everything read back is checked before use (forwarders and operators write these keys, a hand
write may too) and garbage never stops a group for long: a policy field out of range is
dropped and reported (the item's values apply), a throttle further ahead than
MAX_THROTTLE_MS is dropped, a bucket out of range starts full again.
A rate is a token bucket per group shared by every forwarder: it refills at the rate and holds
BURST_MS worth (at least one token): a forwarder late to ask by up to that long (a stalled
process, a slow pass) loses no tokens, and no window of T ms releases more than T + BURST_MS
worth. An item takes its cost when the bucket holds that much (or
is full, for an item costing more than the bucket holds): the bucket may go into debt, at most
MAX_DEBT_MS worth, which later items wait out, so a rate holds for costly items too. ]]
--- @include "numbers"

local MAX_THROTTLE_MS = 86400000
local MAX_DEBT_MS = 3600000
local BURST_MS = 500  -- group_policies.RATE_BURST_MS
local MAX_WEIGHT = 1000
local MAX_PER_MS = 1000  -- 10^6 per second
local RATE_UNITS = {s = 1000, m = 60000, h = 3600000}

-- Tokens per ms of a rate written "N/s", "N/m" or "N/h" (N > 0), else nil.
local function rate_per_ms(text)
  if type(text) ~= 'string' then return nil end
  local amount, unit = string.match(text, '^([^/]+)/([smh])$')
  local n = finite(amount)
  if not n or n <= 0 or n / RATE_UNITS[unit] > MAX_PER_MS then return nil end
  return n / RATE_UNITS[unit]
end

-- The group's policy: each field of the hash at `key` that is valid, over `given` (limit,
-- per_ms, weight: the item's values); fields out of range are deleted and named in `reset`.
-- Returns {limit, per_ms, weight, paused (who, or nil), throttled_until (ms, nil unless after now)}.
local function read_policy(key, given, now, reset)
  local f = rcall('HMGET', key, 'limit', 'rate', 'weight', 'paused', 'throttled_until')
  local p = {limit = given.limit, per_ms = given.per_ms, weight = given.weight}
  local dropped = {}
  local function drop(name, raw)
    dropped[#dropped + 1] = name
    reset[#reset + 1] = 'policy ' .. name .. '=' .. string.sub(raw, 1, 40)
  end
  if f[1] then
    local v = whole(f[1])
    if v and v >= 1 and v <= 1000000 then p.limit = v else drop('limit', f[1]) end
  end
  if f[2] then
    local v = rate_per_ms(f[2])
    if v then p.per_ms = v else drop('rate', f[2]) end
  end
  if f[3] then
    local v = finite(f[3])
    if v and v > 0 and v <= MAX_WEIGHT then p.weight = v else drop('weight', f[3]) end
  end
  if f[4] then
    if #f[4] > 0 and #f[4] <= 200 then p.paused = f[4] else drop('paused', f[4]) end
  end
  if f[5] then
    local v = whole(f[5])
    if v and v <= now + MAX_THROTTLE_MS then
      if v > now then p.throttled_until = v end
    else
      drop('throttled_until', f[5])
      dropped[#dropped + 1] = 'throttled_by'
    end
  end
  if #dropped > 0 then rcall('HDEL', key, unpack(dropped)) end
  return p
end

-- Throttle the group at `key` until `until_ms` (unless throttled longer already), naming `by`.
local function throttle(key, until_ms, by)
  local current = whole(rcall('HGET', key, 'throttled_until'))
  if not current or current < until_ms then
    rcall('HSET', key, 'throttled_until', ms(until_ms), 'throttled_by', by)
  end
end

-- The rate bucket at `key` for a rate of `per_ms`, refilled up to now: {key, per_ms, burst,
-- floor (the deepest debt), tokens, taken}; garbage starts a full bucket and is named in `reset`.
local function read_bucket(key, per_ms, now, reset)
  local b = {key = key, per_ms = per_ms, burst = math.max(1, math.ceil(per_ms * BURST_MS)), taken = false}
  b.floor = -per_ms * MAX_DEBT_MS
  local f = rcall('HMGET', key, 'tokens', 'at')
  local tokens, at = finite(f[1]), finite(f[2])
  if not tokens or tokens < b.floor or tokens > b.burst or not at or at > now then
    if f[1] or f[2] then
      reset[#reset + 1] = 'bucket tokens=' .. string.sub(tostring(f[1]), 1, 40) .. ' at=' .. string.sub(tostring(f[2]), 1, 40)
    end
    tokens, at = b.burst, now
  end
  b.tokens = math.min(b.burst, tokens + (now - at) * per_ms)
  return b
end

-- Take `cost` tokens from bucket `b`: nil when taken, else the ms at which it holds them.
local function take_tokens(b, cost, now)
  local need = math.min(cost, b.burst)
  if b.tokens >= need then
    b.tokens = math.max(b.floor, b.tokens - cost)
    b.taken = true
    return nil
  end
  return now + math.ceil((need - b.tokens) / b.per_ms)
end

-- Write bucket `b` back if tokens were taken; it expires once full again (a missing bucket is full).
local function save_bucket(b, now)
  if not b.taken then return end
  rcall('HSET', b.key, 'tokens', string.format('%.6f', b.tokens), 'at', ms(now))
  rcall('PEXPIRE', b.key, ms(math.ceil((b.burst - b.tokens) / b.per_ms) + 1000))
end
