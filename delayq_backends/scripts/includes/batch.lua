--[[ Variadic commands over a whole batch, cut into calls of at most CHUNK values: Lua's unpack()
cannot pass more than about 8,000 values (LUAI_MAXCSTACK), and a claim may hold 10,000 items.
Keyless: each takes the key it reads or writes. ]]
--- @include "numbers"

-- Values per call: even, so (field, value) and (score, member) pairs never straddle two calls.
local CHUNK = 1000

-- Bytes of a hash value longer than hash-max-listpack-value (64 unless raised): an HSET that
-- carries one turns a listpack hash into a hashtable before it writes, and the hash stays one.
local WIDE_BYTES = 1024
-- Fewest fields for which hset_many() writes into a hashtable.
local WIDE_FROM = 32

-- HMGET of every id in ids: one list, false where a field is missing.
local function hmget(key, ids)
  local out = {}
  for i = 1, #ids, CHUNK do
    local values = rcall('HMGET', key, unpack(ids, i, math.min(i + CHUNK - 1, #ids)))
    for j = 1, #values do out[#out + 1] = values[j] end  -- not ipairs: it stops at the first false
  end
  return out
end

-- cmd key [option] values..., cut into chunks; returns the sum of the integer replies (ZREM, HDEL
-- and HSET count what they removed or added). option is nil or a flag such as 'XX'; first and
-- last, when given, pass only values[first..last] (a range of ARGV, sent in the command's order).
local function variadic(cmd, key, values, option, first, last)
  local total, stop = 0, last or #values
  for i = first or 1, stop, CHUNK do
    local last = math.min(i + CHUNK - 1, stop)
    if option then
      total = total + rcall(cmd, key, option, unpack(values, i, last))
    else
      total = total + rcall(cmd, key, unpack(values, i, last))
    end
  end
  return total
end

-- HSET of pairs (field, value, field, value...) into key; from WIDE_FROM fields on, into a
-- hashtable. A listpack hash (up to hash-max-listpack-entries fields: 128 by default on Redis 7,
-- 512 on the benches' Valkey 9) finds each field by a linear scan, so filling one with a claim's
-- n leases costs O(n^2), and reading them back at the ack too: at batch 500 that was half of a
-- forwarded item's server time (10 -> 5.4 us). The first field is written WIDE_BYTES long, which
-- converts the hash, then overwritten with its own value.
local function hset_many(key, pairs)
  if #pairs >= 2 * WIDE_FROM then rcall('HSET', key, pairs[1], string.rep('.', WIDE_BYTES)) end
  variadic('HSET', key, pairs)
end
