#!lua flags=allow-oom
--[[ Delete delivered items, but only those still under our lease.
Input:
  KEYS[1] due, KEYS[2] items, KEYS[3] tries, KEYS[4] leased (see includes/lease.lua)
  ARGV[1] our lease, "<deadline>:<token>" of the claim
  ARGV[2..] ids
Output: how many were deleted. An id cancelled, rescheduled or re-claimed since our claim
no longer carries our lease and is left alone. allow-oom: acks are how a full store drains.
Cost: one HMGET of the leases, then one ZREM and three HDELs for the whole batch. ]]
--- @include "batch"
local k = {due = KEYS[1], items = KEYS[2], tries = KEYS[3], leased = KEYS[4]}
local mark = ARGV[1] .. ':'
local ids = {}
for i = 2, #ARGV do ids[i - 1] = ARGV[i] end
local helds = hmget(k.leased, ids)
local ours, seen, m = {}, {}, 0
for i, id in ipairs(ids) do
  local held = helds[i]
  -- find, plain, at 1: "starts with" without making a string per id
  if held and not seen[id] and string.find(held, mark, 1, true) == 1 then
    seen[id] = true
    m = m + 1
    ours[m] = id
  end
end
variadic('ZREM', k.due, ours)
variadic('HDEL', k.items, ours)
variadic('HDEL', k.tries, ours)
variadic('HDEL', k.leased, ours)
return m
