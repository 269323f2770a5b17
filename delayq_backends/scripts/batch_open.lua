--[[ Open a batch (see store/batches.py): its hash, with no sub-jobs yet and not closed. A batch
already there is left as it is (an open retried, or a key used again: its adds are refused once
it is closed).
Input:
  KEYS[1] the batch's hash
  ARGV[1] the on_complete envelope ("" for none), ARGV[2] the mark in it that completion
          replaces with the summary ("" for none), ARGV[3] now ms, ARGV[4] how long the batch's
          keys last once it completed, in ms
Output: 1 opened, 0 there already, -1 KEYS[1] is no hash (a hand write: the caller says so) ]]
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'hash' then return 0 end
if kind ~= 'none' then return -1 end
redis.call('HSET', KEYS[1], 'closed', '0', 'completed', '0', 'failed', '0', 'created', ARGV[3],
  'ttl', ARGV[4], 'on_complete', ARGV[1], 'mark', ARGV[2])
return 1
