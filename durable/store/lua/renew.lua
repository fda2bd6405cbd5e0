-- renew.lua: extend the owner token's TTL, if the caller is still the owner.
-- KEYS[1] owner  KEYS[2] epoch
-- ARGV[1]  token
-- ARGV[2]  epoch   the caller's epoch
-- ARGV[3]  ttl     ms
-- Returns: 1. A token that expired while nobody else took the shard is set again (the
--   epoch is still the caller's, so no other owner can have written).
-- Errors: TW_FENCED if the epoch moved on or another token holds the shard.
local err = fence(KEYS[2], ARGV[2])
if err then return err end
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then
  return redis.error_reply('TW_FENCED shard held by another owner')
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', tonumber(ARGV[3]))
return 1
