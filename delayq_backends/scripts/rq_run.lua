--[[ New RQ jobs written and pushed onto their queue as RQ's Queue.enqueue does (the job hash with
status "queued", the TTL's EXPIRE, the RPUSH, the queue in rq:queues), in one call: the runs of
RQ periodic entries (delayq_backends.rq.entries). A job whose hash exists already is left alone
and not pushed again: a second send of one run (same job id, a forwarder killed between the
publish and its rearm) enqueues it once, while its hash lives (RQ deletes it result_ttl after
a success, failure_ttl after a failure, or ttl after the enqueue when one is set).
Input:
  KEYS[1] rq:queues, KEYS[2] rq:queue:<name>, KEYS[3..] one job hash per job (rq:job:<id>)
  per job, in KEYS order: ARGV its job id, its TTL in seconds ("" for none), n, then n
  field/value pairs of its hash
Output: per job, "=" written and pushed, "~" its hash existed (left alone, not pushed) ]]
local out, pushed = {}, {}
local at = 1
for i = 3, #KEYS do
  local key, job_id, ttl, n = KEYS[i], ARGV[at], ARGV[at + 1], tonumber(ARGV[at + 2])
  local first = at + 3
  at = first + 2 * n
  if redis.call('EXISTS', key) == 1 then
    out[#out + 1] = '~'
  else
    redis.call('HSET', key, unpack(ARGV, first, at - 1))
    if ttl ~= '' then redis.call('EXPIRE', key, ttl) end
    pushed[#pushed + 1] = job_id
    out[#out + 1] = '='
  end
end
if #pushed > 0 then
  redis.call('RPUSH', KEYS[2], unpack(pushed))
  redis.call('SADD', KEYS[1], KEYS[2])
end
return out
