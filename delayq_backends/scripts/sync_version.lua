--[[ Let a sync of periodic entries from code go ahead only if its code schedule is current, and
record it: the check and the record are one step, so two forwarders starting at once (a rolling
deploy) cannot both pass with different code.
Input:
  KEYS[1] the code schedule's record (HASH: version, fp, synced_at, host)
  ARGV[1] the sync's version, digits; "" for an unversioned sync
  ARGV[2] fingerprint of the whole code set
  ARGV[3] host of the syncing process
  ARGV[4] now ms (0: the server's TIME)
Output: {code, stored version, stored fp, stored synced_at, stored host} (the record before the call)
  1 recorded (newer version; or unversioned while no versioned sync ran)
  0 current (same version, same set: recorded again)
 -1 older than the stored version: nothing changes
 -2 same version, another set: refused (bump the version)
 -3 unversioned after a versioned sync: refused
 -4 the record is damaged (another type, or a version that is no number): refused ]]
--- @include "numbers"
local key = KEYS[1]
local got = redis.pcall('HMGET', key, 'version', 'fp', 'synced_at', 'host')
if type(got) == 'table' and got.err then return {-4, '', '', '', ''} end
local old_version, old_fp = got[1] or '', got[2] or ''
local before = {old_version, old_fp, got[3] or '', got[4] or ''}
local function answer(code) return {code, before[1], before[2], before[3], before[4]} end
local stored = nil
if old_version ~= '' then
  stored = whole(old_version)
  if not stored then return answer(-4) end
end
local code = 1
if ARGV[1] == '' then
  if stored then return answer(-3) end
else
  local version = whole(ARGV[1])
  if stored and version < stored then return answer(-1) end
  if stored and version == stored then
    if ARGV[2] ~= old_fp then return answer(-2) end
    code = 0
  end
end
rcall('HSET', key, 'version', ARGV[1], 'fp', ARGV[2], 'synced_at', ms(now_ms(ARGV[4])), 'host', ARGV[3])
return answer(code)
