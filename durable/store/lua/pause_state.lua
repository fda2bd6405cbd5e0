-- pause_state.lua: the namespace's pause state of record, read or changed.
-- KEYS[1] {ns}:paused   HASH task ('' = the whole namespace) -> time paused (ms)
-- ARGV[1]  op      1 pause (a task already paused keeps its time), 0 resume, 2 read
-- ARGV[2]  task    a task name, or '' (ops 0 and 1)
-- ARGV[3]  since   ms (op 1)
-- Returns: the state after the call, HGETALL's {task, since, ...}.
-- Errors: none.
if ARGV[1] == '1' then
  redis.call('HSETNX', KEYS[1], ARGV[2], ARGV[3])
elseif ARGV[1] == '0' then
  redis.call('HDEL', KEYS[1], ARGV[2])
end
return redis.call('HGETALL', KEYS[1])
