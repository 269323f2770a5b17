#!lua flags=no-writes
--[[ Read the same fields of many RQ job hashes in one call (the forwarder's rq target), instead
of one HMGET per job: per job, a client spends more time packing and parsing a command than the
server spends running it.
Input:
  KEYS[1..n] job hashes (rq:job:<id>)
  ARGV[1..m] field names
Output: per key, the m values (nil when absent), or the key's type (a string) when it is not a
hash (written by another tool): that job alone is refused, the others move. Never touches the
values: they are data, not parsed here. ]]
local out = {}
for i, key in ipairs(KEYS) do
  local values = redis.pcall('HMGET', key, unpack(ARGV))
  if type(values) == 'table' and values.err then
    out[i] = redis.call('TYPE', key).ok
  else
    out[i] = values
  end
end
return out
