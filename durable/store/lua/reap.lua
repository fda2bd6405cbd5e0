-- reap.lua: return expired leases to due (attempt + 1), or to dead after max attempts.
--   A pre-start lease (its score has a half ms: claim.lua; the run never started, since
--   extend.lua marks a start with a whole ms) goes back to due at the same attempt,
--   its error set to UNSTARTED: a worker that died before the run cost no attempt. A
--   second such return in a row (the error still UNSTARTED: no run started or failed
--   in between) is charged as a started one, so a job that kills its worker before its
--   start is marked still runs out of attempts (at half the pace).
-- KEYS[1] leased  KEYS[2] due  KEYS[3] dead  KEYS[4] epoch  KEYS[5] clock
-- KEYS[6..] jobs buckets (all of the shard's, in order)
-- ARGV[1]  epoch   the caller's fencing epoch for this shard
-- ARGV[2]  limit   at most this many leases
-- Returns: {now, n_requeued, id_1 .. id_n (requeued), then the ids of dead jobs}
-- Errors: TW_FENCED if ARGV[1] is not the shard's current epoch (nothing written).
local FIRST = 5
local UNSTARTED = 'lease expired before the run started'
local leased_key, due_key, dead_key = KEYS[1], KEYS[2], KEYS[3]
local err = fence(KEYS[4], ARGV[1])
if err then return err end
local now = clock_now(KEYS[5], true)
local hits = redis.call('ZRANGEBYSCORE', leased_key, '-inf', fmt(now),
  'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[2]))
local requeued, dead = {}, {}
for k = 1, #hits, 2 do
  local id = hits[k]
  local started = tonumber(hits[k + 1]) % 1 == 0
  redis.call('ZREM', leased_key, id)
  local jobs_key = bucket_key(id, FIRST)
  local s = redis.call('HGET', jobs_key, id)
  if s then
    local r = rec_decode(s)
    r[F_EPOCH] = 0
    if not started and r[F_ERROR] ~= UNSTARTED then
      r[F_ERROR] = UNSTARTED
      redis.call('ZADD', due_key, fmt(now), id)
      requeued[#requeued + 1] = id
    elseif r[F_ATTEMPT] >= r[F_MAX] then
      r[F_ERROR] = 'lease expired'
      redis.call('ZADD', dead_key, fmt(now), id)
      dead[#dead + 1] = id
    else
      r[F_ERROR] = 'lease expired'
      r[F_ATTEMPT] = r[F_ATTEMPT] + 1
      redis.call('ZADD', due_key, fmt(now), id)
      requeued[#requeued + 1] = id
    end
    redis.call('HSET', jobs_key, id, rec_encode(r))
  end
end
local out = {now, #requeued}
for _, id in ipairs(requeued) do out[#out + 1] = id end
for _, id in ipairs(dead) do out[#out + 1] = id end
return out
