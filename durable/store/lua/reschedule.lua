-- reschedule.lua: move a due job to a new due time (a new occurrence: attempt 1).
-- KEYS[1] due  KEYS[2] done  KEYS[3] clock  KEYS[4] leased  KEYS[5] dead  KEYS[6] far
-- KEYS[7] faro  KEYS[8] the job's jobs bucket  KEYS[9] parked  KEYS[10] parkedx
-- KEYS[11] prio  the priority index (_lib.lua: prio_add)
-- KEYS[12] waiting  HASH task -> jobs waiting for their flow key: a waiting job moved
--   leaves its wait (its wake finds it out of it: docs/limits.md)
--   (a parked job, of a paused task, leaves the parked jobs: a claim parks it again
--   when it falls due while its task is still paused)
-- ARGV[1]  id
-- ARGV[2]  mode      0: ARGV[3] is an absolute due (ms); 1: a delay (ms) added to now
-- ARGV[3]  time
-- ARGV[4]  version   the Postgres mode's new row version (field 19), taken under the
--          row's lock; absent or 0: the record keeps its own (the Redis-only mode)
-- Returns: {status, when}: status 1 moved (when = new due), 0 no such job,
--   2 not due (leased or dead: untouched), 5 the new occurrence is done already.
-- Errors: none.
local due_key, far_key, faro_key, jobs_key = KEYS[1], KEYS[6], KEYS[7], KEYS[8]
local id = ARGV[1]
local now = clock_now(KEYS[3], true)
local due = tonumber(ARGV[3])
if ARGV[2] == '1' then due = now + due end
local s = redis.call('HGET', jobs_key, id)
if not s then return {0, 0} end
local in_due = redis.call('ZSCORE', due_key, id) ~= false
if not in_due and (redis.call('ZSCORE', KEYS[4], id) or redis.call('ZSCORE', KEYS[5], id)) then
  return {2, 0}
end
if redis.call('ZSCORE', KEYS[2], done_member(due, id)) then return {5, due} end
unpark_drop(KEYS[9], KEYS[10], id, s)
local r = rec_decode(s)
r[F_NOMINAL], r[F_ATTEMPT], r[F_ERROR] = 0, 1, ''
local version = tonumber(ARGV[4] or 0)
if version > r[F_VERSION] then r[F_VERSION] = version end
wait_end(KEYS[12], r)
if goes_far(now, due) then
  r[F_NOMINAL] = due
  if in_due then redis.call('ZREM', due_key, id) end
  far_push_one(far_key, faro_key, due, id)
else
  redis.call('ZADD', due_key, fmt(due), id)
end
redis.call('HSET', jobs_key, id, rec_encode(r))
prio_add(KEYS[11], id, due, r[F_PRIORITY])
return {1, due}
