-- schedule_one.lua: create (or keep, or replace) one job: schedule.lua for a batch of
-- one, with the job in ARGV instead of a packed batch. Same decisions, same reply; it
-- skips the batch's unpacking, grouping by bucket and buffering, which cost more than
-- the single job's own reads and writes (measured: 9.9 against 13.6 us per call).
-- KEYS[1] due  KEYS[2] leased  KEYS[3] done  KEYS[4] dead  KEYS[5] clock  KEYS[6] far
-- KEYS[7] faro  KEYS[8] the job's own record bucket  KEYS[9] parked  KEYS[10] parkedx
--   (a replaced parked job, of a paused task, leaves the parked jobs)
-- KEYS[11] prio  the priority index (_lib.lua: prio_add)
-- KEYS[12] waiting  HASH task -> jobs waiting for their flow key: a replaced waiting
--   job leaves the count (_lib.lua: wait_end_packed)
-- ARGV[1]  replace   1: overwrite a job that is due or dead; 0: keep an existing job
-- ARGV[2]  id
-- ARGV[3]  mode      0: ARGV[4] is an absolute due (ms); 1: a delay (ms) added to now
-- ARGV[4]  time
-- ARGV[5]  record    the packed record (see _lib.lua), nominal 0, encoded by the client
-- ARGV[6]  priority  the record's priority (0, '' or absent: none)
-- Returns: {now, status, when}, as schedule.lua for its one job:
--   status 1 created, 2 kept (exists; when = its due, lease deadline or time of death),
--          3 replaced, 4 busy (leased: never replaced; when = lease deadline),
--          5 done (this occurrence completed already; nothing written); with
--          replace on, an entry of a higher version (field 19) than a record that
--          has one is kept (2)
-- Errors: none (the client validates every argument).
local due_key, leased_key, done_key, dead_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local far_key, faro_key, jobs_key = KEYS[6], KEYS[7], KEYS[8]
local id = ARGV[2]
local now = clock_now(KEYS[5], true)
local due = tonumber(ARGV[4])
if ARGV[3] == '1' then due = now + due end
local done = redis.call('ZSCORE', done_key, done_member(due, id))
local status = 1
local in_due = false
local s = redis.call('HGET', jobs_key, id)
if s then
  local lease = redis.call('ZSCORE', leased_key, id)
  if ARGV[1] ~= '1' then
    local when = lease or redis.call('ZSCORE', due_key, id) or redis.call('ZSCORE', dead_key, id)
      or redis.call('ZSCORE', KEYS[9], id) or far_due(s)
    return {now, 2, tonumber(when)}
  end
  if lease then return {now, 4, tonumber(lease)} end
  if done then return {now, 5, due} end
  if rec_newer(s, ARGV[5]) then  -- written from a newer row version (Postgres mode): kept
    local when = redis.call('ZSCORE', due_key, id) or redis.call('ZSCORE', dead_key, id)
      or redis.call('ZSCORE', KEYS[9], id) or far_due(s)
    return {now, 2, tonumber(when)}
  end
  if redis.call('ZSCORE', due_key, id) then
    in_due = true
  else
    redis.call('ZREM', dead_key, id)  -- if far, its entry there is left behind
    unpark_drop(KEYS[9], KEYS[10], id, s)
  end
  status = 3
  wait_end_packed(KEYS[12], s)
  redis.call('ZREM', KEYS[11], id)
elseif done then
  return {now, 5, due}
end
if goes_far(now, due) and not own_nominal(ARGV[5], due) then
  redis.call('HSET', jobs_key, id, rec_with_nominal(ARGV[5], due))
  if in_due then redis.call('ZREM', due_key, id) end
  far_push_one(far_key, faro_key, due, id)
else
  redis.call('HSET', jobs_key, id, ARGV[5])
  redis.call('ZADD', due_key, fmt(due), id)
end
prio_add(KEYS[11], id, due, tonumber(ARGV[6]))
return {now, status, due}
