--[[ Dead letters: moving an item there, with the reason, and the caps on how many are kept.
Takes k, the shard's keys by name (all eight: due, items, tries, leased, dead, dead_items,
dead_info, ranked; see keys.ShardKeys):
  dead       ZSET id -> time of death ms
  dead_items HASH id -> envelope
  dead_info  HASH id -> JSON {error, attempts, ready_ms, rank} ]]
--- @include "ranks"
--- @include "lease"

-- Move id to the dead letters, keeping its envelope (if any), its rank and why it died.
-- A ready time that is no finite number is recorded as absent (JSON null), so readers never
-- meet "-inf". dead_max > 0 keeps only the newest dead_max dead letters of the shard (the oldest
-- go for good); dead_ttl_ms > 0 drops those buried longer ago than that. Both cost O(log N) plus
-- what they remove, and are optional (Config.dead_letter_max / dead_letter_ttl_seconds).
local function bury(k, id, envelope, ready, attempts, err, now, dead_max, dead_ttl_ms)
  local rank = rank_of(k.ranked, id)
  forget(k, id)
  set_rank(k.ranked, id, 0)
  rcall('ZADD', k.dead, ms(now), id)
  if envelope then rcall('HSET', k.dead_items, id, envelope) end
  rcall('HSET', k.dead_info, id, cjson.encode({error = err, attempts = attempts, ready_ms = finite(ready), rank = rank}))
  local old = {}
  local ttl, cap = tonumber(dead_ttl_ms) or 0, tonumber(dead_max) or 0
  if ttl > 0 then old = rcall('ZRANGEBYSCORE', k.dead, '-inf', '(' .. ms(now - ttl), 'LIMIT', 0, 100) end
  if cap > 0 then
    local over = rcall('ZCARD', k.dead) - cap
    if over > 0 then
      for _, gone in ipairs(rcall('ZRANGE', k.dead, 0, math.min(over, 100) - 1)) do old[#old + 1] = gone end
    end
  end
  for _, gone in ipairs(old) do
    rcall('ZREM', k.dead, gone)
    rcall('HDEL', k.dead_items, gone)
    rcall('HDEL', k.dead_info, gone)
  end
end
