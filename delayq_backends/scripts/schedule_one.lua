--[[ Schedule one item on one shard, replacing an item of that id (includes/schedule_item.lua):
every apply_async and every single schedule().
Input:
  KEYS[1] due, KEYS[2] items, KEYS[3] tries, KEYS[4] leased, KEYS[5] ranked
  ARGV[1] id, ARGV[2] ready ms, ARGV[3] envelope, ARGV[4] rank (0..MAX_RANK), ARGV[5] wake channel
Output: {added, replaced, 0}, as schedule.lua's {added, replaced, kept} ]]
--- @include "schedule_item"
local added = schedule_item(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
return {added, 1 - added, 0}
