--[[ A shard's leases. `leased` (HASH) maps id -> "<deadline ms>:<claim token>:<ready ms>", or
for an item given back by defer.lua "<not-before ms>:deferred:<ready ms>" (not a lease:
claimable from its not-before time, see claim.lua); `tries` (HASH) id -> delivery attempts. ]]
--- @include "numbers"

-- The original ready time of id if it is held under our lease ("<deadline>:<token>"), else nil.
local function our_lease(leased, id, lease)
  local held = rcall('HGET', leased, id)
  if held and string.sub(held, 1, #lease + 1) == lease .. ':' then
    return string.sub(held, #lease + 2)
  end
  return nil
end

-- Give back one counted attempt of id (release, defer), whatever its tries entry holds.
local function uncount(tries, id)
  local n = whole(rcall('HGET', tries, id))
  if n and n > 1 then rcall('HSET', tries, id, ms(n - 1)) else rcall('HDEL', tries, id) end
end

-- Drop id from the schedule: k holds the shard's due, items, tries and leased keys.
local function forget(k, id)
  rcall('ZREM', k.due, id)
  rcall('HDEL', k.items, id)
  rcall('HDEL', k.tries, id)
  rcall('HDEL', k.leased, id)
end
