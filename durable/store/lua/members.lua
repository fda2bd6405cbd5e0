-- members.lua: a worker's heartbeat into the namespace's member set; count live workers.
-- KEYS[1] members   ZSET worker token -> last heartbeat (Redis ms)
-- ARGV[1]  token    the worker's token
-- ARGV[2]  ttl      ms a heartbeat counts as live
-- ARGV[3]  join     1: heartbeat (join or stay); 0: leave
-- Returns: the number of live workers after this call.
-- Errors: none.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now - ttl))
if ARGV[3] == '1' then
  redis.call('ZADD', KEYS[1], string.format('%d', now), ARGV[1])
else
  redis.call('ZREM', KEYS[1], ARGV[1])
end
return redis.call('ZCARD', KEYS[1])
