--[[ The head of a shard's `due` ZSET, and the wake-up published when a change makes it earlier. ]]
--- @include "numbers"

local function head_score(due)
  local head = rcall('ZRANGE', due, 0, 0, 'WITHSCORES')
  return finite(head[2])
end

-- Publish the new head's ready time when a change made the shard's head earlier, so
-- sleeping forwarders wake for it now instead of at their next safety poll.
local function wake_if_earlier(due, channel, before)
  local after = head_score(due)
  if after and (not before or after < before) then rcall('PUBLISH', channel, ms(after)) end
end
