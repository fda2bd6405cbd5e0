-- dead_purge.lua: delete dead letters for good.
-- KEYS[1] dead  KEYS[2] trail  a purged job's pending trailing run (flow.lua) goes too
-- KEYS[3..] jobs buckets (all of the shard's, in order)
-- ARGV[1]  limit   when no ids follow: purge the oldest `limit` dead letters
-- ARGV[2..] ids
-- Returns: the ids purged.
-- Errors: none.
local FIRST = 2
local ids = {}
for k = 2, #ARGV do ids[#ids + 1] = ARGV[k] end
if #ids == 0 then ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1) end
local out = {}
for _, id in ipairs(ids) do
  if redis.call('ZREM', KEYS[1], id) == 1 then
    redis.call('HDEL', bucket_key(id, FIRST), id)
    redis.call('HDEL', KEYS[2], id)
    out[#out + 1] = id
  end
end
return out
