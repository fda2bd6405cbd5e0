-- waits.lua: the flow-limit waits or wakes of many jobs of one shard in one call
-- (docs/limits.md): each as retry.lua mode 3 or wake.lua does it for one job, the
-- script's own cost paid once.
-- KEYS[1] leased  KEYS[2] due  KEYS[3] epoch  KEYS[4] clock
-- KEYS[5] prio   the priority index (_lib.lua: prio_add)
-- KEYS[6] wakes  ZSET id -> until when a wake that found it still leased holds
-- KEYS[7] waiting  HASH task -> its jobs of this shard waiting ({ns:s}:kwaitn, _lib.lua)
-- KEYS[8] rechecks  ZSET "<task>\0<key>" -> when the key's waiters are rechecked (the
--                  safety net of a lost wake: _lib.lua limit_wait, Limiter's recheck)
-- KEYS[9..]      the jobs buckets the jobs below name by index
-- ARGV[1]  op     'w' wait, 'k' wake, 'r' the rechecks due, 't' the rechecks done
-- 'w': ARGV[2] epoch (the caller's for this shard), then 6 per job: id, attempt,
--      nominal, delay (ms), permit ('1' a permit wait, '' a wait for a start), the
--      index of its bucket key. Each job is given back, unspent, flagged and counted as
--      waiting (_lib.lua: limit_wait): for a permit, in no index, its key's timer set
--      to now + delay at the latest (due now instead, not waiting, when its wake came
--      while it was still leased); for a start, due at now + delay.
-- 'k': ARGV[2] ms a wake of a leased job is kept, then 2 per job: id, the index of its
--      bucket key.
-- 'r': ARGV[2] at most this many: returns {member, when, ...} of the rechecks due by
--      now (read only).
-- 't': ARGV[2] ms to the next recheck, then 3 per key: member, the `when` 'r' read,
--      the waiters its key has left: a key with waiters is rechecked again then; one
--      without has its timer removed, unless a wait set it again since it was read.
--      Returns the count of timers set again.
-- Returns: 'w': {status_1, due_1, ...}: status 3 done, 0 its lease is lost (nothing
--   written for it). 'k': {code_1, ...}: as wake.lua's. Re-sent: 'w' finds no lease
--   (0), 'k' finds no wait (0).
-- Errors: 'w': TW_FENCED if ARGV[2] is not the shard's current epoch (nothing written).
local op = ARGV[1]
if op == 'r' then
  local t = redis.call('TIME')
  local now = math.max(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000),
    tonumber(redis.call('GET', KEYS[4]) or '0'))
  return redis.call('ZRANGEBYSCORE', KEYS[8], '-inf', fmt(now), 'WITHSCORES', 'LIMIT', 0,
    tonumber(ARGV[2]))
end
local now = clock_now(KEYS[4], true)
local out = {}
if op == 't' then
  local again, next_at = 0, fmt(now + tonumber(ARGV[2]))
  for i = 3, #ARGV, 3 do
    local m = ARGV[i]
    local at = redis.call('ZSCORE', KEYS[8], m)
    if at and tonumber(at) == tonumber(ARGV[i + 1]) then
      if tonumber(ARGV[i + 2]) > 0 then
        redis.call('ZADD', KEYS[8], next_at, m)
        again = again + 1
      else
        redis.call('ZREM', KEYS[8], m)
      end
    end
  end
  return again
end
batch_start()  -- the counts written once at the end (_lib.lua: BATCH)
if op == 'k' then
  local hold = tonumber(ARGV[2])
  for i = 3, #ARGV, 2 do
    out[#out + 1] = limit_wake(KEYS[2], KEYS[1], KEYS[7], KEYS[6], KEYS[5],
      KEYS[tonumber(ARGV[i + 1])], ARGV[i], now, hold)
  end
  counts_flush(KEYS[7])
  return out
end
local err = fence(KEYS[3], ARGV[2])
if err then return err end
local epoch = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', '(' .. fmt(now))
BATCH.nowakes = redis.call('EXISTS', KEYS[6]) == 0  -- no wake kept: none looked up a job
for i = 3, #ARGV, 6 do
  local id, jobs_key = ARGV[i], KEYS[tonumber(ARGV[i + 5])]
  local s = redis.call('HGET', jobs_key, id)
  local r = s and rec_decode(s)
  -- Held by the caller (its record) and leased (removed here, the lease checked so).
  if r and holds(r, epoch, ARGV[i + 1], ARGV[i + 2])
    and redis.call('ZREM', KEYS[1], id) == 1 then
    out[#out + 1] = 3
    out[#out + 1] = limit_wait(nil, KEYS[2], KEYS[5], KEYS[7], KEYS[6], KEYS[8], jobs_key,
      id, r, now, tonumber(ARGV[i + 3]), ARGV[i + 4] == '1')
  else
    out[#out + 1] = 0
    out[#out + 1] = 0
  end
end
counts_flush(KEYS[7])
return out
