-- init.lua: record the namespace's shard and bucket counts on first use, and its mode
-- when a Postgres-mode scheduler opens it; report both.
-- KEYS[1]  {ns}:meta          STRING "shards:buckets"
-- KEYS[2]  {ns}:mode          STRING "postgres" once the Postgres mode opened the namespace
-- ARGV[1]  layout             the caller's "shards:buckets"
-- ARGV[2]  postgres           '1': the caller is in the Postgres mode (recorded), else ''
-- Returns: {the stored layout (the caller's, if this call stored it), the stored mode
--   ('' for plain Redis)}. The caller refuses a mismatch of either; a caller without
--   the Postgres mode writes nothing when the layout is stored already.
-- Errors: none.
redis.call('SET', KEYS[1], ARGV[1], 'NX')
if ARGV[2] == '1' then redis.call('SET', KEYS[2], 'postgres') end
return {redis.call('GET', KEYS[1]), redis.call('GET', KEYS[2]) or ''}
