-- retry.lua: give a leased job back for another attempt after a delay, or kill it.
-- KEYS[1] leased  KEYS[2] due  KEYS[3] dead  KEYS[4] epoch  KEYS[5] clock
-- KEYS[6] the job's jobs bucket  KEYS[7] prio  the priority index (_lib.lua: prio_add)
-- ARGV[1]  epoch   the caller's fencing epoch for this shard
-- ARGV[2]  id
-- ARGV[3]  attempt the attempt the caller holds
-- ARGV[4]  nominal the nominal due of the occurrence the caller holds
-- ARGV[5]  delay   ms added to now (backoff with jitter, computed by the client)
-- ARGV[6]  error   text kept in the record
-- ARGV[7]  final   1: dead now, whatever attempts remain (e.g. an unknown task);
--                  2: a Defer: due again at now + delay as the SAME attempt and
--                  occurrence, the error text left as it was (ARGV[6] unused);
--                  3: a wait for a permit or a start of its flow key (limits.lua):
--                  the same attempt and occurrence, flagged and counted as waiting
--                  in KEYS[8] (_lib.lua: limit_wait; wake.lua, metrics): for a start
--                  as 2; for a permit (ARGV[8] '1') in no index, its key's timer in
--                  KEYS[10] set to now + delay at the latest, or due at once, not
--                  waiting, when a wake came while it was still leased (KEYS[9])
-- KEYS[8] waiting ({ns:s}:kwaitn)  KEYS[9] wakes  KEYS[10] rechecks   (mode 3 only)
-- ARGV[8]  mode 3: '1' a permit wait, '' a wait for a start (rate)
-- Returns: {status, when}: 1 due again at when (attempt + 1), 2 dead since when
--   (attempt was the last of max, or final), 3 deferred to when (same attempt),
--   0 lease lost. Sent twice, the second finds no lease and returns 0, nothing written.
-- Errors: TW_FENCED if ARGV[1] is not the shard's current epoch (nothing written).
local leased_key, jobs_key = KEYS[1], KEYS[6]
local err = fence(KEYS[4], ARGV[1])
if err then return err end
local epoch = tonumber(ARGV[1])
local id = ARGV[2]
local now = clock_now(KEYS[5], true)
local s = redis.call('HGET', jobs_key, id)
if not s or not redis.call('ZSCORE', leased_key, id) then return {0, 0} end
local r = rec_decode(s)
if not holds(r, epoch, ARGV[3], ARGV[4]) then return {0, 0} end
if ARGV[7] == '3' then
  redis.call('ZREMRANGEBYSCORE', KEYS[9], '-inf', '(' .. fmt(now))
  return {3, limit_wait(leased_key, KEYS[2], KEYS[7], KEYS[8], KEYS[9], KEYS[10], jobs_key, id, r,
    now, tonumber(ARGV[5]), ARGV[8] == '1')}
end
redis.call('ZREM', leased_key, id)
if ARGV[7] == '2' then
  -- The nominal stays explicit (the occurrence's identity): a recurring job's next
  -- occurrence is planned from it at the ack, not from the deferred due.
  r[F_EPOCH] = 0
  local due = now + tonumber(ARGV[5])
  redis.call('HSET', jobs_key, id, rec_encode(r))
  redis.call('ZADD', KEYS[2], fmt(due), id)
  prio_add(KEYS[7], id, due, r[F_PRIORITY])
  return {3, due}
end
r[F_EPOCH], r[F_ERROR] = 0, ARGV[6]
if r[F_ATTEMPT] >= r[F_MAX] or ARGV[7] == '1' then
  redis.call('HSET', jobs_key, id, rec_encode(r))
  redis.call('ZADD', KEYS[3], fmt(now), id)
  return {2, now}
end
r[F_ATTEMPT] = r[F_ATTEMPT] + 1
local due = now + tonumber(ARGV[5])
redis.call('HSET', jobs_key, id, rec_encode(r))
redis.call('ZADD', KEYS[2], fmt(due), id)
prio_add(KEYS[7], id, due, r[F_PRIORITY])
return {1, due}
