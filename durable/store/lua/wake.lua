-- wake.lua: a job whose permit was just handed to it (limits.lua release) is due now.
-- KEYS[1] due  KEYS[2] leased  KEYS[3] clock
-- KEYS[4] waits  ZSET id -> the due its permit wait gave it (retry.lua mode 3)
-- KEYS[5] wakes  ZSET id -> until when a wake that found it still leased holds
-- KEYS[6] prio   the priority index (_lib.lua: prio_lanes): a job's entry follows it
-- ARGV[1]  id
-- ARGV[2]  ms a wake of a leased job is kept for its wait to see (retry.lua mode 3)
-- Returns: 1 due now; 2 still leased (its wait, about to be written, finds the wake and
--   makes it due at once); 0 not waiting: gone, moved by a user (its due is not the
--   one its wait gave it: a reschedule keeps its time), or running. Re-sent: 1 then 0.
-- Errors: none.
local id = ARGV[1]
local now = clock_now(KEYS[3], true)
local w = redis.call('ZSCORE', KEYS[4], id)
if w then
  redis.call('ZREM', KEYS[4], id)
  local d = redis.call('ZSCORE', KEYS[1], id)
  if d and tonumber(d) == tonumber(w) then
    if tonumber(d) > now then
      redis.call('ZADD', KEYS[1], fmt(now), id)
      local ps = redis.call('ZSCORE', KEYS[6], id)
      if ps then  -- its priority: the level of its entry, now due now
        prio_add(KEYS[6], id, now, MAX_PRIORITY - math.floor(tonumber(ps) / PRIO_SPAN))
      end
    end
    return 1
  end
end
-- Waits past their due (never woken: claimed at their recheck time) are trimmed.
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', '(' .. fmt(now))
if redis.call('ZSCORE', KEYS[2], id) then
  redis.call('ZADD', KEYS[5], fmt(now + tonumber(ARGV[2])), id)
  return 2
end
return 0
