-- take.lua: take a shard: owner token with a TTL, and a new fencing epoch.
-- KEYS[1] owner  KEYS[2] epoch
-- ARGV[1]  token   the caller's owner token
-- ARGV[2]  ttl     ms
-- ARGV[3]  fresh   '1': the caller does not hold the shard (in its memory): a token of
--                  its own found set is a previous process's with the same token (a
--                  worker restarted in place with a stable worker id), so the epoch is
--                  INCR'd as for any take, and that process's writes are fenced.
--                  '' or absent: a token of its own is the caller's hold (TTL refreshed).
-- Returns: {epoch, taken}: taken 1 with the new epoch (INCR'd); 1 with the current epoch
--   if the caller holds it already (TTL refreshed, not fresh); {0, 0} if another owner
--   holds it.
-- Errors: none.
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then return {0, 0} end
redis.call('SET', KEYS[1], ARGV[1], 'PX', tonumber(ARGV[2]))
if cur and ARGV[3] ~= '1' then return {tonumber(redis.call('GET', KEYS[2]) or '0'), 1} end
return {redis.call('INCR', KEYS[2]), 1}
