--[[ Put RQ jobs whose store items the forwarder dead-lettered into their queue's FailedJobRegistry,
as a worker's failure leaves a job: status "failed", exc_info, a failed Result, an entry in
rq:failed:<queue> (expiring after the job's failure_ttl), none in rq:scheduled:<queue>.
A job is changed only while it still waits for the forwarder: status "scheduled" or, for a
Scheduler job (its status is its last run's), "created", "finished", "failed" or "stopped";
a job RQ holds (queued, started, deferred...) or one cancelled is left alone. The job hash
gets `delayq_dead_letter` = its new ended_at: the forwarder moves a job "failed" with that
mark intact (`delayq dlq requeue`) and skips one whose mark RQ's requeue has outdated.
Input:
  KEYS[1] rq:failed:<queue>, KEYS[2] rq:scheduled:<queue>
  KEYS[3..] pairs: the job hash (rq:job:<id>), its results stream (rq:results:<id>)
  ARGV[1] now, epoch seconds; ARGV[2] ended_at (RQ's format); ARGV[3] RQ's default failure TTL
  ARGV[4..] per job: id, "1" for a Scheduler job, exc_info (zlib, as RQ stores it), the
            Result's exc_string (base64 of zlib, as RQ's Result stores it)
Output: how many jobs were moved ]]
local waiting = {scheduled = 'any', created = 'scheduler', finished = 'scheduler', failed = 'scheduler',
                 stopped = 'scheduler'}
local moved = 0
for i = 3, #KEYS, 2 do
  local job, results = KEYS[i], KEYS[i + 1]
  local a = 4 + (i - 3) * 2
  local id, scheduler, exc_info, exc_string = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  if redis.call('EXISTS', job) == 1 then
    local status = redis.call('HGET', job, 'status') or 'created'
    local when = waiting[status]
    if when == 'any' or (when == 'scheduler' and scheduler == '1') then
      local ttl = tonumber(redis.call('HGET', job, 'failure_ttl') or '') or tonumber(ARGV[3])
      redis.call('HSET', job, 'status', 'failed', 'exc_info', exc_info, 'ended_at', ARGV[2],
                 'delayq_dead_letter', ARGV[2])
      redis.call('XADD', results, 'MAXLEN', '~', 10, '*', 'type', 2, 'worker_name', '', 'exc_string', exc_string)
      redis.call('ZADD', KEYS[1], ttl < 0 and ttl or tonumber(ARGV[1]) + ttl, id)
      redis.call('ZREM', KEYS[2], id)
      if ttl > 0 then
        redis.call('EXPIRE', job, ttl)
        redis.call('EXPIRE', results, ttl)
      end
      moved = moved + 1
    end
  end
end
return moved
