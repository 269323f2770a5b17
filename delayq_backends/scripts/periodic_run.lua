--[[ Record one event of one run of a periodic entry in the entry's history: "published" (a
forwarder, after the broker confirmed the run and the entry was rearmed), "started" or
"finished" (a worker); or "missed": periods a firing ran none of (no run is recorded). Events may arrive in any order (a worker can start a run before its
forwarder records the publish): each fills its own fields of the run's record.
A key of another type, or a record or counter that is no JSON or number (a hand write), reads as
absent and is replaced: history never stops a firing or a worker.
Input:
  KEYS[1] history: HASH "run:<run id>" -> record, counters "missed", "late", "last_success"
  KEYS[2] runs: ZSET run id -> due ms (the order, and which records to drop past the bound)
  ARGV[1] event: "published", "started", "finished" or "missed", ARGV[2] the run id (task/job id),
  ARGV[3] its period's due ms, ARGV[4] now ms (0: the server's TIME),
  ARGV[5] kind: "scheduled", "manual" or "backfill" (a worker's event: "" keeps the record's),
  ARGV[6] published, missed: periods missed at this firing; finished: the outcome ("success",
  "failure", "retry", "revoked"), ARGV[7] runs kept at most, ARGV[8] TTL ms of both keys,
  ARGV[9] lateness (ms) past which a published run counts as late (a backfill's run never is: it
  was asked for now, for a period long past)
A record is "<due>:<kind>:<published>:<started>:<finished>:<outcome>", the three times as ms after
the due time ("" while not recorded): short enough (< 64 bytes) for Redis to keep the hash as a
listpack: 7.3 KB an entry at 50 runs (measured; 18 KB as JSON).
Output: 1: recorded; 0: a published event of a run already recorded as published (not
counted twice) ]]
--- @include "numbers"
local history, runs = KEYS[1], KEYS[2]
local event, run, due, now = ARGV[1], ARGV[2], whole(ARGV[3]) or 0, now_ms(ARGV[4])
local kind, detail, keep, ttl, late_ms = ARGV[5], ARGV[6], whole(ARGV[7]) or 1, whole(ARGV[8]) or 1, whole(ARGV[9]) or 0

for _, pair in ipairs({{history, 'hash'}, {runs, 'zset'}}) do
  local found = rcall('TYPE', pair[1])['ok']
  if found ~= 'none' and found ~= pair[2] then rcall('DEL', pair[1]) end
end

-- a counter that is no whole number (a hand write) starts again from 0
local function count(field, by)
  if not whole(rcall('HGET', history, field)) then rcall('HSET', history, field, '0') end
  rcall('HINCRBY', history, field, by)
end

local function expire()
  rcall('PEXPIRE', history, ttl)
  rcall('PEXPIRE', runs, ttl)
end

if event == 'missed' then
  count('missed', whole(detail) or 0)
  expire()
  return 1
end

local field = 'run:' .. run
-- the stored record, or an empty one for none or one no release wrote (a hand write)
local record = {}
local raw = rcall('HGET', history, field)
if raw then
  local _, k, p, s, f, o = string.match(raw, '^(%d+):(%a+):(%-?%d*):(%-?%d*):(%-?%d*):(%a*)$')
  if k then
    record = {kind = k, published = tonumber(p), started = tonumber(s), finished = tonumber(f)}
    if o ~= '' then record.outcome = o end
  end
end
if kind ~= '' then record.kind = kind end
if record.kind == nil then record.kind = 'scheduled' end
local after = now - due

local code = 1
if event == 'published' then
  if record.published ~= nil then
    code = 0
  else
    record.published = after
    local missed = whole(detail) or 0
    if missed > 0 then count('missed', missed) end
    if record.kind ~= 'backfill' and now - due > late_ms then count('late', 1) end
  end
elseif event == 'started' then
  record.started, record.finished, record.outcome = after, nil, nil
elseif event == 'finished' then
  record.finished, record.outcome = after, detail
  if detail == 'success' then
    local last = whole(rcall('HGET', history, 'last_success'))
    if not last or now > last then rcall('HSET', history, 'last_success', ms(now)) end
  end
end
local function offset(t) return t and ms(t) or '' end
rcall('HSET', history, field, table.concat({ms(due), record.kind, offset(record.published), offset(record.started),
  offset(record.finished), record.outcome or ''}, ':'))
rcall('ZADD', runs, due, run)

local size = rcall('ZCARD', runs)
if size > keep then
  local dropped = rcall('ZRANGE', runs, 0, size - keep - 1)
  rcall('ZREMRANGEBYRANK', runs, 0, size - keep - 1)
  for _, old in ipairs(dropped) do rcall('HDEL', history, 'run:' .. old) end
end
expire()
return code
