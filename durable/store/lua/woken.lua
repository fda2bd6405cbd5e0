-- woken.lua: wake waiters of one shard that a release handed permits to, and lease the
-- ones now due to the caller at once (docs/limits.md): wake.lua and a claim of just
-- those jobs in one call, for the releasing worker when it owns the shard.
-- KEYS[1] due  KEYS[2] leased  KEYS[3] epoch  KEYS[4] clock
-- KEYS[5] prio   the priority index (_lib.lua: prio_add): a leased job has no entry
-- KEYS[6] wakes  ZSET id -> until when a wake that found it still leased holds
-- KEYS[7] done  KEYS[8] paused   (as claim.lua's)
-- KEYS[9] reply   where this call's reply is kept ({ns:s}:claim:<token>, as claim.lua)
-- KEYS[10] forget the reply key of the caller's previous call, now received: deleted
-- KEYS[11] waiting HASH task -> its jobs of this shard waiting ({ns:s}:kwaitn, _lib.lua)
-- KEYS[12..]      the jobs buckets the jobs below name by index
-- ARGV[1]  epoch     the caller's fencing epoch for this shard
-- ARGV[2]  lease     ms: each lease ends at now + lease
-- ARGV[3]  prestart  '1': pre-start leases (deadline + 0.5, as claim.lua's ARGV[5])
-- ARGV[4]  hold      ms a wake of a leased job is kept for its wait (as wake.lua)
-- ARGV[5..] 3 per job: id, the index of its bucket key, its bucket's number among the
--          shard's buckets (for the reply's tag)
-- A job waiting for a permit (record field 18 = 2, in no index) ends its wait as
-- wake.lua ends it (_lib.lua: wait_end, the flag and the counts) and, when a claim
-- would take it now, is leased here with no index entry written; else it is made due
-- now as wake.lua makes it. Any other job (a rate waiter, one still leased, or one
-- that waits no more: a tombstone of its key's waiters) is woken by wake.lua's own
-- code (limit_wake): a tombstone's 0 frees its permit for the next waiter.
-- Returns: {codes, reply}: per job a code, 1 leased here (in reply), 2 still leased (its
--   wait, in flight, finds the wake and makes it due now: a claim takes it), 3 due now
--   but not leased here (recurring, paused, its occurrence done, or a rate waiter: a
--   claim's to decide), 0 not waiting (as wake.lua's 0); reply is a msgpack array as
--   claim.lua's ({now, 0, 0, rows}) of the jobs leased, each row id, due, deadline,
--   tag, count and the record's first count fields (the trailing defaults left out,
--   as stored).
-- Re-sent safely: a call whose reply is kept under KEYS[9] returns it again (nothing
--   written), as claim.lua does.
-- Errors: TW_FENCED if ARGV[1] is not the shard's current epoch (nothing written).
local err = fence(KEYS[3], ARGV[1])
if err then return err end
if KEYS[10] ~= KEYS[9] then redis.call('DEL', KEYS[10]) end
local kept = redis.call('GET', KEYS[9])
if kept then
  local c, p = cmsgpack.unpack(kept)
  return {c, p}
end
local due_key, leased_key, prio_key, counts_key = KEYS[1], KEYS[2], KEYS[5], KEYS[11]
local epoch, lease = tonumber(ARGV[1]), tonumber(ARGV[2])
local half = ARGV[3] == '1' and '.5' or ''
local hold = tonumber(ARGV[4])
local now = clock_now(KEYS[4], true)
local deadline = now + lease
local sdeadline = fmt(deadline) .. half
local paused, pause_all = nil, false
if redis.call('EXISTS', KEYS[8]) == 1 then
  paused = {}
  for _, t in ipairs(redis.call('HKEYS', KEYS[8])) do paused[t] = true end
  pause_all = paused[''] == true
end
local codes, rows, total = {}, {'', cmsgpack.pack(now, 0, 0)}, 3
batch_start()  -- the counts written once at the end (_lib.lua: BATCH)
-- The leases' writes are buffered (one HSET a bucket, one ZADD) and flushed at the end,
-- or before a job met again in this call (a waiter queued twice), so that it reads
-- what the first one wrote.
local hset, zadd, nz, met = {}, {}, 0, {}
local function write()
  flush('HSET', hset)
  if nz > 0 then bulk('ZADD', leased_key, zadd) end
  hset, zadd, nz = {}, {}, 0
end
for i = 5, #ARGV, 3 do
  local id, jobs_key = ARGV[i], KEYS[tonumber(ARGV[i + 1])]
  if met[id] then write() end
  met[id] = true
  local s = redis.call('HGET', jobs_key, id)
  local r = s and rec_decode(s)
  local code
  if r and r[F_WAIT] == WAIT_PERMIT then
    wait_end(counts_key, r)  -- its wait ends here, as wake.lua ends it
    if r[F_RKIND] == 0 and r[F_NOMINAL] ~= 0
      and not (paused and (pause_all or paused[r[F_TASK]]))
      and not redis.call('ZSCORE', KEYS[7], done_member(r[F_NOMINAL], id)) then
      code = 1  -- leased here: what a claim of it at now writes
      r[F_EPOCH] = epoch
      local rec, count = rec_encode_n(r)
      buffer(hset, jobs_key, id, rec)
      zadd[nz + 1], zadd[nz + 2] = sdeadline, id
      nz = nz + 2
      -- Its row: id, due, deadline, tag, field count, then the fields: the record as
      -- stored (msgpack values one after another), spliced in, not packed again.
      rows[#rows + 1] = cmsgpack.pack(id, now, deadline, 2 * tonumber(ARGV[i + 2]), count)
      rows[#rows + 1] = rec
      total = total + 5 + count
    else
      code = 3  -- due now, as wake.lua makes it
      redis.call('HSET', jobs_key, id, rec_encode(r))
      redis.call('ZADD', due_key, fmt(now), id)
      prio_add(prio_key, id, now, r[F_PRIORITY])
    end
  elseif r then
    code = limit_wake(due_key, leased_key, counts_key, KEYS[6], prio_key, jobs_key, id, now,
      hold)
    if code == 1 then code = 3 end
  else
    code = 0
  end
  codes[#codes + 1] = code
end
write()
counts_flush(counts_key)
-- The reply: one msgpack array (a 32-bit count) of now, 0, 0 and the rows.
rows[1] = string.char(0xdd, math.floor(total / 16777216) % 256, math.floor(total / 65536) % 256,
  math.floor(total / 256) % 256, total % 256)
local packed = table.concat(rows)
local result = {codes, packed}
if total > 3 then redis.call('SET', KEYS[9], cmsgpack.pack(codes, packed), 'PX', lease) end
return result
