-- cancel.lua: remove a job, whatever its state.
-- KEYS[1] due  KEYS[2] leased  KEYS[3] dead  KEYS[4] the job's jobs bucket
-- KEYS[5] parked  KEYS[6] parkedx   (a parked job, of a paused task, is removed as due)
-- KEYS[7] prio  the priority index (_lib.lua: prio_add): the job's entry goes
-- KEYS[8] trail  the id's pending trailing run (flow.lua) goes too
-- KEYS[9] waiting  HASH task -> jobs waiting for their flow key: a waiting job leaves
--   the count; its entry in its key's waiters stays, and the wake it gets finds no job
--   (0) and frees the permit it was handed (docs/limits.md)
-- ARGV[1]  id
-- ARGV[2]  channel (optional): where a removed leased job's id is published, so that the
--   worker running it stops its handler
-- Returns: the state it was removed from: 1 due (in due or far: a far entry is left
--   behind, and skipped when its slot is promoted), 2 leased (its holder's ack will get
--   LeaseLost), 3 dead; 0 if there was no such job.
-- Errors: none.
local id = ARGV[1]
local s = redis.call('HGET', KEYS[4], id)
local p = redis.call('ZSCORE', KEYS[5], id)
if p then
  redis.call('ZREM', KEYS[5], id)
  if s then redis.call('ZREM', KEYS[6], park_member(cmsgpack.unpack(s), tonumber(p), id)) end
end
if s then wait_end_packed(KEYS[9], s) end
redis.call('ZREM', KEYS[7], id)
redis.call('HDEL', KEYS[8], id)
if redis.call('HDEL', KEYS[4], id) == 0 then return 0 end
if redis.call('ZREM', KEYS[1], id) == 1 then return 1 end
if redis.call('ZREM', KEYS[2], id) == 1 then
  if ARGV[2] then redis.call('PUBLISH', ARGV[2], id) end
  return 2
end
if redis.call('ZREM', KEYS[3], id) == 1 then return 3 end
return 1
