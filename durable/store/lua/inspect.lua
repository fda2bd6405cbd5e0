-- inspect.lua: what an operator wants to know about one shard (read only).
-- KEYS[1] due  KEYS[2] leased  KEYS[3] dead  KEYS[4] owner  KEYS[5] epoch  KEYS[6] clock
-- KEYS[7] far  KEYS[8] faro  KEYS[9] parked  KEYS[10] paused
-- KEYS[11] waiting  HASH task -> jobs waiting for their flow key ({ns:s}:kwaitn)
-- KEYS[12..] jobs buckets (all of the shard's, in order)
-- ARGV: none.
-- Returns: {now, due, overdue, oldest_overdue, next_due, leased, expired, dead, owner,
--   owner_ttl, epoch, parked, paused, waiting}: now is max(TIME, clock) in ms (the clock is not advanced);
--   due, leased and dead are counts (due: in due and in the far index); overdue counts
--   jobs in due whose time is <= now, and oldest_overdue is the earliest of their due
--   times (0 when none); next_due is the earliest due time after now (0 when none).
--   A far job is in due by the time it is due as long as claims run (each promotes the
--   far slots a slot ahead). While none runs, the far chunks whose slot has started
--   count their entries in overdue (cancelled ones too, at most FAR_LOOK chunks read),
--   and oldest_overdue takes the first far slot's start into account. next_due is the
--   earliest live due of the first far slot when due has none later (exact when that
--   slot has at most FAR_LOOK chunks, else the slot's start).
--   The other fields: expired counts leases past their
--   deadline (the reaper's work); owner is the owner token ('' when free) and
--   owner_ttl its PTTL in ms (-2 when free); epoch is the shard's fencing epoch;
--   parked counts the due jobs of paused tasks set aside (in due's count too, not in
--   overdue's); paused is the shard's copy of the pause state: {task, ...} ('' = all);
--   waiting counts the jobs waiting for a permit of their flow key (in no index: not
--   in due's count; _lib.lua: limit_wait).
-- Errors: none.
local due_key, leased_key = KEYS[1], KEYS[2]
local now = clock_now(KEYS[6], false)
local overdue = redis.call('ZCOUNT', due_key, '-inf', fmt(now))
local oldest = 0
if overdue > 0 then
  oldest = tonumber(redis.call('ZRANGE', due_key, 0, 0, 'WITHSCORES')[2])
end
local next_due = 0
local later = redis.call('ZRANGEBYSCORE', due_key, '(' .. fmt(now), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
if #later > 0 then next_due = tonumber(later[2]) end
local FAR_LOOK = 64
local far_first = redis.call('ZRANGE', KEYS[7], 0, 0, 'WITHSCORES')[2]
if far_first then
  far_first = tonumber(far_first)
  if far_first <= now then
    if oldest == 0 or far_first < oldest then oldest = far_first end
    local late = redis.call('ZRANGEBYSCORE', KEYS[7], '-inf', fmt(now), 'LIMIT', 0, FAR_LOOK)
    for _, chunk in ipairs(late) do
      local _, ids = far_entries(KEYS[8], chunk)
      overdue = overdue + #ids
    end
  elseif next_due == 0 or far_first < next_due then
    -- The earliest live due of the first far slot when it is read whole, else its start.
    local at = far_first
    local first = redis.call('ZRANGEBYSCORE', KEYS[7], fmt(far_first), fmt(far_first), 'LIMIT', 0, FAR_LOOK + 1)
    if #first <= FAR_LOOK then
      local ids = {}
      for _, chunk in ipairs(first) do
        local _, part = far_entries(KEYS[8], chunk)
        for _, id in ipairs(part) do ids[#ids + 1] = id end
      end
      local live = far_live(due_key, leased_key, KEYS[3], 11, far_first, ids, KEYS[9])
      if #live > 0 then
        at = live[1][2]
        for _, e in ipairs(live) do at = math.min(at, e[2]) end
      end
    end
    if next_due == 0 or at < next_due then next_due = at end
  end
end
local owner = redis.call('GET', KEYS[4]) or ''
return {
  now,
  redis.call('ZCARD', due_key) + redis.call('ZCARD', KEYS[9])
    + far_count(due_key, leased_key, KEYS[3], 11, KEYS[9], KEYS[11]),
  overdue,
  oldest,
  next_due,
  redis.call('ZCARD', leased_key),
  redis.call('ZCOUNT', leased_key, '-inf', fmt(now)),
  redis.call('ZCARD', KEYS[3]),
  owner,
  redis.call('PTTL', KEYS[4]),
  tonumber(redis.call('GET', KEYS[5]) or '0'),
  redis.call('ZCARD', KEYS[9]),
  redis.call('HKEYS', KEYS[10]),
  tonumber(redis.call('HGET', KEYS[11], '') or '0'),
}
