-- reschedule.lua: move a due job to a new due time (a new occurrence: attempt 1).
-- KEYS[1] due  KEYS[2] done  KEYS[3] clock  KEYS[4] the job's jobs bucket
-- ARGV[1]  id
-- ARGV[2]  mode      0: ARGV[3] is an absolute due (ms); 1: a delay (ms) added to now
-- ARGV[3]  time
-- Returns: {status, when}: status 1 moved (when = new due), 0 no such job,
--   2 not due (leased or dead: untouched), 5 the new occurrence is done already.
-- Errors: none.
local id = ARGV[1]
local now = clock_now(KEYS[3], true)
local due = tonumber(ARGV[3])
if ARGV[2] == '1' then due = now + due end
local s = redis.call('HGET', KEYS[4], id)
if not s then return {0, 0} end
if not redis.call('ZSCORE', KEYS[1], id) then return {2, 0} end
if redis.call('ZSCORE', KEYS[2], done_member(due, id)) then return {5, due} end
local r = rec_decode(s)
r[F_NOMINAL], r[F_ATTEMPT], r[F_ERROR] = 0, 1, ''
redis.call('HSET', KEYS[4], id, rec_encode(r))
redis.call('ZADD', KEYS[1], fmt(due), id)
return {1, due}
