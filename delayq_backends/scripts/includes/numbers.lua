--[[ Numbers read back from Redis, and the clock. Keyless.
Times cross into Redis as strings made with %d, never through tostring() (which would
print 13+ digit numbers in exponent form on Lua 5.1).
Anything read back may have been written by hand (the producer role can write these keys): it
is checked before use, so a bad value buries its item with the reason instead of failing the
script after earlier writes (see check_types and defect() in includes/bury.lua). ]]
local rcall = redis.call

-- Largest integer exact in a double: a time or count past it is garbage, not data.
local MAX_EXACT = 9007199254740992

-- A finite number in -MAX_EXACT..MAX_EXACT from a Redis reply string, else nil.
local function finite(s)
  local n = tonumber(s)
  if n and n == n and n >= -MAX_EXACT and n <= MAX_EXACT then return n end
  return nil
end

-- A whole number written as HINCRBY writes it (digits, optional minus), else nil.
local function whole(s)
  if type(s) ~= 'string' or #s > 15 or not string.match(s, '^%-?%d+$') then return nil end
  return tonumber(s)
end

-- Server time in ms, unless the caller passes a clock override (> 0) for tests.
local function now_ms(override)
  local o = tonumber(override)
  if o and o > 0 then return o end
  local t = rcall('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function ms(n) return string.format('%d', n) end
