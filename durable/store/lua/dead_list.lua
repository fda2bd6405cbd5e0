-- dead_list.lua: a page of dead letters, oldest first (read only).
-- KEYS[1] dead  KEYS[2..] jobs buckets (all of the shard's, in order)
-- ARGV[1]  offset
-- ARGV[2]  count
-- Returns: {total, then per job: id, died_at, field_1 .. field_13} (15 values per job)
-- Errors: none.
local FIRST = 1
local hits = redis.call('ZRANGE', KEYS[1], tonumber(ARGV[1]),
  tonumber(ARGV[1]) + tonumber(ARGV[2]) - 1, 'WITHSCORES')
local out = {redis.call('ZCARD', KEYS[1])}
local n = 1
for k = 1, #hits, 2 do
  local s = redis.call('HGET', bucket_key(hits[k], FIRST), hits[k])
  if s then
    local died = tonumber(hits[k + 1])
    out[n + 1], out[n + 2] = hits[k], died
    n = rec_row(out, n + 2, rec_decode(s), died)
  end
end
return out
