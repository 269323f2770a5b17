--[[ One RQ job scheduled in one call: the writes RQ's schedule_job queues for it (its queue in
rq:queues, its job hash), its mirror entry in rq:scheduled:<queue>, then its delay store item
(includes/schedule_item.lua). One script instead of a MULTI/EXEC of those writes beside schedule_one's
EVAL: a producer packs and parses one command, not seven, and the server hashes no script text.
Atomic as the transaction was: a NOSCRIPT refusal writes nothing, and at maxmemory the first write
is refused before anything is written. The store's item comes last, so a job key of another type
(written by another tool) fails the call before the item that would point at it.
Input:
  KEYS[1] due, KEYS[2] items, KEYS[3] tries, KEYS[4] leased, KEYS[5] ranked (the item's shard)
  KEYS[6] rq:queues, KEYS[7] the job hash, KEYS[8] rq:scheduled:<queue>
  ARGV[1] id (the job id), ARGV[2] ready ms, ARGV[3] envelope, ARGV[4] rank, ARGV[5] wake channel
  ARGV[6] the queue's key (rq:queue:<name>), ARGV[7] the mirror entry's score
  ARGV[8..] the job hash's field/value pairs, in the order RQ wrote them (a later one wins)
Output: {added, replaced, 0}, as schedule_one.lua ]]
--- @include "schedule_item"
rcall('SADD', KEYS[6], ARGV[6])
rcall('HSET', KEYS[7], unpack(ARGV, 8))
rcall('ZADD', KEYS[8], ARGV[7], ARGV[1])
local added = schedule_item(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
return {added, 1 - added, 0}
