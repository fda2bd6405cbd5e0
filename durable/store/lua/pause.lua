-- pause.lua: pause or resume a task (or the whole namespace) on one shard.
-- KEYS[1] paused   the shard's copy of the pause state (claim.lua reads it)
-- KEYS[2] parked  KEYS[3] parkedx  KEYS[4] due
-- KEYS[5] prio  the priority index (_lib.lua: prio_add): a job moved back with a
--   priority is indexed again (its record read from its bucket)
-- KEYS[6..] jobs buckets (all of the shard's, in order)
-- ARGV[1]  op      1 pause, 0 resume
-- ARGV[2]  task    a task name, or '' for the whole namespace
-- ARGV[3]  since   ms: when it was paused (pause)
-- ARGV[4]  limit   at most this many parked jobs moved (resume)
-- Returns: pause: 0. resume: the number of parked jobs moved back into due, at their
--   due times (so claims take them in due order, before anything due later); fewer
--   than limit means none is left to move. Resuming a task moves nothing while the
--   whole namespace stays paused; resuming the namespace leaves the jobs of the tasks
--   paused on their own parked. Re-sent safely (the same state, the rest moved).
-- Errors: none (the client validates every argument).
local FIRST = 5
local paused_key, parked_key, parkedx_key, due_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local task = ARGV[2]
if ARGV[1] == '1' then
  redis.call('HSET', paused_key, task, ARGV[3])
  return 0
end
redis.call('HDEL', paused_key, task)
if task ~= '' and redis.call('HEXISTS', paused_key, '') == 1 then return 0 end
local limit = tonumber(ARGV[4])
local still = {}
for _, t in ipairs(redis.call('HKEYS', paused_key)) do still[t] = true end
local lo, hi = '-', '+'
if task ~= '' then lo, hi = '[' .. task .. '\0', '(' .. task .. '\1' end
local moved = 0
local zadd, zrem, xrem = {}, {}, {}
while moved < limit do
  local want = limit - moved
  local page = redis.call('ZRANGEBYLEX', parkedx_key, lo, hi, 'LIMIT', 0, want)
  if #page == 0 then break end
  local skipped = nil
  for _, m in ipairs(page) do
    local p = string.find(m, '\0', 1, true)
    local t = string.sub(m, 1, p - 1)
    if still[t] then
      skipped = t
      break
    end
    local due, id = string.sub(m, p + 1, p + 16), string.sub(m, p + 18)
    moved = moved + 1
    zadd[2 * moved - 1], zadd[2 * moved] = string.format('%d', tonumber(due)), id
    zrem[moved], xrem[moved] = id, m
    lo = '(' .. m
  end
  if skipped then
    lo = '[' .. skipped .. '\1'  -- paused on its own: past all of its members
  elseif #page < want then
    break
  end
end
if moved > 0 then
  bulk('ZADD', due_key, zadd)
  for j = 1, moved do
    local id = zadd[2 * j]
    local s = redis.call('HGET', bucket_key(id, FIRST), id)
    if s and #s > F_PRIORITY then  -- shorter: fewer fields than the priority's
      prio_add(KEYS[5], id, tonumber(zadd[2 * j - 1]), rec_decode(s)[F_PRIORITY])
    end
  end
  bulk('ZREM', parked_key, zrem)
  bulk('ZREM', parkedx_key, xrem)
end
return moved
