-- get.lua: one job's state and record (read only).
-- KEYS[1] due  KEYS[2] leased  KEYS[3] dead  KEYS[4] the job's jobs bucket  KEYS[5] parked
-- ARGV[1]  id
-- Returns: nil if no such job, else {state, score, field_1 .. field_18}
--   state 4 waiting for a permit or a start of its flow key (record field 18, _lib.lua:
--   limit_wait; score: its booked start, in due, or for a permit, in no index, its
--   nominal due),
--   1 due (score = due time; a parked job, of a paused task, is due too; a job in
--   none of due, leased, dead and parked is in the far index, due at its nominal), 2 leased (lease deadline), 3 dead (time of death);
--   the nominal field is resolved (never 0).
-- Errors: none.
local id = ARGV[1]
local s = redis.call('HGET', KEYS[4], id)
if not s then return nil end
local state, score = 1, redis.call('ZSCORE', KEYS[1], id)
if not score then state, score = 2, redis.call('ZSCORE', KEYS[2], id) end
if not score then state, score = 3, redis.call('ZSCORE', KEYS[3], id) end
if not score then state, score = 1, redis.call('ZSCORE', KEYS[5], id) end
local r = rec_decode(s)
if not score then state, score = 1, r[F_NOMINAL] end
score = tonumber(score)
if state == 1 and r[F_WAIT] ~= 0 then state = 4 end
local out = {state, score}
rec_row(out, 2, r, score)
return out
