-- waits.lua: the flow-limit waits or wakes of many jobs of one shard in one call
-- (docs/limits.md): each as retry.lua mode 3 or wake.lua does it for one job, the
-- script's own cost paid once.
-- KEYS[1] leased  KEYS[2] due  KEYS[3] epoch  KEYS[4] clock
-- KEYS[5] prio   the priority index (_lib.lua: prio_add)
-- KEYS[6] wakes  ZSET id -> until when a wake that found it still leased holds
-- KEYS[7] waiting  HASH task -> its jobs of this shard waiting ({ns:s}:kwaitn, _lib.lua)
-- KEYS[8..]      the jobs buckets the jobs below name by index
-- ARGV[1]  op     'w' wait, 'k' wake
-- 'w': ARGV[2] epoch (the caller's for this shard), then 6 per job: id, attempt,
--      nominal, delay (ms), permit ('1' a permit wait, '' a wait for a start), the
--      index of its bucket key. Each job is given back to due, unspent, at now + delay
--      (now, for a permit wait whose wake came while it was still leased), flagged
--      and counted as waiting (_lib.lua: limit_wait).
-- 'k': ARGV[2] ms a wake of a leased job is kept, then 2 per job: id, the index of its
--      bucket key.
-- Returns: 'w': {status_1, due_1, ...}: status 3 done, 0 its lease is lost (nothing
--   written for it). 'k': {code_1, ...}: as wake.lua's. Re-sent: 'w' finds no lease
--   (0), 'k' finds no wait (0).
-- Errors: 'w': TW_FENCED if ARGV[2] is not the shard's current epoch (nothing written).
local op = ARGV[1]
local now = clock_now(KEYS[4], true)
local out = {}
if op == 'k' then
  local hold = tonumber(ARGV[2])
  for i = 3, #ARGV, 2 do
    out[#out + 1] = limit_wake(KEYS[2], KEYS[1], KEYS[7], KEYS[6], KEYS[5],
      KEYS[tonumber(ARGV[i + 1])], ARGV[i], now, hold)
  end
  return out
end
local err = fence(KEYS[3], ARGV[2])
if err then return err end
local epoch = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', '(' .. fmt(now))
for i = 3, #ARGV, 6 do
  local id, jobs_key = ARGV[i], KEYS[tonumber(ARGV[i + 5])]
  local s = redis.call('HGET', jobs_key, id)
  local r = s and redis.call('ZSCORE', KEYS[1], id) and rec_decode(s)
  if r and holds(r, epoch, ARGV[i + 1], ARGV[i + 2]) then
    out[#out + 1] = 3
    out[#out + 1] = limit_wait(KEYS[1], KEYS[2], KEYS[5], KEYS[7], KEYS[6], jobs_key, id, r,
      now, tonumber(ARGV[i + 3]), ARGV[i + 4] == '1')
  else
    out[#out + 1] = 0
    out[#out + 1] = 0
  end
end
return out
