-- schedule.lua: create (or keep, or replace) jobs of one shard.
-- KEYS[1] due  KEYS[2] leased  KEYS[3] done  KEYS[4] dead  KEYS[5] clock  KEYS[6] far
-- KEYS[7] faro  KEYS[8] parked  KEYS[9] parkedx   (a replaced parked job leaves them)
-- KEYS[10] prio  the priority index (_lib.lua: prio_add)
-- KEYS[11] waiting  HASH task -> jobs waiting for their flow key: a replaced waiting
--   job leaves the count (_lib.lua: wait_end_packed)
-- KEYS[12..] jobs buckets (all of the shard's, in order)
-- ARGV[1]  replace   1: overwrite a job that is due or dead; 0: keep any existing job
-- ARGV[2]  batch     msgpack array, 4 values per job: id, mode, time, record
--   mode     0: time is an absolute due (ms); 1: time is a delay (ms) added to now
--   record   the packed record (see _lib.lua), nominal 0, encoded by the client
-- ARGV[3]  priorities  msgpack array {position, priority, ...} of the jobs of the batch
--          with a priority above 0 (their records carry it too); '' or absent: none
-- Returns: {now, status_1, when_1, ..., status_n, when_n}
--   status 1 created, 2 kept (exists; when = its due, lease deadline or time of death),
--          3 replaced, 4 busy (leased: never replaced; when = lease deadline),
--          5 done (this occurrence completed already; nothing written); with
--          replace on, an entry of a higher version (field 19) than a record that
--          has one is kept (2)
-- A job due from the slot after next on goes to the far index (_lib.lua), else to due
-- (a record with a nominal of its own other than its due always to due: own_nominal).
-- Errors: none (the client validates every argument).
local FIRST = 11
local due_key, leased_key, done_key, dead_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local far_key, faro_key = KEYS[6], KEYS[7]
local replace = ARGV[1] == '1'
local items = cmsgpack.unpack(ARGV[2])
local now = clock_now(KEYS[5], true)
local n = #items / 4
local ids, dues, sdues, members = {}, {}, {}, {}
-- Each due formatted once, and once for a run of equal ones (a batch with one delay):
-- done_member's text and the ZADD score below.
local format, last_due, sdue = string.format, nil, nil
for k = 1, n do
  local base = 4 * k - 3
  local id = items[base]
  local due = items[base + 2]
  if items[base + 1] == 1 then due = now + due end
  if due ~= last_due then last_due, sdue = due, format('%d', due) end
  ids[k], dues[k], sdues[k] = id, due, sdue
  members[k] = sdue .. ':' .. id  -- done_member(due, id)
end
-- Look everything up at once: records (existence) and done occurrences.
local recs, key_of = get_records(ids, n, FIRST)
local done = {}
for k = 1, n, CHUNK do
  local b = redis.call('ZMSCORE', done_key, unpack(members, k, math.min(k + CHUNK - 1, n)))
  for j = 1, #b do done[k + j - 1] = b[j] ~= false end
end
local out = {now}
local hset = {}
local in_due = {}  -- existing jobs replaced while in due
local replaced = {}  -- existing jobs replaced: their priority entry goes
local written = {}  -- ids written earlier in this batch: the due they got
local last = {}  -- position of the last write of each written id
for k = 1, n do
  local id, due = ids[k], dues[k]
  local status, when = 1, due
  local prior = written[id]
  if recs[k] or prior then
    local lease = (not prior) and redis.call('ZSCORE', leased_key, id)
    if not replace then
      status = 2
      when = prior or lease or redis.call('ZSCORE', due_key, id)
        or redis.call('ZSCORE', dead_key, id) or redis.call('ZSCORE', KEYS[8], id)
        or far_due(recs[k])
      when = tonumber(when)
    elseif lease then
      status, when = 4, tonumber(lease)
    elseif done[k] then
      status = 5
    elseif not prior and rec_newer(recs[k], items[4 * k]) then
      -- Written from a newer row version (Postgres mode): kept, as with replace off.
      status = 2
      when = tonumber(redis.call('ZSCORE', due_key, id) or redis.call('ZSCORE', dead_key, id)
        or redis.call('ZSCORE', KEYS[8], id)) or far_due(recs[k])
    else
      status = 3
      replaced[id] = true
      if not prior then
        wait_end_packed(KEYS[11], recs[k])
        -- In due (the ZADD or the ZREM below covers it), dead, or else far.
        if redis.call('ZSCORE', due_key, id) then
          in_due[id] = true
        else
          redis.call('ZREM', dead_key, id)  -- if far, its entry there is left behind
          unpark_drop(KEYS[8], KEYS[9], id, recs[k])
        end
      end
    end
  elseif done[k] then
    status = 5
  end
  if status == 1 or status == 3 then
    written[id] = due
    last[id] = k
  end
  out[2 * k], out[2 * k + 1] = status, when
end
-- The last write of each id wins: its record, and due or far by its time.
local zadd, zrem, nz, nr = {}, {}, 0, 0
local slots, by_slot = {}, {}
local tails = rec_tails()
for k = 1, n do
  local id = ids[k]
  if last[id] == k then
    local due = dues[k]
    if goes_far(now, due) and not own_nominal(items[4 * k], due) then
      buffer(hset, key_of[k], id, rec_with_nominal(items[4 * k], due, tails))
      far_group(slots, by_slot, due, id)
      if in_due[id] then
        nr = nr + 1
        zrem[nr] = id
      end
    else
      buffer(hset, key_of[k], id, items[4 * k])
      zadd[nz + 1], zadd[nz + 2] = sdues[k], id
      nz = nz + 2
    end
  end
end
flush('HSET', hset)
if nz > 0 then bulk('ZADD', due_key, zadd) end
-- A replaced job that was in due and now goes far leaves due.
if nr > 0 then bulk('ZREM', due_key, zrem) end
far_push(far_key, faro_key, slots, by_slot)
-- The priority index: entries for the jobs written with a priority, none left for a
-- job replaced without one. Nothing at all for a batch of new jobs without priorities.
local prio = {}
if ARGV[3] and ARGV[3] ~= '' then
  local pp = cmsgpack.unpack(ARGV[3])
  for j = 1, #pp, 2 do prio[pp[j]] = pp[j + 1] end
end
if next(prio) or next(replaced) then
  for k = 1, n do
    local id = ids[k]
    if last[id] == k then
      if replaced[id] and not prio[k] then redis.call('ZREM', KEYS[10], id) end
      prio_add(KEYS[10], id, dues[k], prio[k])
    end
  end
end
return out
