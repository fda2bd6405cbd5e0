-- reap.lua: return expired leases to due (attempt + 1), or to dead after max attempts.
--   A pre-start lease (its score has a half ms: claim.lua; the run never started, since
--   extend.lua marks a start with a whole ms) goes back to due at the same attempt,
--   its error set to UNSTARTED: a worker that died before the run cost no attempt. A
--   second such return in a row (the error still UNSTARTED: no run started or failed
--   in between) is charged as a started one, so a job that kills its worker before its
--   start is marked still runs out of attempts (at half the pace).
-- KEYS[1] leased  KEYS[2] due  KEYS[3] dead  KEYS[4] epoch  KEYS[5] clock
-- KEYS[6] prio  the priority index (_lib.lua: prio_add)
-- KEYS[7..] jobs buckets (all of the shard's, in order)
-- ARGV[1]  epoch   the caller's fencing epoch for this shard
-- ARGV[2]  limit   at most this many leases
-- ARGV[3]  look    1: write nothing, return what a reap would do (the Postgres mode
--                  records it in PostgreSQL first): {now, then per lease id, nominal,
--                  attempt after, 0 same attempt / 1 attempt + 1 / 2 dead}
-- ARGV[4]  upto    ms, 0 none: only leases expired by then (what a look saw)
-- Returns: {now, n_requeued, id_1 .. id_n (requeued), then the ids of dead jobs}
-- Errors: TW_FENCED if ARGV[1] is not the shard's current epoch (nothing written).
local FIRST = 6
local UNSTARTED = 'lease expired before the run started'
local leased_key, due_key, dead_key = KEYS[1], KEYS[2], KEYS[3]
local err = fence(KEYS[4], ARGV[1])
if err then return err end
local now = clock_now(KEYS[5], true)
local upto = tonumber(ARGV[4] or '0')
local hits = redis.call('ZRANGEBYSCORE', leased_key, '-inf',
  fmt((upto and upto > 0 and upto < now) and upto or now),
  'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[2]))
local look = ARGV[3] == '1'
local requeued, dead, plan = {}, {}, {now}
for k = 1, #hits, 2 do
  local id = hits[k]
  local started = tonumber(hits[k + 1]) % 1 == 0
  local jobs_key = bucket_key(id, FIRST)
  local s = redis.call('HGET', jobs_key, id)
  if not look then redis.call('ZREM', leased_key, id) end
  if s then
    local r = rec_decode(s)
    local act = 1
    if not started and r[F_ERROR] ~= UNSTARTED then
      act = 0
    elseif r[F_ATTEMPT] >= r[F_MAX] then
      act = 2
    end
    if look then
      local n = #plan
      plan[n + 1], plan[n + 2] = id, r[F_NOMINAL]
      plan[n + 3], plan[n + 4] = r[F_ATTEMPT] + (act == 1 and 1 or 0), act
    else
      r[F_EPOCH] = 0
      if act == 0 then
        r[F_ERROR] = UNSTARTED
        redis.call('ZADD', due_key, fmt(now), id)
        prio_add(KEYS[6], id, now, r[F_PRIORITY])
        requeued[#requeued + 1] = id
      elseif act == 2 then
        r[F_ERROR] = 'lease expired'
        redis.call('ZADD', dead_key, fmt(now), id)
        dead[#dead + 1] = id
      else
        r[F_ERROR] = 'lease expired'
        r[F_ATTEMPT] = r[F_ATTEMPT] + 1
        redis.call('ZADD', due_key, fmt(now), id)
        prio_add(KEYS[6], id, now, r[F_PRIORITY])
        requeued[#requeued + 1] = id
      end
      redis.call('HSET', jobs_key, id, rec_encode(r))
    end
  end
end
if look then return plan end
local out = {now, #requeued}
for _, id in ipairs(requeued) do out[#out + 1] = id end
for _, id in ipairs(dead) do out[#out + 1] = id end
return out
