--[[ Move due RQ jobs of one queue into it as RQ's scheduler does (Queue._enqueue_job for a job
without dependencies), and, on the delay store's own server, ack their store items in the same
step: one call per batch instead of WATCH, reads and MULTI/EXEC (the forwarder's rq target).

Only the usual job is moved here: a hash whose status is "scheduled" and that has no TTL,
dependency, rate limit, retry-at-front flag or dead-letter mark. The jobs are taken in order;
at the first one that is not usual (or whose key is not a hash) the call stops and returns how
many it handled, so the caller moves that job and the rest by the general path and the queue
ends in the order one push per job would give.
Input:
  KEYS[1] rq:queues, KEYS[2] rq:queue:<name>, KEYS[3] rq:scheduled:<name>
  with ARGV[1] a lease: KEYS[4..7] the store shard's due, items, tries, leased (see ack.lua)
  then one job hash (rq:job:<id>) per job
  ARGV[1] the claim's lease ("<deadline>:<token>"), or "" when the store is elsewhere (no
          lease check, no ack: the caller acks), ARGV[2] origin (the queue's name),
  ARGV[3] enqueued_at (RQ's format), ARGV[4] the queue's default timeout,
  ARGV[5..] per job: its store item id, its job id
Output: {handled, outcome per handled job}: "=" moved, "-" hash gone (acked, as RQ drops it),
"~" no longer under the lease (left alone), else the status it had instead of "scheduled"
(acked, not moved: cancelled, or moved already). ]]
--- @include "batch"
local lease = ARGV[1]
local first = lease == '' and 4 or 8
local k = {queues = KEYS[1], queue = KEYS[2], scheduled = KEYS[3]}
if lease ~= '' then k.due, k.items, k.tries, k.leased = KEYS[4], KEYS[5], KEYS[6], KEYS[7] end
local n = #KEYS - first + 1
local items, jobs = {}, {}
for i = 1, n do
  items[i], jobs[i] = ARGV[3 + 2 * i], ARGV[4 + 2 * i]
end
local helds = lease ~= '' and hmget(k.leased, items) or {}
local mark = lease .. ':'

-- the fields RQ's enqueue decides by; a job with any of the rare ones takes the general path
local FIELDS = {'status', 'timeout', 'enqueue_at_front', 'allow_dependency_failures', 'rate_limit_concurrency',
                'ttl', 'enqueue_at_front_on_retry', 'dependency_ids', 'dependency_id', 'rate_limit_key',
                'delayq_dead_letter'}
local FLAG = {['0'] = true, ['1'] = true}

local out, back, front, done_items, done_jobs = {0}, {}, {}, {}, {}
local handled = 0
for i = 1, n do
  local key = KEYS[first + i - 1]
  local held = helds[i]
  if lease ~= '' and not (held and string.find(held, mark, 1, true) == 1) then
    out[#out + 1] = '~'
  else
    local v = redis.pcall('HMGET', key, unpack(FIELDS))
    if type(v) == 'table' and v.err then break end  -- not a hash: the general path names its type
    local usual = not (v[6] or v[7] or v[8] or v[9] or v[10] or v[11])
      and (not v[3] or FLAG[v[3]]) and (not v[4] or FLAG[v[4]]) and (not v[5] or v[5] == '')
    if not usual then break end
    local status = v[1]
    if not status and redis.call('EXISTS', key) == 0 then
      out[#out + 1] = '-'
    elseif status ~= 'scheduled' then
      out[#out + 1] = status or 'created'  -- as RQ reads a hash without one
    else
      if v[2] then
        redis.call('HSET', key, 'status', 'queued', 'origin', ARGV[2], 'enqueued_at', ARGV[3])
      else
        redis.call('HSET', key, 'status', 'queued', 'origin', ARGV[2], 'enqueued_at', ARGV[3], 'timeout', ARGV[4])
      end
      if v[3] == '1' then front[#front + 1] = jobs[i] else back[#back + 1] = jobs[i] end
      out[#out + 1] = '='
    end
    done_items[#done_items + 1] = items[i]
    done_jobs[#done_jobs + 1] = jobs[i]
  end
  handled = i
end
out[1] = handled
if handled == 0 then return out end
-- one RPUSH of the back and one LPUSH of the front leave the list as one push per job in order
variadic('RPUSH', k.queue, back)
variadic('LPUSH', k.queue, front)
redis.call('SADD', k.queues, k.queue)
variadic('ZREM', k.scheduled, done_jobs)
if lease ~= '' and #done_items > 0 then
  variadic('ZREM', k.due, done_items)
  variadic('HDEL', k.items, done_items)
  variadic('HDEL', k.tries, done_items)
  variadic('HDEL', k.leased, done_items)
end
return out
