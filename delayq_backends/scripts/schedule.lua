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
Replace mode reads nothing per id: HSET's count of new fields tells added from replaced (a row
repeating an earlier row's id replaces it), and when any was replaced one HDEL each of the
batch's tries and leases drops theirs (an added id has none to drop, or only a stale one).
The batch is written with one variadic command per key. Rank 0 costs one EXISTS per call, and
one ZREM per call only on a shard that has ranked items (it also drops a stale entry left by an
earlier item of that id). The head is read after the writes only when an item is earlier than it.
In "keep" mode each id costs one HEXISTS, and an item published and awaiting its start (lossless
mode, keep.lua) is replaced, not kept: its run was delivered, so the new schedule (a retry's next
run) is new work (one HGET per existing id). ]]
--- @include "ranks"
--- @include "wake"
--- @include "batch"
local k = {due = KEYS[1], items = KEYS[2], tries = KEYS[3], leased = KEYS[4], ranked = KEYS[5]}
local keep = ARGV[1] == 'keep'
local width = tonumber(ARGV[3])
local before = head_score(k.due)
-- The items written; in keep mode, which of them replace a stored item.
local ids, scores, envelopes, ranks, replaced_ids = {}, {}, {}, {}, {}
local kept, seen, earliest = 0, {}, nil
for i = 4, #ARGV, width do
  local id = ARGV[i]
  local exists = keep and (seen[id] or rcall('HEXISTS', k.items, id) == 1)
  -- in keep mode, a stored item awaiting its start (lossless mode) is spent: replaced, not kept
  if exists and (seen[id] or not string.find(rcall('HGET', k.leased, id) or '', ':published:', 1, true)) then
    kept = kept + 1
  else
    if exists then replaced_ids[#replaced_ids + 1] = id end
    seen[id] = keep or nil
    local n = #ids + 1
    local ready = ARGV[i + 1]
    ids[n] = id
    scores[2 * n - 1], scores[2 * n] = ready, id
    envelopes[2 * n - 1], envelopes[2 * n] = id, ARGV[i + 2]
    ranks[n] = width == 4 and tonumber(ARGV[i + 3]) or 0
    ready = tonumber(ready)
    if not earliest or ready < earliest then earliest = ready end
  end
end
-- ZADD first: at maxmemory it is refused before anything is written (a script without flags)
variadic('ZADD', k.due, scores)
local added = variadic('HSET', k.items, envelopes)
if not keep and added < #ids then replaced_ids = ids end
variadic('HDEL', k.tries, replaced_ids)
variadic('HDEL', k.leased, replaced_ids)
if width == 4 then
  for n, id in ipairs(ids) do set_rank(k.ranked, id, ranks[n], scores[2 * n - 1]) end
elseif rcall('EXISTS', k.ranked) == 1 then
  variadic('ZREM', k.ranked, ids)  -- rank 0: drop stale entries of earlier items of these ids
end
if earliest and (not before or earliest < before) then wake_if_earlier(k.due, ARGV[2], before) end
return {added, #ids - added, kept}
