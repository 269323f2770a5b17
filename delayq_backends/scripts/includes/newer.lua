--[[ The newer band of a shard's `due` index. Items of envelope format 3 and later (periodic
entries that use a field added with entries as data, and whatever later releases add) are
indexed at NEWER_BAND + their time: past every score a claim of an earlier release reads (up to
now), so a forwarder of the previous release, which dead-letters a format it does not know,
never claims one. claim.lua of this release reads the band as well. The producer side puts a
new item in the band (DelayStore.check_item); a script that moves an item keeps it where it is
(in_band_of), or decides by its envelope when the item comes back from elsewhere (band_for).
Must match keys.NEWER_BAND. ]]
--- @include "numbers"

local NEWER_BAND = 281474976710656  -- 2^48 ms: past 9999-12-31, every time a schedule takes

-- The score of id's new time t (ms, number or digits): in the band when id is there now.
local function in_band_of(due, id, t)
  local score = finite(rcall('ZSCORE', due, id))
  if score and score >= NEWER_BAND then return ms(NEWER_BAND + tonumber(t)) end
  return t
end

-- The score of time t for an item whose envelope is envelope: in the band from format 3 on.
local function band_for(envelope, t)
  local version = type(envelope) == 'string' and string.sub(envelope, 1, 2) == 'DQ' and string.byte(envelope, 3)
  if version and version >= 3 then return ms(NEWER_BAND + tonumber(t)) end
  return t
end
