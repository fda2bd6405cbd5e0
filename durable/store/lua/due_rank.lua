-- due_rank.lua: how many of one shard's scheduled jobs are due before a time (read
-- only): those in due, then the live ones of the far index's slots that start before it.
-- KEYS[1] due  KEYS[2] leased  KEYS[3] dead  KEYS[4] far  KEYS[5] faro  KEYS[6] parked
-- KEYS[7] waiting (unused here: due_list.lua's keys)
-- KEYS[8..] jobs buckets (all of the shard's, in order)
-- ARGV[1]  time (ms)
-- Returns: the count.
-- Errors: TW_TOOMANY when that would read more than FAR_WALK far entries.
local FIRST = 7
local t = tonumber(ARGV[1])
local rank = redis.call('ZCOUNT', KEYS[1], '-inf', '(' .. fmt(t))
  + redis.call('ZCOUNT', KEYS[6], '-inf', '(' .. fmt(t))
far_walk(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], FIRST, t, function(_, due)
  if due >= t then return true end
  rank = rank + 1
  return false
end, KEYS[6])
return rank
