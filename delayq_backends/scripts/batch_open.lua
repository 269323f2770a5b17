--[[ Open a batch (see store/batches.py): its hash, with no sub-jobs yet and not closed. A batch
already there and still open is left as it is (an open retried, or a producer starting again);
a key whose batch is closed, or completed within its TTL (its fired mark is there), is refused:
opening it again would open nothing, and its first add would fail.
Input:
  KEYS[1] the batch's hash, KEYS[2] its fired mark (batch_end.lua)
  ARGV[1] the on_complete envelope ("" for none), ARGV[2] the mark in it that completion
          replaces with the summary ("" for none), ARGV[3] now ms, ARGV[4] how long the batch's
          keys last once it completed, in ms, ARGV[5] the batch key
Output: 1 opened, 0 open already, -1 KEYS[1] is no hash (a hand write: the caller says so),
-5 the key's batch is closed or completed (pick a new key), -6 keys that are not the batch's ]]
--- @include "batch_own"
if not batch_own(KEYS[1], ARGV[5], {KEYS[2]}, {'fired'}) then return -6 end
if redis.call('EXISTS', KEYS[2]) == 1 then return -5 end
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'hash' then
  return redis.call('HGET', KEYS[1], 'closed') == '0' and 0 or -5
end
if kind ~= 'none' then return -1 end
redis.call('HSET', KEYS[1], 'closed', '0', 'completed', '0', 'failed', '0', 'created', ARGV[3],
  'ttl', ARGV[4], 'on_complete', ARGV[1], 'mark', ARGV[2])
return 1
