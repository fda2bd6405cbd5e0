-- inspect.lua: what an operator wants to know about one shard (read only).
-- KEYS[1] due  KEYS[2] leased  KEYS[3] dead  KEYS[4] owner  KEYS[5] epoch  KEYS[6] clock
-- ARGV: none.
-- Returns: {now, due, overdue, oldest_overdue, next_due, leased, expired, dead, owner,
--   owner_ttl, epoch}: now is max(TIME, clock) in ms (the clock is not advanced);
--   due, leased and dead are counts; overdue counts due jobs whose time is <= now, and
--   oldest_overdue is the earliest of their due times (0 when none); next_due is the
--   earliest due time after now (0 when none); expired counts leases past their
--   deadline (the reaper's work); owner is the owner token ('' when free) and
--   owner_ttl its PTTL in ms (-2 when free); epoch is the shard's fencing epoch.
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
local owner = redis.call('GET', KEYS[4]) or ''
return {
  now,
  redis.call('ZCARD', due_key),
  overdue,
  oldest,
  next_due,
  redis.call('ZCARD', leased_key),
  redis.call('ZCOUNT', leased_key, '-inf', fmt(now)),
  redis.call('ZCARD', KEYS[3]),
  owner,
  redis.call('PTTL', KEYS[4]),
  tonumber(redis.call('GET', KEYS[5]) or '0'),
}
