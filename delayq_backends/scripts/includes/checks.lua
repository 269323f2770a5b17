--[[ Checks of what claim.lua reads, before it writes anything: a shard key of another type, or
an item whose stored values are unusable (it is buried with the reason, see includes/bury.lua).
k holds the shard's eight keys by name. ]]
--- @include "numbers"

-- Whether s is valid UTF-8 (RFC 3629: no overlongs, no surrogates, nothing past U+10FFFF).
local function is_utf8(s)
  if not string.find(s, '[\128-\255]') then return true end  -- ASCII (every Celery and RQ id): one C scan
  local i, n = 1, #s
  while i <= n do
    local c = string.byte(s, i)
    local len, low, high = 0, 0x80, 0xBF
    if c < 0x80 then len = 1
    elseif c >= 0xC2 and c <= 0xDF then len = 2
    elseif c >= 0xE0 and c <= 0xEF then
      len = 3
      if c == 0xE0 then low = 0xA0 elseif c == 0xED then high = 0x9F end
    elseif c >= 0xF0 and c <= 0xF4 then
      len = 4
      if c == 0xF0 then low = 0x90 elseif c == 0xF4 then high = 0x8F end
    else return false end
    for j = 1, len - 1 do
      local b = string.byte(s, i + j)
      if not b or b < (j == 1 and low or 0x80) or b > (j == 1 and high or 0xBF) then return false end
    end
    i = i + len
  end
  return true
end

-- Refuse, before anything is written, a shard whose keys hold another type than ours (a hand
-- write): every later command on them would fail midway. The error names the key.
-- ZCARD/HLEN rather than TYPE: the roles' ACLs grant those already. Returns the error, or nil and
-- what was read: each key's size by name.
local KEY_TYPES = {
  {'due', 'zset'}, {'items', 'hash'}, {'tries', 'hash'}, {'leased', 'hash'},
  {'dead', 'zset'}, {'dead_items', 'hash'}, {'dead_info', 'hash'}, {'ranked', 'zset'},
}
local function check_types(k)
  local sizes = {}
  for _, pair in ipairs(KEY_TYPES) do
    local key, want = k[pair[1]], pair[2]
    local reply = redis.pcall(want == 'zset' and 'ZCARD' or 'HLEN', key)
    if type(reply) == 'table' and reply.err then
      return redis.error_reply('WRONGTYPE delayq key ' .. key .. ' is not a ' .. want ..
        ': it was written by another tool; move it away (RENAME) so the shard can run again')
    end
    sizes[pair[1]] = reply
  end
  return nil, sizes
end

-- Why a claimed id cannot be delivered as stored, or nil: checked before anything is written.
-- held is its leased entry, tries its tries entry, ready its original ready time (strings or false).
local function tries_defect(tries)
  return 'its tries entry ' .. string.format('%q', string.sub(tries, 1, 40)) .. ' is not a whole number (a count HINCRBY can add to)'
end

local function defect(id, envelope, held, tries, ready)
  if not is_utf8(id) then return 'the id is not UTF-8 text (written by another tool)' end
  if not envelope then return 'no envelope stored for this id (store corrupted or written by another tool)' end
  if tries and not whole(tries) then return tries_defect(tries) end
  -- "<deadline>:<ready>" is the lease of the first releases, before claim tokens
  if held and not (string.match(held, '^%d+:[%w]+:%-?%d+$') or string.match(held, '^%d+:%-?%d+$')) then
    return 'its leased entry ' .. string.format('%q', string.sub(held, 1, 40)) .. ' is not "<deadline>:<token>:<ready>"'
  end
  if not finite(ready) then return 'its ready time ' .. tostring(ready) .. ' is not a finite number of ms' end
  return nil
end
