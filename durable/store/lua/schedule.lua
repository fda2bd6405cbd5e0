-- schedule.lua: create (or keep, or replace) jobs of one shard.
-- KEYS[1] due  KEYS[2] leased  KEYS[3] done  KEYS[4] dead  KEYS[5] clock
-- KEYS[6..] jobs buckets (all of the shard's, in order)
-- ARGV[1]  replace   1: overwrite a job that is due or dead; 0: keep any existing job
-- ARGV[2]  batch     msgpack array, 4 values per job: id, mode, time, record
--   mode     0: time is an absolute due (ms); 1: time is a delay (ms) added to now
--   record   the packed record (see _lib.lua), nominal 0, encoded by the client
-- Returns: {now, status_1, when_1, ..., status_n, when_n}
--   status 1 created, 2 kept (exists; when = its score), 3 replaced,
--          4 busy (leased: never replaced; when = lease deadline),
--          5 done (this occurrence completed already; nothing written)
-- Errors: none (the client validates every argument).
local FIRST = 5
local due_key, leased_key, done_key, dead_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local replace = ARGV[1] == '1'
local items = cmsgpack.unpack(ARGV[2])
local now = clock_now(KEYS[5], true)
local n = #items / 4
local ids, dues, members = {}, {}, {}
for k = 1, n do
  local base = 4 * k - 3
  local id = items[base]
  local due = items[base + 2]
  if items[base + 1] == 1 then due = now + due end
  ids[k], dues[k] = id, due
  members[k] = done_member(due, id)
end
-- Look everything up at once: records (existence) and done occurrences.
local recs, key_of = get_records(ids, n, FIRST)
local done = {}
for k = 1, n, CHUNK do
  local b = redis.call('ZMSCORE', done_key, unpack(members, k, math.min(k + CHUNK - 1, n)))
  for j = 1, #b do done[k + j - 1] = b[j] ~= false end
end
local out = {now}
local hset, zadd, unded = {}, {}, {}
local nz, nu = 0, 0
local written = {}  -- ids written earlier in this batch: the score they got
for k = 1, n do
  local id, due = ids[k], dues[k]
  local status, when = 1, due
  local prior = written[id]
  if recs[k] or prior then
    local lease = (not prior) and redis.call('ZSCORE', leased_key, id)
    if not replace then
      status = 2
      when = prior or tonumber(redis.call('ZSCORE', due_key, id) or lease
        or redis.call('ZSCORE', dead_key, id) or 0)
    elseif lease then
      status, when = 4, tonumber(lease)
    elseif done[k] then
      status = 5
    else
      status = 3
      if not prior then
        nu = nu + 1
        unded[nu] = id
      end
    end
  elseif done[k] then
    status = 5
  end
  if status == 1 or status == 3 then
    buffer(hset, key_of[k], id, items[4 * k])
    zadd[nz + 1], zadd[nz + 2] = fmt(due), id
    nz = nz + 2
    written[id] = due
  end
  out[2 * k], out[2 * k + 1] = status, when
end
if nu > 0 then bulk('ZREM', dead_key, unded) end
if nz > 0 then
  flush('HSET', hset)
  bulk('ZADD', due_key, zadd)
end
return out
