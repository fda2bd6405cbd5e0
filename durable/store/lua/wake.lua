-- wake.lua: a job whose permit was just handed to it (limits.lua release) is due now.
-- KEYS[1] due  KEYS[2] leased  KEYS[3] clock
-- KEYS[4] waiting  HASH task -> its jobs of this shard waiting ({ns:s}:kwaitn, _lib.lua)
-- KEYS[5] wakes  ZSET id -> until when a wake that found it still leased holds
-- KEYS[6] prio   the priority index (_lib.lua: prio_lanes): a job's entry follows it
-- KEYS[7] the job's jobs bucket (its record says whether it waits: field 18)
-- ARGV[1]  id
-- ARGV[2]  ms a wake of a leased job is kept for its wait to see (retry.lua mode 3)
-- Returns: 1 due now; 2 still leased (its wait, about to be written, finds the wake and
--   makes it due at once); 0 not waiting: gone, out of its wait (claimed at its recheck
--   time, rescheduled, replaced or cancelled by a user: a reschedule keeps its time),
--   or running. Re-sent: 1 then 0.
-- Errors: none.
return limit_wake(KEYS[1], KEYS[2], KEYS[4], KEYS[5], KEYS[6], KEYS[7], ARGV[1],
  clock_now(KEYS[3], true), tonumber(ARGV[2]))
