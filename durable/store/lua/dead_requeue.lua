-- dead_requeue.lua: put dead letters back to due now, attempt 1, same occurrence.
-- KEYS[1] dead  KEYS[2] due  KEYS[3] clock  KEYS[4] prio  the priority index (_lib.lua: prio_add)
-- KEYS[5..] jobs buckets (all, in order)
-- ARGV[1]  limit   when no ids follow: requeue the oldest `limit` dead letters
-- ARGV[2..] ids
-- Returns: the ids requeued.
-- Errors: none.
local FIRST = 4
local now = clock_now(KEYS[3], true)
local ids = {}
for k = 2, #ARGV do ids[#ids + 1] = ARGV[k] end
if #ids == 0 then ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1) end
local out = {}
for _, id in ipairs(ids) do
  if redis.call('ZREM', KEYS[1], id) == 1 then
    local jobs_key = bucket_key(id, FIRST)
    local s = redis.call('HGET', jobs_key, id)
    if s then
      local r = rec_decode(s)
      r[F_ATTEMPT], r[F_EPOCH], r[F_ERROR] = 1, 0, ''
      redis.call('HSET', jobs_key, id, rec_encode(r))
      redis.call('ZADD', KEYS[2], fmt(now), id)
      prio_add(KEYS[4], id, now, r[F_PRIORITY])
      out[#out + 1] = id
    end
  end
end
return out
