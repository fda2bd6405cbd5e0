-- wake.lua: a job whose permit was just handed to it (limits.lua release) is due now.
-- KEYS[1] due  KEYS[2] leased  KEYS[3] clock
-- KEYS[4] waits  ZSET id -> the due its permit wait gave it (retry.lua mode 3)
-- KEYS[5] wakes  ZSET id -> until when a wake that found it still leased holds
-- KEYS[6] prio   the priority index (_lib.lua: prio_lanes): a job's entry follows it
-- ARGV[1]  id
-- ARGV[2]  ms a wake of a leased job is kept for its wait to see (retry.lua mode 3)
-- Returns: 1 due now; 2 still leased (its wait, about to be written, finds the wake and
--   makes it due at once); 0 not waiting: gone, moved by a user (its due is not the
--   one its wait gave it: a reschedule keeps its time), or running. Re-sent: 1 then 0.
-- Errors: none.
return limit_wake(KEYS[1], KEYS[2], KEYS[4], KEYS[5], KEYS[6], ARGV[1],
  clock_now(KEYS[3], true), tonumber(ARGV[2]))
