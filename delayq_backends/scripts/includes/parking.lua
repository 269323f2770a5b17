--[[ Parked items: claimed once, found unreleasable by that forwarder (an envelope format newer
than it reads, a target kind it lacks), and kept out of the due index until a forwarder looks
again. A parked item's `due` score is PARKED_MS, a time no claim reaches (any release's claim
skips it), its `leased` entry "<PARKED_MS>:deferred:<ready>" keeps its original ready time as
defer.lua's does, `parked` (ZSET) holds when to look again and `parked_why` (HASH) why.
An entry of `parked` whose item's score is not PARKED_MS is stale (the item was cancelled,
rescheduled or replaced since): the re-check drops it. ]]
--- @include "numbers"

-- Must match keys.PARKED_MS.
local PARKED_MS = 253402300798999

-- Whether id is parked as parking left it: its score is PARKED_MS.
local function is_parked(due, id)
  return finite(rcall('ZSCORE', due, id)) == PARKED_MS
end

-- The first of keys (name -> key, want 'zset' or 'hash') that holds another type (a hand
-- write), or nil: read with ZCARD/HLEN, which the forwarder role has.
local function wrong_type(keys)
  for _, pair in ipairs(keys) do
    local reply = redis.pcall(pair[2] == 'zset' and 'ZCARD' or 'HLEN', pair[1])
    if type(reply) == 'table' and reply.err then return pair[1] end
  end
  return nil
end
