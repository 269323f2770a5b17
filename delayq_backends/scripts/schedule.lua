--[[ Schedule items on one shard.
Input:
  KEYS[1] due, KEYS[2] items, KEYS[3] tries, KEYS[4] leased, KEYS[5] ranked
  ARGV[1] mode: "replace" (an existing id takes the new time, envelope and rank) or "keep"
  ARGV[2] wake channel
  ARGV[3] fields per item: "3" (id, ready ms, envelope: rank 0) or "4" (and rank 0..MAX_RANK,
          higher claimed first), so a batch without ranks sends no rank per item
  ARGV[4..] the items
Output: {added, replaced, kept}
A replaced item loses its lease and attempts: a forwarder's late ack will not delete it.
Rank 0 costs one EXISTS per call, and one ZREM per call only on a shard that has ranked items
(it also drops a stale entry left by an earlier item of that id). Each id costs one HEXISTS; the
batch is written with one variadic command per key (and one HDEL each of the replaced items'
tries and leases).
In "keep" mode an item published and awaiting its start (lossless mode, keep.lua) is
replaced, not kept: its run was delivered, so the new schedule (a retry's next run) is new work
(one HGET per existing id, in keep mode only). ]]
--- @include "ranks"
--- @include "wake"
--- @include "batch"
local k = {due = KEYS[1], items = KEYS[2], tries = KEYS[3], leased = KEYS[4], ranked = KEYS[5]}
local keep = ARGV[1] == 'keep'
local width = tonumber(ARGV[3])
local before = head_score(k.due)
-- The items written, and which of them replace a stored item (or an earlier row of this batch).
local ids, scores, envelopes, ranks, replaced_ids = {}, {}, {}, {}, {}
local kept, seen = 0, {}
for i = 4, #ARGV, width do
  local id = ARGV[i]
  local exists = seen[id] or rcall('HEXISTS', k.items, id) == 1
  -- in keep mode, a stored item awaiting its start (lossless mode) is spent: replaced, not kept
  if exists and keep and (seen[id] or not string.find(rcall('HGET', k.leased, id) or '', ':published:', 1, true)) then
    kept = kept + 1
  else
    if exists then replaced_ids[#replaced_ids + 1] = id end
    seen[id] = true
    local n = #ids + 1
    ids[n] = id
    scores[2 * n - 1], scores[2 * n] = ARGV[i + 1], id
    envelopes[2 * n - 1], envelopes[2 * n] = id, ARGV[i + 2]
    ranks[n] = width == 4 and tonumber(ARGV[i + 3]) or 0
  end
end
-- ZADD first: at maxmemory it is refused before anything is written (a script without flags)
variadic('ZADD', k.due, scores)
variadic('HSET', k.items, envelopes)
variadic('HDEL', k.tries, replaced_ids)
variadic('HDEL', k.leased, replaced_ids)
if width == 4 then
  for n, id in ipairs(ids) do set_rank(k.ranked, id, ranks[n], scores[2 * n - 1]) end
elseif rcall('EXISTS', k.ranked) == 1 then
  variadic('ZREM', k.ranked, ids)  -- rank 0: drop stale entries of earlier items of these ids
end
wake_if_earlier(k.due, ARGV[2], before)
return {#ids - #replaced_ids, #replaced_ids, kept}
