-- schedule_one.lua: create (or keep, or replace) one job: schedule.lua for a batch of
-- one, with the job in ARGV instead of a packed batch. Same decisions, same reply; it
-- skips the batch's unpacking, grouping by bucket and buffering, which cost more than
-- the single job's own reads and writes (measured: 9.9 against 13.6 us per call).
-- KEYS[1] due  KEYS[2] leased  KEYS[3] done  KEYS[4] dead  KEYS[5] clock
-- KEYS[6] the job's own record bucket
-- ARGV[1]  replace   1: overwrite a job that is due or dead; 0: keep an existing job
-- ARGV[2]  id
-- ARGV[3]  mode      0: ARGV[4] is an absolute due (ms); 1: a delay (ms) added to now
-- ARGV[4]  time
-- ARGV[5]  record    the packed record (see _lib.lua), nominal 0, encoded by the client
-- Returns: {now, status, when}, as schedule.lua for its one job:
--   status 1 created, 2 kept (exists; when = its score), 3 replaced,
--          4 busy (leased: never replaced; when = lease deadline),
--          5 done (this occurrence completed already; nothing written)
-- Errors: none (the client validates every argument).
local due_key, leased_key, done_key, dead_key, jobs_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[6]
local id = ARGV[2]
local now = clock_now(KEYS[5], true)
local due = tonumber(ARGV[4])
if ARGV[3] == '1' then due = now + due end
local done = redis.call('ZSCORE', done_key, done_member(due, id))
local status = 1
if redis.call('HEXISTS', jobs_key, id) == 1 then
  local lease = redis.call('ZSCORE', leased_key, id)
  if ARGV[1] ~= '1' then
    local when = redis.call('ZSCORE', due_key, id) or lease or redis.call('ZSCORE', dead_key, id)
    return {now, 2, tonumber(when or 0)}
  end
  if lease then return {now, 4, tonumber(lease)} end
  if done then return {now, 5, due} end
  redis.call('ZREM', dead_key, id)
  status = 3
elseif done then
  return {now, 5, due}
end
redis.call('HSET', jobs_key, id, ARGV[5])
redis.call('ZADD', due_key, fmt(due), id)
return {now, status, due}
