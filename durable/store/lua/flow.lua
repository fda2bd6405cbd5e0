-- flow.lua: schedule one job under debounce or throttle, atomic under concurrent
-- producers. The due is computed here from now (TIME), never from the client's clock.
-- KEYS[1] due  KEYS[2] leased  KEYS[3] dead  KEYS[4] clock  KEYS[5] the job's record
-- bucket  KEYS[6] parked  KEYS[7] parkedx  KEYS[8] the id's flow key: {ns:s}:deb:<id>
--   (debounce: the deadline first schedule + max_wait, ms) or {ns:s}:thr:<id>
--   (throttle: the due of the id's last throttled run, ms); a STRING with a TTL
-- KEYS[9] prio  the priority index (_lib.lua: prio_add)
-- KEYS[10] trail  HASH id -> the id's pending trailing run (below), which ack.lua
--   creates when the running job's run completes
-- KEYS[11] waiting  HASH task -> jobs waiting for their flow key: a waiting job of the
--   id replaced here leaves the count (_lib.lua: wait_end_packed)
-- ARGV[1]  kind      'd' debounce, 't' throttle
-- ARGV[2]  id
-- ARGV[3]  window    ms: the debounce quiet time, or the throttle period
-- ARGV[4]  max_wait  ms (debounce; 0: none)
-- ARGV[5]  record    the packed record, nominal 0 (the due score), encoded by the client
-- ARGV[6]  priority  the record's priority (0, '' or absent: none)
-- Returns: {now, status, when}: status 1 created, 3 replaced (debounce: a waiting job's
--   due moved and payload replaced), 6 coalesced (a waiting job kept at its due,
--   payload replaced; or, while the id's job runs, folded into its trailing run: when
--   = the lease deadline, the earliest the trailing run can be).
-- The trailing run: a call while the id's job is leased records (or replaces) one
--   pending run in KEYS[10]: msgpack {kind, window, max_wait, record, priority, first}
--   (first: the time of the first such call, for max_wait). ack.lua creates it, fenced,
--   in the ack of the run: throttle at max(now, last throttled due + window), debounce
--   at now + window (no later than first + max_wait). A call that finds the job waiting
--   or absent drops a pending one: the waiting or new run is the trailing run.
-- Errors: none (the client validates every argument).
-- A job of the id that is dead, parked or in the far index is replaced as if absent.
-- Sent twice: the second call is one more schedule of the same id a moment later; it
-- finds the job the first made waiting and coalesces (throttle) or moves its due to
-- now + window within the same deadline (debounce): the state any two calls give.
local due_key, leased_key, dead_key, jobs_key = KEYS[1], KEYS[2], KEYS[3], KEYS[5]
local flow_key = KEYS[8]
local id, window, max_wait = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local now = clock_now(KEYS[4], true)
-- The record written, and its priority entry for the due it waits at.
local function put(due)
  redis.call('HSET', jobs_key, id, ARGV[5])
  redis.call('ZREM', KEYS[9], id)
  prio_add(KEYS[9], id, due, tonumber(ARGV[6]))
end
local s = redis.call('HGET', jobs_key, id)
local waiting = nil
if s then
  local lease = redis.call('ZSCORE', leased_key, id)
  if lease then
    local pending = redis.call('HGET', KEYS[10], id)
    local first = pending and select(6, cmsgpack.unpack(pending)) or now
    redis.call('HSET', KEYS[10], id,
      cmsgpack.pack(ARGV[1], window, max_wait, ARGV[5], tonumber(ARGV[6]) or 0, first))
    return {now, 6, tonumber(lease)}
  end
  wait_end_packed(KEYS[11], s)
  waiting = redis.call('ZSCORE', due_key, id)
  if waiting then
    waiting = tonumber(waiting)
  else
    redis.call('ZREM', dead_key, id)  -- if far, its entry there is left behind
    unpark_drop(KEYS[6], KEYS[7], id, s)
  end
end
redis.call('HDEL', KEYS[10], id)  -- not running: the run below is the trailing one
if ARGV[1] == 't' then
  if waiting then
    put(waiting)
    return {now, 6, waiting}
  end
  local last = tonumber(redis.call('GET', flow_key))
  local due = now
  if last and last + window > due then due = last + window end
  put(due)
  redis.call('ZADD', due_key, fmt(due), id)
  redis.call('SET', flow_key, fmt(due), 'PX', fmt(due - now + window))
  return {now, s and 3 or 1, due}
end
-- debounce
if waiting and waiting <= now then
  -- Due already (a worker is on its way): the burst's run is this one.
  put(waiting)
  return {now, 6, waiting}
end
local due = now + window
local deadline = waiting and tonumber(redis.call('GET', flow_key))
if not deadline then
  if max_wait > 0 then
    -- The first schedule of a burst: its deadline lives as long as it can matter.
    deadline = now + max_wait
    redis.call('SET', flow_key, fmt(deadline), 'PX', fmt(max_wait + window))
  else
    redis.call('DEL', flow_key)
  end
end
if deadline and due > deadline then due = deadline end
put(due)
redis.call('ZADD', due_key, fmt(due), id)
return {now, s and 3 or 1, due}
