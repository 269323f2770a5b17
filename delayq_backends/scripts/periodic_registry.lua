--[[ Add or remove lines of the periodic registry, the list of every periodic entry that
`periodic list` and a sync read (see delayq_backends/periodic/registry.py). Only the operator and
forwarder roles may call it or write its key.
Input:
  KEYS[1] the registry (HASH: entry name -> its store item id)
  ARGV[1] "add": ARGV[2] the entry's name, ARGV[3] its item id;
          "remove": ARGV[2..] the names of the entries removed (a sweep's page at most)
Output: {1 or 0 per name: its line was added (removed), 0 it was there (was not)};
  -1 the key is of another type (nothing written). ]]
local key = KEYS[1]
local kind = redis.call('TYPE', key)['ok']
if kind ~= 'hash' and kind ~= 'none' then return -1 end
if ARGV[1] == 'add' then return {redis.call('HSET', key, ARGV[2], ARGV[3])} end
local out = {}
for i = 2, #ARGV do out[i - 1] = redis.call('HDEL', key, ARGV[i]) end
return out
