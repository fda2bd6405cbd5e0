-- release.lua: hand leased jobs back to due, unrun (same attempt): a graceful
-- shutdown, or a recurring job moved by its missed-run policy.
-- KEYS[1] leased  KEYS[2] due  KEYS[3] epoch  KEYS[4] clock
-- KEYS[5] prio  the priority index (_lib.lua: prio_add)
-- KEYS[6..] jobs buckets (all of the shard's, in order)
-- ARGV[1]  epoch      the caller's fencing epoch for this shard
-- ARGV[2]  count      number of jobs that follow
-- then per job: id, attempt, nominal, due, renominate   (the lease: epoch, attempt, nominal)
--   due          ms: the due score to go back to
--   renominate   1: due is also the new nominal due (a new occurrence); 0: keep it;
--                2: the lease moves to occurrence `due` in place: the job stays leased
--                   (same deadline, epoch and attempt) with `due` as its nominal, to
--                   run now as that occurrence (a missed-run policy's catch-up)
-- Returns: {status_1 .. status_n}: 1 released (or moved, for 2), 0 lease lost.
-- Errors: TW_FENCED if ARGV[1] is not the shard's current epoch (nothing written).
local FIRST = 5
local leased_key, due_key = KEYS[1], KEYS[2]
local err = fence(KEYS[3], ARGV[1])
if err then return err end
local epoch = tonumber(ARGV[1])
clock_now(KEYS[4], true)
local out = {}
for k = 1, tonumber(ARGV[2]) do
  local base = 5 * k - 2
  local id = ARGV[base]
  local status = 0
  local jobs_key = bucket_key(id, FIRST)
  local s = redis.call('HGET', jobs_key, id)
  if s and redis.call('ZSCORE', leased_key, id) then
    local r = rec_decode(s)
    if holds(r, epoch, ARGV[base + 1], ARGV[base + 2]) then
      local due = tonumber(ARGV[base + 3])
      if ARGV[base + 4] == '2' then
        r[F_NOMINAL] = due
        redis.call('HSET', jobs_key, id, rec_encode(r))
      else
        if ARGV[base + 4] == '1' or r[F_NOMINAL] == due then r[F_NOMINAL] = 0 end
        r[F_EPOCH] = 0
        redis.call('ZREM', leased_key, id)
        redis.call('HSET', jobs_key, id, rec_encode(r))
        redis.call('ZADD', due_key, fmt(due), id)
        prio_add(KEYS[5], id, due, r[F_PRIORITY])
      end
      status = 1
    end
  end
  out[k] = status
end
return out
