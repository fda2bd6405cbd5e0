-- raise_epoch.lua: lift a shard's fencing epoch above one recorded elsewhere.
-- KEYS[1] epoch
-- ARGV[1]  floor   the highest epoch PostgreSQL recorded for this shard
-- Returns: 1 if the epoch was below floor and is now floor + 1 (every owner that took
--   it below floor is fenced, and the next take gets floor + 2), 0 if it was at or above
--   floor already (nothing written: a running owner is left alone).
-- Errors: none.
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local floor = tonumber(ARGV[1])
if cur >= floor then return 0 end
redis.call('SET', KEYS[1], string.format('%d', floor + 1))
return 1
