-- dead_list.lua: a page of dead letters, oldest first (read only).
-- KEYS[1] dead  KEYS[2..] jobs buckets (all of the shard's, in order)
-- ARGV[1]  offset
-- ARGV[2]  count
-- Returns: {total, then per job: id, died_at, field_1 .. field_18} (20 values per job)
-- Errors: none.
local FIRST = 1
local hits = redis.call('ZRANGE', KEYS[1], tonumber(ARGV[1]),
  tonumber(ARGV[1]) + tonumber(ARGV[2]) - 1, 'WITHSCORES')
local out = {redis.call('ZCARD', KEYS[1])}
page_rows(out, 1, hits, FIRST)
return out
