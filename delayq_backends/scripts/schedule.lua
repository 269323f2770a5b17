--[[ Schedule items on one shard.
Input:
  KEYS[1] due, KEYS[2] items, KEYS[3] tries, KEYS[4] leased, KEYS[5] ranked
  ARGV[1] mode: "replace" (an existing id takes the new time, envelope and rank) or "keep"
  ARGV[2] wake channel
  ARGV[3] "1" when a rank column follows the items (ranks 0..MAX_RANK, higher claimed first),
          "0" for rank 0 throughout, so a batch without ranks sends no rank per item
  ARGV[4] the earliest ready ms of the items
  then, for n items: n (ready ms, id) pairs, n (id, envelope) pairs, [n ranks]
Output: {added, replaced, kept}
The pairs are in the order ZADD and HSET take them, so replace mode passes them on as they came:
it reads nothing per id, and HSET's count of new fields tells added from replaced (a row
repeating an earlier row's id replaces it). A replaced item loses its lease and attempts: a
forwarder's late ack will not delete it (when any was replaced, one HDEL each of the batch's
tries and leases; an added id has none to drop, or only a stale one).
Rank 0 costs one EXISTS per call, and one ZREM per call only on a shard that has ranked items
(it also drops a stale entry left by an earlier item of that id). The head is read again after
the writes only when an item is earlier than it.
In "keep" mode each id costs one HEXISTS, and an item published and awaiting its start (lossless
mode, keep.lua) is replaced, not kept: its run was delivered, so the new schedule (a retry's next
run) is new work (one HGET per existing id). ]]
--- @include "ranks"
--- @include "wake"
--- @include "batch"
local k = {due = KEYS[1], items = KEYS[2], tries = KEYS[3], leased = KEYS[4], ranked = KEYS[5]}
local keep = ARGV[1] == 'keep'
local with_ranks = ARGV[3] == '1'
local n = (#ARGV - 4) / (with_ranks and 5 or 4)
local pairs_at, envelopes_at, ranks_at = 4, 4 + 2 * n, 4 + 4 * n -- each plus 2j-1 (pairs) or j (ranks)
local before = head_score(k.due)

-- The rows written: all n, or in keep mode those not kept (their indexes in rows).
local written, rows, kept = n, nil, 0
local added
if keep then
  local scores, envelopes, seen = {}, {}, {}
  rows = {}
  for j = 1, n do
    local id = ARGV[pairs_at + 2 * j]
    -- a stored item awaiting its start (lossless mode) is spent: replaced, not kept
    if seen[id] or (rcall('HEXISTS', k.items, id) == 1
        and not string.find(rcall('HGET', k.leased, id) or '', ':published:', 1, true)) then
      kept = kept + 1
    else
      seen[id] = true
      local m = #rows + 1
      rows[m] = j
      scores[2 * m - 1], scores[2 * m] = ARGV[pairs_at + 2 * j - 1], id
      envelopes[2 * m - 1], envelopes[2 * m] = id, ARGV[envelopes_at + 2 * j]
    end
  end
  written = #rows
  variadic('ZADD', k.due, scores)  -- first: at maxmemory it is refused before anything is written
  added = variadic('HSET', k.items, envelopes)
else
  variadic('ZADD', k.due, ARGV, nil, pairs_at + 1, envelopes_at)
  added = variadic('HSET', k.items, ARGV, nil, envelopes_at + 1, ranks_at)
end

-- The m-th written row, and the ids written (read only when needed).
local function row(m) return rows and rows[m] or m end
local function written_ids()
  local ids = {}
  for m = 1, written do ids[m] = ARGV[pairs_at + 2 * row(m)] end
  return ids
end

if added < written then  -- some were replaced
  local ids = written_ids()
  variadic('HDEL', k.tries, ids)
  variadic('HDEL', k.leased, ids)
end
if with_ranks then
  for m = 1, written do
    local j = row(m)
    set_rank(k.ranked, ARGV[pairs_at + 2 * j], tonumber(ARGV[ranks_at + j]), ARGV[pairs_at + 2 * j - 1])
  end
elseif rcall('EXISTS', k.ranked) == 1 then
  variadic('ZREM', k.ranked, written_ids())  -- rank 0: drop stale entries of earlier items of these ids
end
if written > 0 and (not before or tonumber(ARGV[4]) < before) then wake_if_earlier(k.due, ARGV[2], before) end
return {added, written - added, kept}
