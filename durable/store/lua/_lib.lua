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
-- Nothing here reads the client's clock: "now" is TIME, never below {ns:s}:clock.

local F_TASK, F_PAYLOAD, F_MAX, F_FLAGS, F_NOMINAL, F_ATTEMPT, F_EPOCH = 1, 2, 3, 4, 5, 6, 7
local F_RKIND, F_RSPEC, F_POLICY, F_CAP, F_GRACE, F_ERROR = 8, 9, 10, 11, 12, 13
local NFIELDS = 13
-- Mirrored in _record.py (DEFAULTS); 5 = DEFAULT_MAX_ATTEMPTS in _model.py.
local DEFAULTS = {'', '', 5, 0, 0, 1, 0, 0, '', 0, 0, 0, ''}
-- unpack() of a long list overflows Lua's C stack (LUAI_MAXCSTACK 8000): chunk bulk calls.
local CHUNK = 1000

local function rec_decode(s)
  local r = {cmsgpack.unpack(s)}
  for i = #r + 1, NFIELDS do r[i] = DEFAULTS[i] end
  return r
end

local function rec_encode(r)
  local n = NFIELDS
  while n > 0 and r[n] == DEFAULTS[n] do n = n - 1 end
  return cmsgpack.pack(unpack(r, 1, n))
end

-- "Now" in ms: Redis TIME, never lower than the shard's high-water mark, which a
-- mutating script advances (so a failover to a server with a slower clock, or a test
-- pushing the mark forward, never makes time run backwards).
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

-- Group positions 1..n of ids by their bucket key: returns keys (in first-seen order),
-- per key the positions, the key of each position and its bucket index. The index of
-- position k is given[k] when the caller passes given (ack: the client sends what the
-- claim returned), else each id is hashed once.
local function by_bucket(ids, n, first, given)
  local order, groups, key_of, index_of = {}, {}, {}, {}
  local nb = #KEYS - first
  for k = 1, n do
    local b = given and given[k] or bucket_index(ids[k], nb)
    if type(b) ~= 'number' or b < 0 or b >= nb then
      error({err = 'TW_BADARG bucket ' .. tostring(b) .. ' of ' .. ids[k]})
    end
    local key = KEYS[first + 1 + b]
    index_of[k] = b
    key_of[k] = key
    local g = groups[key]
    if not g then
      g = {}
      groups[key] = g
      order[#order + 1] = key
    end
    g[#g + 1] = k
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

-- Append the reply row of a record to out (whose length is n): fields 1..13 with the
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
