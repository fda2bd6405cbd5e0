-- extend.lua: push a lease's deadline to now + lease (never earlier than it was), in
--   whole ms: a pre-start lease (claim.lua, a score with a half ms) is marked started.
-- KEYS[1] leased  KEYS[2] epoch  KEYS[3] clock  KEYS[4] the job's jobs bucket
-- ARGV[1]  epoch   the caller's fencing epoch for this shard
-- ARGV[2]  id
-- ARGV[3]  attempt the attempt the caller holds
-- ARGV[4]  nominal the nominal due of the occurrence the caller holds
-- ARGV[5]  lease   ms
-- Returns: the new deadline (ms), or 0 if the lease is lost.
-- Errors: TW_FENCED if ARGV[1] is not the shard's current epoch (nothing written).
local err = fence(KEYS[2], ARGV[1])
if err then return err end
local id = ARGV[2]
local now = clock_now(KEYS[3], true)
local s = redis.call('HGET', KEYS[4], id)
local cur = redis.call('ZSCORE', KEYS[1], id)
if not s or not cur then return 0 end
if not holds(rec_decode(s), ARGV[1], ARGV[3], ARGV[4]) then return 0 end
local deadline = math.max(math.floor(tonumber(cur)), now + tonumber(ARGV[5]))
redis.call('ZADD', KEYS[1], fmt(deadline), id)
return deadline
