-- init.lua: record the namespace's shard and bucket counts on first use; report them.
-- KEYS[1]  {ns}:meta          STRING "shards:buckets"
-- ARGV[1]  layout             the caller's "shards:buckets"
-- Returns: the stored layout (the caller's, if this call stored it). The caller refuses
--   a mismatch; nothing is written when one is stored already.
-- Errors: none.
redis.call('SET', KEYS[1], ARGV[1], 'NX')
return redis.call('GET', KEYS[1])
