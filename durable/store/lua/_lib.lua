-- _lib.lua: helpers prepended to every script by _scripts.py (Redis Lua has no include).
--
-- The job record (one field of a {ns:s}:jobs:<bucket> hash per job) is a stream of msgpack values
-- (cmsgpack.pack(a, b, ...)), positional, with the trailing fields that are at their
-- defaults dropped, so a pending one-shot job stores only task, payload and max attempts.
-- Field order (1-based), defaults in DEFAULTS:
--   1 task      task name
--   2 payload   bytes (JSON text when flags has bit 0)
--   3 max       max attempts (default 5)
--   4 flags     bit 0: payload is JSON
--   5 nominal   nominal due (ms): the occurrence's identity; 0 = "the due score"
--               (only while the job is due; claim and retry make it explicit)
--   6 attempt   attempt number, from 1
--   7 epoch     owner epoch of the current lease; 0 when not leased
--   8 rkind     recurrence: 0 none, 1 interval, 2 cron
--   9 rspec     interval in ms (decimal) or cron expression
--  10 policy    missed-run policy: 0 once, 1 all, 2 skip
--  11 cap       max missed runs fired under 'all'
--  12 grace     misfire grace (ms)
--  13 error     last error text (dead letters, retries)
--  14 timeout   the job's own timeout (ms; 0 = none: its task's or the worker's)
--  15 trace     the producer's W3C trace context (text; '' none), kept as it is
--  16 key       the flow key (schedule(key=); '' none: the task's single key), which
--               the task's concurrency and rate limits count by (limits.lua)
--  17 priority  0 (the default, lowest) .. MAX_PRIORITY: among due jobs, higher first
--  18 wait      its flow-limit wait (limit_wait): 0 none; 1 it waits in due for a
--               start of its key (rate: due at its booked start); 2 it waits for a
--               permit, in no index of its shard (woken into due by limit_wake).
--               Counted in {ns:s}:kwaitn (wait_end)
--  19 version   the Postgres mode's version of the job row it was written from (0:
--               none); kept by every script, compared by the claim check and by a
--               replace (schedule.lua keeps an entry of a higher version)
-- Nothing here reads the client's clock: "now" is TIME, never below {ns:s}:clock.

local F_TASK, F_PAYLOAD, F_MAX, F_FLAGS, F_NOMINAL, F_ATTEMPT, F_EPOCH = 1, 2, 3, 4, 5, 6, 7
local F_RKIND, F_RSPEC, F_POLICY, F_CAP, F_GRACE, F_ERROR, F_TIMEOUT = 8, 9, 10, 11, 12, 13, 14
local F_TRACE, F_KEY, F_PRIORITY, F_WAIT, F_VERSION = 15, 16, 17, 18, 19
local NFIELDS = 19
-- F_WAIT's values (below: limit_wait).
local WAIT_DUE, WAIT_PERMIT = 1, 2
-- Mirrored in _codec.py (DEFAULTS); 5 = DEFAULT_MAX_ATTEMPTS in model/_jobs.py.
local DEFAULTS = {'', '', 5, 0, 0, 1, 0, 0, '', 0, 0, 0, '', 0, '', '', 0, 0, 0}
-- unpack() of a long list overflows Lua's C stack (LUAI_MAXCSTACK 8000): chunk bulk calls.
local CHUNK = 1000
-- A refusal from inside a helper is raised as a plain string, error('TW_<CODE> ...', 0):
-- Redis 6.2's error handler cannot take error({err = ...}) (it concatenates the table
-- and replies with its own Lua error instead). _errors.py reads both servers' wrappers.

local function rec_decode(s)
  local r = {cmsgpack.unpack(s)}
  for i = #r + 1, NFIELDS do r[i] = DEFAULTS[i] end
  return r
end

-- A packed record's version (field 19; 0 when it has none).
local function rec_version(s)
  return select(F_VERSION, cmsgpack.unpack(s)) or 0
end

-- True when packed record have carries a higher version than given, which has one.
local function rec_newer(have, given)
  local v = rec_version(given)
  return v > 0 and rec_version(have) > v
end

local function rec_encode(r)
  local n = NFIELDS
  while n > 0 and r[n] == DEFAULTS[n] do n = n - 1 end
  return cmsgpack.pack(unpack(r, 1, n))
end

-- rec_encode, and the count of fields it wrote.
local function rec_encode_n(r)
  local n = NFIELDS
  while n > 0 and r[n] == DEFAULTS[n] do n = n - 1 end
  return cmsgpack.pack(unpack(r, 1, n)), n
end

-- Packed values appended to a record of n fields, by rec_with_nominal and by the claim
-- (which leases a one-shot record so, instead of decoding and encoding it: callgrind,
-- 10.8k of a claimed job's 87k Redis instructions were the encode): [n] (n <= 3) the
-- defaults it lacks before the nominal; with an epoch, [4] the attempt (its default)
-- and the epoch, which follow the nominal, and [5] the epoch alone. Made once a call.
local function rec_tails(epoch)
  local t = {cmsgpack.pack(DEFAULTS[F_PAYLOAD], DEFAULTS[F_MAX], DEFAULTS[F_FLAGS]),
    cmsgpack.pack(DEFAULTS[F_MAX], DEFAULTS[F_FLAGS]), cmsgpack.pack(DEFAULTS[F_FLAGS])}
  if epoch then t[4], t[5] = cmsgpack.pack(DEFAULTS[F_ATTEMPT], epoch), cmsgpack.pack(epoch) end
  return t
end

-- "Now" in ms: Redis TIME, never lower than the shard's high-water mark, which a
-- mutating script advances (so a failover to a server with a slower clock, or a test
-- pushing the mark forward, never makes time run backwards). (SET ... GET, one call for
-- the read and the write, measured 2.2k Redis instructions a call more than this.)
local function clock_now(clock_key, advance)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local hw = tonumber(redis.call('GET', clock_key))
  if hw and hw >= now then return hw end
  if advance then redis.call('SET', clock_key, string.format('%d', now)) end
  return now
end

-- nil when the caller's epoch is the shard's current one, else the TW_FENCED error reply.
local function fence(epoch_key, given)
  local cur = tonumber(redis.call('GET', epoch_key) or '0')
  local g = tonumber(given)
  if g == nil or g < 1 or cur ~= g then
    return redis.error_reply('TW_FENCED shard epoch is ' .. cur .. ', caller has ' .. tostring(given))
  end
  return nil
end

-- Record buckets: the script's record hashes are KEYS[first + 1 .. #KEYS]. With one key
-- it is the id's own bucket (the client picked it); with all of them, the bucket is the
-- first 32 bits of SHA-1(id) mod their count, as Keys.bucket_of computes it in Python.
-- bucket_index gives it from 0 among nb = #KEYS - first buckets (0 with one key).
local function bucket_index(id, nb)
  if nb == 1 then return 0 end
  return tonumber(string.sub(redis.sha1hex(id), 1, 8), 16) % nb
end

local function bucket_key(id, first)
  return KEYS[first + 1 + bucket_index(id, #KEYS - first)]
end

-- Append v to groups[key], a list made on first use (and key then to order).
local function group_add(order, groups, key, v)
  local g = groups[key]
  if not g then
    g = {}
    groups[key] = g
    order[#order + 1] = key
  end
  g[#g + 1] = v
end

-- Group positions 1..n of ids by their bucket key: returns keys (in first-seen order),
-- per key the positions, the key of each position and its bucket index. The index of
-- position k is given[k] when the caller passes given (ack: the client sends what the
-- claim returned), else each id is hashed once.
local function by_bucket(ids, n, first, given)
  local order, groups, key_of, index_of = {}, {}, {}, {}
  local nb = #KEYS - first
  -- bucket_index and group_add inlined, with the library functions in locals: this
  -- runs once per job of a claim (callgrind: 1.9k Redis instructions a job fewer).
  local sha1hex, sub, num = redis.sha1hex, string.sub, tonumber
  for k = 1, n do
    local b
    if given then
      b = given[k]
      if type(b) ~= 'number' or b < 0 or b >= nb then
        error('TW_BADARG bucket ' .. tostring(b) .. ' of ' .. ids[k], 0)
      end
    elseif nb == 1 then
      b = 0
    else
      b = num(sub(sha1hex(ids[k]), 1, 8), 16) % nb
    end
    local key = KEYS[first + 1 + b]
    index_of[k] = b
    key_of[k] = key
    local g = groups[key]
    if g then
      g[#g + 1] = k
    else
      groups[key] = {k}
      order[#order + 1] = key
    end
  end
  return order, groups, key_of, index_of
end

-- HMGET of ids 1..n over their buckets (given: as in by_bucket): the records by
-- position (false if missing), and the bucket key and index of each position.
local function get_records(ids, n, first, given)
  local recs = {}
  local order, groups, key_of, index_of = by_bucket(ids, n, first, given)
  for _, key in ipairs(order) do
    local pos = groups[key]
    local names = {}
    for j = 1, #pos do names[j] = ids[pos[j]] end
    for c = 1, #names, CHUNK do
      local part = redis.call('HMGET', key, unpack(names, c, math.min(c + CHUNK - 1, #names)))
      for j = 1, #part do recs[pos[c + j - 1]] = part[j] end
    end
  end
  return recs, key_of, index_of
end

-- Buffered writes to record buckets: w[key] = {field, value, ...} (HSET) or {field, ...}
-- (HDEL), flushed with one call per bucket and CHUNK.
local function buffer(w, key, a, b)
  local t = w[key]
  if not t then
    t = {}
    w[key] = t
  end
  t[#t + 1] = a
  if b ~= nil then t[#t + 1] = b end
end

-- cmd key a1 a2 ... over a long list, CHUNK items per call.
local function bulk(cmd, key, items)
  for i = 1, #items, CHUNK do
    redis.call(cmd, key, unpack(items, i, math.min(i + CHUNK - 1, #items)))
  end
end

-- True when record r is leased under (epoch, attempt, nominal): the caller's lease.
-- The nominal due guards against a job cancelled and re-created under the same id.
local function holds(r, epoch, attempt, nominal)
  return r[F_EPOCH] == tonumber(epoch) and r[F_ATTEMPT] == tonumber(attempt)
    and r[F_NOMINAL] == tonumber(nominal)
end

local function flush(cmd, w)
  for key, items in pairs(w) do bulk(cmd, key, items) end
end

local function done_member(nominal, id)
  return string.format('%d', nominal) .. ':' .. id
end

local function fmt(n)
  return string.format('%d', n)
end

-- Append the reply row of a record to out (whose length is n): fields 1..15 with the
-- nominal resolved against the due score. Returns the new length. (Hot loops keep their
-- own length: Lua 5.1's #t is a binary search, measured at 1.7 us per 17 appends.)
local function rec_row(out, n, r, score)
  for i = 1, NFIELDS do
    local v = r[i]
    if i == F_NOMINAL and v == 0 then v = score end
    out[n + i] = v
  end
  return n + NFIELDS
end

-- Append to out (length n) the rows of hits, {id, score, ...} as ZRANGE WITHSCORES
-- gives them, with their records from the buckets KEYS[first + 1 ..]: id, score, then
-- rec_row's fields. Members without a record are skipped. Returns the new length and
-- the rows appended.
local function page_rows(out, n, hits, first)
  local rows = 0
  for k = 1, #hits, 2 do
    local s = redis.call('HGET', bucket_key(hits[k], first), hits[k])
    if s then
      local score = tonumber(hits[k + 1])
      out[n + 1], out[n + 2] = hits[k], score
      n = rec_row(out, n + 2, rec_decode(s), score)
      rows = rows + 1
    end
  end
  return n, rows
end

-- The far index. A job due at least a slot after the next one (FAR_SLOT ms, time split
-- into fixed slots) does not get an entry in {ns:s}:due (~104 bytes of skiplist and
-- hashtable per job) but one in a chunk of its slot's ids (msgpack strs, FAR_CHUNK
-- bytes or so a chunk). Its due is its record's nominal, made explicit (the schedule
-- paths that enter it keep due == nominal).
-- - {ns:s}:far, a ZSET scored by slot start, has a member per full chunk,
--   "<slot start>:1<ids>", and a marker "<slot start>:0" for a slot whose open chunk,
--   the one appended to, is the field "<slot start>" of the HASH {ns:s}:faro. Appending
--   one id is then an HGET and an HSET, with no sorted-set member rewritten.
-- - Entries are never removed one by one: a cancel, replace or reschedule of a far job
--   leaves its entry behind, and the promotion below skips it. An entry is live when
--   the record exists, is in none of due, leased and dead, and its nominal falls in
--   the entry's slot; a second live entry of the same id (the job left and came back
--   within one slot) finds it in due already and is skipped. The far jobs are thus the
--   records in none of due, leased and dead: far_count counts them.
-- - Every claim promotes the chunks whose slot starts by the slot after its horizon's
--   into due first (claim.lua), so a job is in due by the time a claim could take it.
local FAR_SLOT = 60000
local FAR_CHUNK = 512

local function far_slot(t)
  return t - t % FAR_SLOT
end

-- True when a job due at `due` goes to the far index at `now`.
local function goes_far(now, due)
  return due >= far_slot(now) + 2 * FAR_SLOT
end

-- Append ids to the far index: slots lists slot starts in first-seen order, by_slot[s]
-- the ids of slot s.
local function far_push(far_key, faro_key, slots, by_slot)
  for _, slot in ipairs(slots) do
    local score = fmt(slot)
    local open = redis.call('HGET', faro_key, score)
    local parts, size = {open or ''}, open and #open or 0
    for _, id in ipairs(by_slot[slot]) do
      local p = cmsgpack.pack(id)
      parts[#parts + 1] = p
      size = size + #p
      if size >= FAR_CHUNK then
        redis.call('ZADD', far_key, score, score .. ':1' .. table.concat(parts))
        parts, size = {}, 0
      end
    end
    if size > 0 then
      if not open then redis.call('ZADD', far_key, score, score .. ':0') end
      redis.call('HSET', faro_key, score, table.concat(parts))
    elseif open then
      redis.call('HDEL', faro_key, score)
      redis.call('ZREM', far_key, score .. ':0')
    end
  end
end

-- Add id, due at `due`, to the slot groups that far_push takes.
local function far_group(slots, by_slot, due, id)
  group_add(slots, by_slot, far_slot(due), id)
end

-- far_push of one id, without its tables (a single schedule's hot path: measured by
-- callgrind, 11k Redis instructions a call fewer than far_push).
local function far_push_one(far_key, faro_key, due, id)
  local score = fmt(far_slot(due))
  local open = redis.call('HGET', faro_key, score)
  local blob = (open or '') .. cmsgpack.pack(id)
  if #blob >= FAR_CHUNK then
    redis.call('ZADD', far_key, score, score .. ':1' .. blob)
    if open then
      redis.call('HDEL', faro_key, score)
      redis.call('ZREM', far_key, score .. ':0')
    end
    return
  end
  if not open then redis.call('ZADD', far_key, score, score .. ':0') end
  redis.call('HSET', faro_key, score, blob)
end

-- The slot start, the ids and the open flag of a far index member (an open chunk's ids
-- are read from faro).
local function far_entries(faro_key, member)
  local colon = string.find(member, ':', 1, true)
  local slot = string.sub(member, 1, colon - 1)
  if string.sub(member, colon + 1, colon + 1) == '0' then
    local blob = redis.call('HGET', faro_key, slot)
    return tonumber(slot), blob and {cmsgpack.unpack(blob)} or {}, true
  end
  return tonumber(slot), {cmsgpack.unpack(string.sub(member, colon + 2))}, false
end

-- Remove a chunk from the far index (far_entries said whether it is the open one).
local function far_drop(far_key, faro_key, member, slot, open)
  redis.call('ZREM', far_key, member)
  if open then redis.call('HDEL', faro_key, fmt(slot)) end
end

-- How many jobs the far index holds: the records (KEYS[first + 1 ..]) in none of due,
-- leased, dead and parked, less the jobs waiting for a permit (in none either: their
-- count is the field '' of counts_key, {ns:s}:kwaitn).
local function far_count(due_key, leased_key, dead_key, first, parked_key, counts_key)
  local n = 0
  for i = first + 1, #KEYS do n = n + redis.call('HLEN', KEYS[i]) end
  local out = tonumber(redis.call('HGET', counts_key, '') or '0')
  return n - redis.call('ZCARD', due_key) - redis.call('ZCARD', leased_key)
    - redis.call('ZCARD', dead_key) - redis.call('ZCARD', parked_key) - out
end

-- A record with its nominal set to due (schedule paths: the nominal was 0). A record
-- of up to task, payload, max and flags (a new one-shot job's) gets the defaults it
-- lacks and the nominal appended, without a decode (with `tails`, rec_tails's, for a
-- batch: callgrind, 3.8k Redis instructions a far job fewer than counting its fields by
-- their headers in Lua and packing the pad with the nominal); others are decoded and
-- encoded.
local function rec_with_nominal(s, due, tails)
  local t, p, mx, fl, nom = cmsgpack.unpack(s)
  if t ~= nil and nom == nil then
    local n = (fl ~= nil and 4) or (mx ~= nil and 3) or (p ~= nil and 2) or 1
    if n == 4 then return s .. cmsgpack.pack(due) end
    if tails then return s .. tails[n] .. cmsgpack.pack(due) end
    local pad = {DEFAULTS[F_PAYLOAD], DEFAULTS[F_MAX], DEFAULTS[F_FLAGS], due}
    return s .. cmsgpack.pack(unpack(pad, n, 4))
  end
  local r = rec_decode(s)
  r[F_NOMINAL] = due
  return rec_encode(r)
end

-- True when record s carries a nominal of its own other than `due`: a retried
-- occurrence written back by a reconcile (the Postgres mode), due at its run time. The
-- far index keeps no due beside the nominal (a far job's due is its nominal), so such a
-- job goes to due whatever its time (rec_with_nominal would overwrite its identity).
local function own_nominal(s, due)
  local _, _, _, _, nom = cmsgpack.unpack(s)
  return type(nom) == 'number' and nom ~= 0 and nom ~= due
end

-- The due time of a job with record s that is in none of due, leased and dead: a far
-- job, whose nominal is its due.
local function far_due(s)
  return rec_decode(s)[F_NOMINAL]
end

-- The live entries of ids (one far slot's), in the ids' order: {id, due, decoded record}.
-- parked_key: the shard's parked jobs (a parked job is not far either).
local function far_live(due_key, leased_key, dead_key, first, slot, ids, parked_key)
  local recs = get_records(ids, #ids, first)
  local live, seen = {}, {}
  for k = 1, #ids do
    local id, s = ids[k], recs[k]
    if s and not seen[id] and not redis.call('ZSCORE', due_key, id)
        and not redis.call('ZSCORE', leased_key, id) and not redis.call('ZSCORE', dead_key, id)
        and not redis.call('ZSCORE', parked_key, id) then
      local r = rec_decode(s)
      local due = r[F_NOMINAL]
      if due ~= 0 and far_slot(due) == slot and r[F_WAIT] ~= WAIT_PERMIT then
        seen[id] = true
        live[#live + 1] = {id, due, r}
      end
    end
  end
  return live
end

-- Move the far chunks scored up to `bound` into due (keys: due, leased, dead, far,
-- faro; the record buckets are KEYS[first + 1 ..]), chunk by chunk until at least
-- `budget` ids were looked at. Returns the score of the first chunk left at or below
-- bound, or nil when none is.
local function far_promote(due_key, leased_key, dead_key, far_key, faro_key, first, bound, budget,
    parked_key)
  local looked = 0
  local bstr = fmt(bound)
  while looked < budget do
    local chunk = redis.call('ZRANGEBYSCORE', far_key, '-inf', bstr, 'LIMIT', 0, 1)[1]
    if not chunk then break end
    local slot, ids, open = far_entries(faro_key, chunk)
    looked = looked + #ids
    local zadd, nz = {}, 0
    for _, e in ipairs(far_live(due_key, leased_key, dead_key, first, slot, ids, parked_key)) do
      zadd[nz + 1], zadd[nz + 2] = fmt(e[2]), e[1]
      nz = nz + 2
    end
    far_drop(far_key, faro_key, chunk, slot, open)
    if nz > 0 then bulk('ZADD', due_key, zadd) end
  end
  local left = redis.call('ZRANGEBYSCORE', far_key, '-inf', bstr, 'WITHSCORES', 'LIMIT', 0, 1)
  if #left > 0 then return tonumber(left[2]) end
  return nil
end

-- Visit the far index's live jobs in due order, slot by slot from the first, scored
-- below `below` (nil: all): visit(id, due, decoded record) returns true to stop. Each
-- slot's live jobs are sorted by (due, id) here (promotion needs no order). Reads at
-- most FAR_WALK entries, then fails with TW_TOOMANY (read-only: nothing written).
local FAR_WALK = 50000
local function far_walk(due_key, leased_key, dead_key, far_key, faro_key, first, below, visit,
    parked_key)
  local rank, looked = 0, 0
  local slot, ids = nil, {}
  local function flush_slot()
    if not slot then return false end
    local live = far_live(due_key, leased_key, dead_key, first, slot, ids, parked_key)
    table.sort(live, function(a, b)
      if a[2] ~= b[2] then return a[2] < b[2] end
      return a[1] < b[1]
    end)
    for _, e in ipairs(live) do
      if visit(e[1], e[2], e[3]) then return true end
    end
    slot, ids = nil, {}
    return false
  end
  while true do
    local page = redis.call('ZRANGE', far_key, rank, rank + 63, 'WITHSCORES')
    if #page == 0 then break end
    rank = rank + #page / 2
    for k = 1, #page, 2 do
      local score = tonumber(page[k + 1])
      if below and score >= below then return flush_slot() end
      if score ~= slot and flush_slot() then return true end
      local s, part = far_entries(faro_key, page[k])
      slot = s
      looked = looked + #part
      if looked > FAR_WALK then
        error('TW_TOOMANY more than ' .. FAR_WALK .. ' far entries to read', 0)
      end
      for _, id in ipairs(part) do ids[#ids + 1] = id end
    end
  end
  return flush_slot()
end

-- Parking (scheduler/_pause.py). A claim that meets a due job of a paused task moves it
-- from due to the shard's parked jobs, once: {ns:s}:parked (id -> due) for lookups by id,
-- and {ns:s}:parkedx, all scores 0, member park_member(task, due, id), so a resume reads
-- one task's parked jobs in due order (ZRANGEBYLEX) without scanning the others. Its
-- record keeps its nominal explicit (it is no longer in due to resolve a 0 against).
-- Task names hold no NUL (model/_jobs.py), so "<task>\0" prefixes only that task's.
local function park_member(task, due, id)
  return task .. '\0' .. string.format('%016d', due) .. '\0' .. id
end

-- Remove job id (record s) from the parked jobs if it is parked: true if it was.
local function unpark_drop(parked_key, parkedx_key, id, s)
  local p = redis.call('ZSCORE', parked_key, id)
  if not p then return false end
  redis.call('ZREM', parked_key, id)
  redis.call('ZREM', parkedx_key, park_member(cmsgpack.unpack(s), tonumber(p), id))
  return true
end

-- Priorities (issue 35). {ns:s}:prio is an index of the due jobs whose priority is above
-- 0: member id, score (MAX_PRIORITY - priority) * PRIO_SPAN + due, so one ZSET holds every
-- level, highest first, each in due order. The due ZSET stays the truth of what is due:
-- an entry is a hint that claim.lua checks against it (prio_lanes) and drops when the
-- job is no longer due at that time (cancelled, claimed, replaced); every script that
-- puts a job with a priority back into due (retry, reap, release, ack, resume, requeue)
-- adds its entry again with prio_add. Priority 0 jobs have no entry: the claim of a
-- namespace without priorities reads nothing more than one EXISTS.
local MAX_PRIORITY = 9
-- 2^49 ms is about 17,800 years: every due the far index can hold fits below it, and
-- 9 levels of it stay under 2^53, the doubles' exact integers.
local PRIO_SPAN = 562949953421312

local function prio_score(p, due)
  if due >= PRIO_SPAN then due = PRIO_SPAN - 1 end
  return (MAX_PRIORITY - p) * PRIO_SPAN + due
end

-- Index `id`, due at `due`, under priority p (a number; 0 or nil: none, so nothing).
local function prio_add(prio_key, id, due, p)
  if p and p > 0 then redis.call('ZADD', prio_key, fmt(prio_score(p, due)), id) end
end

-- The claim's hits when some due job has a priority: {id, due, ...} as ZRANGEBYSCORE
-- WITHSCORES gives them, at most `limit`, in claim order, and how many of them (the
-- first ones) are out of due already:
--   1. aged: due by now - aging, oldest first, whatever their priority (the bound on
--      a low priority's wait under a sustained higher backlog; aging < 0: none);
--   2. each level from MAX_PRIORITY down to 1, due by `horizon`, in due order;
--   3. the rest of due (priority 0) by `horizon`, in due order.
-- Index entries found stale on the way are dropped (not in due) or moved to the job's
-- due (in due later than the horizon); the claimed ones are dropped (prio_add puts
-- them back when the job returns to due). Each page of a level leaves the range it was
-- read from, so a level is read from offset 0 until it is short.
local function prio_lanes(due_key, prio_key, now, horizon, limit, aging)
  local hits, n, taken = {}, 0, {}
  local function take(id, due)
    taken[id] = true
    hits[2 * n + 1], hits[2 * n + 2] = id, due
    n = n + 1
  end
  if aging >= 0 then
    local old = redis.call('ZRANGEBYSCORE', due_key, '-inf', fmt(math.min(now - aging, horizon)),
      'WITHSCORES', 'LIMIT', 0, limit)
    for j = 1, #old, 2 do take(old[j], tonumber(old[j + 1])) end
  end
  local top = horizon < PRIO_SPAN and horizon or PRIO_SPAN - 1
  for p = MAX_PRIORITY, 1, -1 do
    local base = (MAX_PRIORITY - p) * PRIO_SPAN
    while n < limit do
      local want = limit - n
      local got = redis.call('ZRANGEBYSCORE', prio_key, fmt(base), fmt(base + top),
        'LIMIT', 0, want)
      if #got == 0 then break end
      local scores = redis.call('ZMSCORE', due_key, unpack(got))
      local drop, moved = {}, {}
      for j = 1, #got do
        local id, due = got[j], tonumber(scores[j])
        if due and due <= horizon and not taken[id] then
          take(id, due)
          drop[#drop + 1] = id
        elseif due and due > horizon then
          moved[#moved + 1], moved[#moved + 2] = fmt(prio_score(p, due)), id
        else
          drop[#drop + 1] = id  -- not in due, or claimed above as aged
        end
      end
      if #drop > 0 then redis.call('ZREM', prio_key, unpack(drop)) end
      if #moved > 0 then redis.call('ZADD', prio_key, unpack(moved)) end
      if #got < want then break end
    end
  end
  -- Out of due now, so the read of priority 0 below does not meet them again.
  local removed = n
  for k = 1, n, CHUNK do
    local part = {}
    for j = k, math.min(k + CHUNK - 1, n) do part[#part + 1] = hits[2 * j - 1] end
    redis.call('ZREM', due_key, unpack(part))
  end
  if n < limit then
    local rest = redis.call('ZRANGEBYSCORE', due_key, '-inf', fmt(horizon), 'WITHSCORES',
      'LIMIT', 0, limit - n)
    for j = 1, #rest, 2 do take(rest[j], tonumber(rest[j + 1])) end
  end
  return hits, removed
end

-- Flow-limit waits (docs/limits.md). A job that waits for a start of its key (rate) is
-- an ordinary due job, due at its booked start, with F_WAIT = 1. A job that waits for a
-- permit (concurrency) has F_WAIT = 2 and is in no index of its shard: only its record
-- and its entry in its key's waiters (limits.lua) hold it, and the wake (limit_wake)
-- puts it in due at now. The safety net of a lost wake is one timer per (task, key)
-- in the shard, {ns:s}:krecheck (ZSET "<task>\0<key>" -> when), not one per job.
-- {ns:s}:kwaitn (HASH) counts the waiting jobs per task, and under the field '' those
-- out of due (far_count leaves them out). Every script that takes a job out of its
-- wait (the wake, a claim, a cancel, a reschedule, a replace) clears the flag and the
-- counts with wait_end (a decoded record) or wait_end_packed (a packed one, about to be
-- overwritten or deleted).
-- What one batch call (waits.lua, woken.lua) keeps between its jobs, set by
-- batch_start: BATCH.deferred sums the counts' changes per field, written once at the
-- call's end (counts_flush) instead of two HINCRBY a job; BATCH.timers the recheck
-- timers limit_wait set in this call (member -> when); BATCH.nowakes: the call found
-- no wake kept, so limit_wait looks none up. Empty in any other call.
local BATCH = {}
local function wait_count(counts_key, task, flag, by)
  local d = BATCH.deferred
  if d then
    d[task] = (d[task] or 0) + by
    if flag == WAIT_PERMIT then d[''] = (d[''] or 0) + by end
    return
  end
  if redis.call('HINCRBY', counts_key, task, by) <= 0 then redis.call('HDEL', counts_key, task) end
  if flag == WAIT_PERMIT and redis.call('HINCRBY', counts_key, '', by) <= 0 then
    redis.call('HDEL', counts_key, '')
  end
end

local function batch_start()
  BATCH.deferred, BATCH.timers = {}, {}
end

local function counts_flush(counts_key)
  local d = BATCH.deferred
  BATCH.deferred = nil
  for field, by in pairs(d) do
    if by ~= 0 and redis.call('HINCRBY', counts_key, field, by) <= 0 then
      redis.call('HDEL', counts_key, field)
    end
  end
end

local function wait_end(counts_key, r)
  local flag = r[F_WAIT]
  if flag ~= 0 then
    r[F_WAIT] = 0
    wait_count(counts_key, r[F_TASK], flag, -1)
  end
end

local function wait_end_packed(counts_key, s)
  local flag = select(F_WAIT, cmsgpack.unpack(s))
  if flag == WAIT_DUE or flag == WAIT_PERMIT then
    wait_count(counts_key, (cmsgpack.unpack(s)), flag, -1)
  end
end

-- The recheck timer's member of a task's flow key.
local function recheck_member(task, key)
  return task .. '\0' .. key
end

-- Give the leased job `id` (record r, decoded, held by the caller: checked) back,
-- unspent, to wait (its lease removed from leased_key; nil: the caller removed it): for a permit (`permit`), out of due, its key's timer in rechecks_key
-- set to now + delay unless it is due sooner (a timer already due is set again: the
-- recheck that read it may be about to remove it); for a start of its key, due at now
-- + delay. A permit wait whose wake came while it was still leased is due now instead,
-- not waiting. Returns the due (for a permit wait, its recheck bound).
local function limit_wait(leased_key, due_key, prio_key, counts_key, wakes_key, rechecks_key,
  jobs_key, id, r, now, delay, permit)
  if leased_key then redis.call('ZREM', leased_key, id) end  -- nil: the caller removed it
  r[F_EPOCH] = 0
  local due = now + delay
  local woke = permit and not BATCH.nowakes and redis.call('ZSCORE', wakes_key, id)
  local flag = permit and WAIT_PERMIT or WAIT_DUE
  if woke and tonumber(woke) >= now then
    redis.call('ZREM', wakes_key, id)
    due = now  -- its permit was handed to it while it was still leased here
    flag = 0
  end
  wait_end(counts_key, r)
  if flag ~= 0 then
    r[F_WAIT] = flag
    wait_count(counts_key, r[F_TASK], flag, 1)
  end
  -- The nominal stays explicit (the occurrence's identity): a recurring job's next
  -- occurrence is planned from it at the ack, not from the deferred due.
  redis.call('HSET', jobs_key, id, rec_encode(r))
  if flag == WAIT_PERMIT then
    local m = recheck_member(r[F_TASK], r[F_KEY])
    local timers = BATCH.timers
    local set = timers and timers[m]
    if not (set and set <= due) then  -- a timer this call set, after now, by due: kept
      local at = redis.call('ZSCORE', rechecks_key, m)
      at = at and tonumber(at)
      if not at or at <= now or at > due then
        redis.call('ZADD', rechecks_key, fmt(due), m)
        at = due
      end
      if timers and at > now then timers[m] = at end
    end
    return due
  end
  redis.call('ZADD', due_key, fmt(due), id)
  prio_add(prio_key, id, due, r[F_PRIORITY])
  return due
end

-- A flow-limit wake (wake.lua): make the waiting job `id` (its record in jobs_key) due
-- now. Returns 1 due now; 2 still leased (a wake kept in wakes_key until now + hold, for
-- its wait); 0 not waiting (gone, or out of its wait: claimed at its booked start,
-- rescheduled or replaced by a user, cancelled).
local function limit_wake(due_key, leased_key, counts_key, wakes_key, prio_key, jobs_key, id, now,
  hold)
  local s = redis.call('HGET', jobs_key, id)
  if not s then return 0 end
  local r = rec_decode(s)
  local flag = r[F_WAIT]
  if flag == WAIT_PERMIT then
    wait_end(counts_key, r)
    redis.call('HSET', jobs_key, id, rec_encode(r))
    redis.call('ZADD', due_key, fmt(now), id)
    prio_add(prio_key, id, now, r[F_PRIORITY])
    return 1
  end
  if flag == WAIT_DUE then
    local d = redis.call('ZSCORE', due_key, id)
    if d then
      wait_end(counts_key, r)
      redis.call('HSET', jobs_key, id, rec_encode(r))
      if tonumber(d) > now then
        redis.call('ZADD', due_key, fmt(now), id)
        prio_add(prio_key, id, now, r[F_PRIORITY])
      end
      return 1
    end
  end
  if redis.call('ZSCORE', leased_key, id) then
    redis.call('ZADD', wakes_key, fmt(now + hold), id)
    return 2
  end
  return 0
end

-- A flow key's permits (docs/limits.md): the acquire of limits.lua, here so that claim.lua
-- makes the same decision in the same keys when it takes its jobs' permits (one Redis
-- only). The keys of one flow key (Keys.limit_keys): P permits ZSET member -> deadline,
-- H holders HASH member -> "<epoch>:<attempt>" ('' handed), W waiters LIST, S starts
-- ZSET, B booked ZSET (limits.lua's header). LIM is one call's state, set by lim_start:
-- `now` (TIME in ms: this node's clock, never the shard's), `card` the counts of P
-- (ZCARD) and W (LLEN) read once a call and kept as the call changes them (a
-- redis.call is a few thousand Redis instructions), `expired` the P swept this call.
local LIM = {}
local function lim_start()
  local t = redis.call('TIME')
  LIM.now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  LIM.card, LIM.expired = {}, {}
  return LIM.now
end

-- The count of K (count_cmd 'ZCARD' for P, 'LLEN' for W), read once a call.
local function lim_card(K, count_cmd)
  local n = LIM.card[K]
  if not n then
    n = redis.call(count_cmd, K)
    LIM.card[K] = n
  end
  return n
end

-- Permits past their deadline (a worker killed or stalled past its lease) are freed
-- (once per key a call: `now` does not move within it).
local function lim_expire(P, H, W)
  if LIM.expired[P] then return end
  LIM.expired[P] = true
  local card_n = LIM.card
  local old = redis.call('ZRANGEBYSCORE', P, '-inf', LIM.now, 'LIMIT', 0, 100)
  if #old > 0 then
    local holders = redis.call('HMGET', H, unpack(old))
    redis.call('ZREM', P, unpack(old))
    redis.call('HDEL', H, unpack(old))
    if card_n[P] then card_n[P] = card_n[P] - #old end
    -- A permit handed to a waiter that never took it (its wake was lost, or it is
    -- due still, unclaimed): the waiter goes back to the head of the waiters, in order.
    for i = #old, 1, -1 do
      if holders[i] == '' then
        redis.call('LPUSH', W, old[i])
        if card_n[W] then card_n[W] = card_n[W] + 1 end
      end
    end
  end
end

-- The start time of the rate_n-th latest start or booking (the window's oldest one
-- that counts), or nil when fewer than rate_n are left in the window.
local function lim_nth_latest(S, B, rate_n)
  local a = redis.call('ZREVRANGE', S, 0, rate_n - 1, 'WITHSCORES')
  local b = redis.call('ZREVRANGE', B, 0, rate_n - 1, 'WITHSCORES')
  if #a + #b < 2 * rate_n then return nil end
  local all = {}
  for i = 2, #a, 2 do all[#all + 1] = tonumber(a[i]) end
  for i = 2, #b, 2 do all[#all + 1] = tonumber(b[i]) end
  table.sort(all, function(x, y) return x > y end)
  return all[rate_n]
end

-- The instant a full window's own starts leave room for one more: its rate_n-th latest
-- start leaves it.
local function lim_room_at(S, rate_n, rate_ms)
  local a = redis.call('ZREVRANGE', S, rate_n - 1, rate_n - 1, 'WITHSCORES')
  return tonumber(a[2]) + rate_ms + 1
end

-- Acquire m's permit for holder, held until now + hold: returns code, delay ({1, 0}
-- granted; {2, 0} queued in W, waits for a permit; {3, delay} a start is booked for it
-- in delay ms: limits.lua's 'a'). A member that gets a permit stays in the waiters if
-- an old entry of it is there (a tombstone): the release that pops it skips it while
-- it holds a permit.
local function lim_acquire(P, H, W, S, B, m, holder, conc, rate_n, rate_ms, hold, nominal)
  local now, card_n = LIM.now, LIM.card
  local have = false
  if conc > 0 then
    -- A key holding no permit has none past its deadline: no sweep (a fresh key's call).
    if lim_card(P, 'ZCARD') > 0 then lim_expire(P, H, W) else LIM.expired[P] = true end
    if rate_n == 0 and lim_card(P, 'ZCARD') < conc then
      -- A grant without a rate: the holder is written by the call that tells whether
      -- it had a permit already (handed to it, or its own: then only its holder and
      -- deadline change).
      if redis.call('HSETNX', H, m, holder) == 0 then
        redis.call('HSET', H, m, holder)
      else
        card_n[P] = card_n[P] + 1
      end
      redis.call('ZADD', P, now + hold, m)
      return 1, 0
    end
    local cur = redis.call('HGET', H, m)
    if cur then
      have = true  -- handed to it, or its own (a re-sent acquire, or a later attempt)
    elseif lim_card(P, 'ZCARD') >= conc then
      -- Queued in the order asked (a re-sent acquire queues it twice: its second entry
      -- finds it holding a permit, or its wake finds it not waiting: 0).
      redis.call('RPUSH', W, m)
      if card_n[W] then card_n[W] = card_n[W] + 1 end
      return 2, 0
    end
  end
  local start_member = m .. '|' .. nominal
  if rate_n > 0 then
    redis.call('ZREMRANGEBYSCORE', S, '-inf', '(' .. (now - rate_ms))
    redis.call('ZREMRANGEBYSCORE', B, '-inf', '(' .. (now - rate_ms))
    local mine = string.match(nominal, '^[^|]*')
    local book_member = m .. '|' .. mine
    local booked = redis.call('ZSCORE', B, book_member)
    if booked then redis.call('ZREM', B, book_member) end
    local started = redis.call('ZSCORE', S, start_member)
    if not started then
      -- The window's own starts decide; bookings only place the waiters.
      local full = redis.call('ZCOUNT', S, now - rate_ms, '+inf') >= rate_n
      local at = nil
      if booked then
        -- It came for its booked start and the window is still full (the grants before
        -- it lagged their bookings, or it fired a little early): it keeps its place,
        -- booked again for its own start or, that passed, the instant the window's own
        -- starts leave room; never behind the later bookings (that cost a whole window
        -- per lag).
        if full then at = math.max(tonumber(booked), lim_room_at(S, rate_n, rate_ms)) end
      else
        local nth = lim_nth_latest(S, B, rate_n)
        if nth and nth + rate_ms + 1 > now then at = nth + rate_ms + 1 end
        if full and not at then at = lim_room_at(S, rate_n, rate_ms) end
      end
      if at then
        redis.call('ZADD', B, at, book_member)
        if have then redis.call('ZADD', P, at + hold, m) end  -- kept for it meanwhile
        return 3, at - now
      end
      redis.call('ZADD', S, now, start_member)
    end
  end
  if conc > 0 then
    redis.call('HSET', H, m, holder)
    redis.call('ZADD', P, now + hold, m)
    if not have then card_n[P] = lim_card(P, 'ZCARD') + 1 end
  end
  return 1, 0
end
