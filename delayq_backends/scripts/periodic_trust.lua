--[[ Record or drop an operator's definition of a periodic entry's run template, for the
forwarders' check of entries that carry code to run (see delayq_backends/periodic/trust.py).
Only the operator and forwarder roles may call it or write its key.
Input:
  KEYS[1] the trusted definitions (HASH: entry name -> "<digest> <previous digest>")
  ARGV[1] "add": ARGV[2] the entry's name, ARGV[3] the template's digest;
          "drop": ARGV[2..] the names of the entries removed (a sweep's page at most)
Output: 1 changed, 0 as it was (drop: how many were there); -1 the key is of another type (nothing written).
The previous digest is kept beside the new one, so an entry a forwarder claimed just before its
definition changed still fires (its item is replaced right after); a removal drops both. A
value that is no pair of digests (a hand write) is replaced. ]]
local key, name = KEYS[1], ARGV[2]
local kind = redis.call('TYPE', key)['ok']
if kind ~= 'hash' and kind ~= 'none' then return -1 end
if ARGV[1] == 'drop' then
  if #ARGV < 2 then return 0 end
  return redis.call('HDEL', key, unpack(ARGV, 2))
end
local digest = ARGV[3]
local old = redis.call('HGET', key, name)
local current = type(old) == 'string' and string.match(old, '^(%x+)') or nil
if current == digest then return 0 end
redis.call('HSET', key, name, current and (digest .. ' ' .. current) or digest)
return 1
