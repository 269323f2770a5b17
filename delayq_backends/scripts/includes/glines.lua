--[[ Group lines (issue 31): a grouped item that cannot run yet waits parked (see
includes/parking.lua: `due` score PARKED_MS, leased entry "<PARKED_MS>:deferred:<ready>") and
is listed in its shard's line of its group, `gline` (ZSET id -> (MAX_RANK - rank) * RANK_SPAN +
ready ms, as `ranked`). `gready` (ZSET group -> ms) says when a forwarder may next release from
the group's line. An item a forwarder put back in line (group_park.lua) also has its reason
"group:<key>" in `parked_why` and a re-check time in `parked` (only forwarders write those); an
item a producer scheduled into its line (group_schedule.lua) has neither.
k holds the shard keys: due, leased, ranked, gready (and others where the caller has them). ]]
--- @include "ranks"
--- @include "parking"

-- Must match keys.RELEASED_BIAS_MS: a released item's `due` score is its ready time minus this.
local RELEASED_BIAS = 8796093022208

-- An item's order in its line: its rank's band, then its ready time.
local function line_order(rank, ready)
  return ms(band_of(rank) + math.max(0, math.min(finite(ready) or 0, RANK_SPAN - 1)))
end

-- Put id (ready ms, rank) in group's line (key line), parked; gready of the group moves to
-- `at` if that is earlier (a new head, or a refusal's until).
local function to_line(k, line, group, id, ready, rank, at)
  rcall('ZADD', k.due, ms(PARKED_MS), id)
  rcall('HSET', k.leased, id, ms(PARKED_MS) .. ':deferred:' .. ready)
  set_rank(k.ranked, id, rank, PARKED_MS)
  rcall('ZADD', line, line_order(rank, ready), id)
  rcall('ZADD', k.gready, 'LT', at, group)
end
