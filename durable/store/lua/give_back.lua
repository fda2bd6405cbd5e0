-- give_back.lua: give a shard back: drop the token and bump the epoch, so that any
-- write still in flight from the old owner is fenced.
-- KEYS[1] owner  KEYS[2] epoch
-- ARGV[1]  token
-- ARGV[2]  epoch   the caller's epoch
-- Returns: 1 given back, 0 the caller was not the owner any more (nothing written).
-- Errors: none.
if tonumber(redis.call('GET', KEYS[2]) or '0') ~= tonumber(ARGV[2]) then return 0 end
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('INCR', KEYS[2])
return 1
