--[[ The job hash writes of RQ's Queue._enqueue_job for a batch of due jobs of one queue, in one
call (the forwarder's rq target queues it inside its MULTI/EXEC, with every job key WATCHed and
read just before, so each is a hash that is still scheduled); the pushes onto the queue are
the caller's.
Input:
  KEYS[1..n] job hashes (rq:job:<id>)
  ARGV[1] status ("queued"), ARGV[2] origin (the queue's name), ARGV[3] enqueued_at
  ARGV[4] the queue's default timeout, ARGV[5] one character per key: "1" writes it (the job
          has no timeout of its own), "0" leaves the field alone
Output: n ]]
local mask = ARGV[5]
for i, key in ipairs(KEYS) do
  if string.byte(mask, i) == 49 then
    redis.call('HSET', key, 'status', ARGV[1], 'origin', ARGV[2], 'enqueued_at', ARGV[3], 'timeout', ARGV[4])
  else
    redis.call('HSET', key, 'status', ARGV[1], 'origin', ARGV[2], 'enqueued_at', ARGV[3])
  end
end
return #KEYS
