-- limits.lua: the permits of one flow key of one task (docs/limits.md). Every key here
-- carries the key's own hash tag {ns:L:<hash>} (Keys.limit_keys): one slot per
-- (task, key), whatever shards its jobs are in, on one Redis or a Redis Cluster.
-- KEYS[1] permits   ZSET "<shard>|<id>" -> the permit's deadline (ms, this node's clock)
-- KEYS[2] holders   HASH "<shard>|<id>" -> "<epoch>:<attempt>" of the run holding it;
--                   "" for a permit handed to a waiter (release) and not taken yet
-- KEYS[3] waiters   ZSET "<shard>|<id>" -> the time it first waited (FIFO; a
--                   fraction of a ms orders the waiters of one call)
-- KEYS[4] starts    ZSET "<shard>|<id>|<nominal>|<attempt>" -> start time (rate window)
-- KEYS[5] booked    ZSET "<shard>|<id>|<nominal>" -> a start time booked for a job that
--                   waits for the rate (so waiters are spread over the windows)
-- ARGV[1]  op       'a' acquire, 'r' release, 'x' extend, 'l' look (read only); 'A'
--                   and 'R': batches (below)
-- ARGV[2]  member   "<shard>|<id>"
-- ARGV[3]  holder   "<epoch>:<attempt>" ('' with 'r': free a handed permit nobody took)
-- ARGV[4]  conc     at most this many permits (0: no concurrency limit)
-- ARGV[5]  rate_n   at most this many starts per window (0: no rate limit)
-- ARGV[6]  rate_ms  the window (ms)
-- ARGV[7]  hold_ms  a permit's length: the run's lease (extended with it, 'x')
-- ARGV[8]  nominal  "<nominal>|<attempt>" of the run (acquire, for the rate)
-- Returns:
--   'a': {1, 0} granted; {2, 0} waits for a permit (queued in KEYS[3]); {3, delay}
--        waits for the rate: a start is booked for it in `delay` ms.
--   'r': the members handed a permit (as many as are free): the caller wakes each.
--   'x': 1 extended, 0 not held by that holder.
--   'l': {running, waiting, handed, next permit deadline or -1, next booked start or -1,
--        starts in the current window, now}
-- Batches (one call for many jobs: the script's own cost paid once, docs/limits.md):
--   KEYS: 5 per flow key, in the order above (KEYS[5g-4 .. 5g] is group g; on a Redis
--   Cluster the client sends one slot's groups a call).
--   ARGV[1] 'A' acquire or 'R' release; ARGV[2] hold_ms; then per group, in the order
--   of KEYS: the count c of its jobs, conc, rate_n, rate_ms, then c jobs of 3 values
--   with 'A' (member, holder, nominal) or 2 with 'R' (member, holder). The limits go
--   once a group, not once a job: each value is a string Redis makes for the script.
--   'A' returns {code_1, delay_1, code_2, delay_2, ...}, as 'a' per job in order;
--   'R' returns {count_1, member.., count_2, member..}: per job, as 'r', its count first.
-- Errors: none (the client checks the limits; a Redis error only for a wrong type).
-- Re-sent safely: an acquire of a member that holds its permit is granted again (its
-- deadline renewed), a queued one stays queued once; a release by a holder that no
-- longer holds it frees nothing of another's.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Waiters queued by this call so far: the n-th is queued at now + n / QUEUE_STEPS, so a
-- batch's waiters keep their order and stay before the next millisecond's (a batch is
-- far below QUEUE_STEPS jobs; a double holds 1/4096 ms exactly at today's ms).
local queued, QUEUE_STEPS = 0, 4096

-- Per key, within a call: how many permits are held (ZCARD of P) and how many waiters
-- are queued (ZCARD of W), each read once and then kept as this call changes them, so a
-- batch's later jobs of a key read no count (callgrind: a redis.call is a few thousand
-- Redis instructions; docs/limits.md, "Costs"). The waiters' count is read only for a
-- key with several jobs in the call (nil: not known; the calls that need it are made).
local card_n = {}  -- key -> its ZCARD, kept (P and W: one table, their names differ)
local function card(Z)
  local n = card_n[Z]
  if not n then
    n = redis.call('ZCARD', Z)
    card_n[Z] = n
  end
  return n
end

-- Permits past their deadline (a worker killed or stalled past its lease) are freed
-- (once per key a call: `now` does not move within it).
local expired = {}
local function expire(P, H)
  if expired[P] then return end
  expired[P] = true
  local old = redis.call('ZRANGEBYSCORE', P, '-inf', now, 'LIMIT', 0, 100)
  if #old > 0 then
    redis.call('ZREM', P, unpack(old))
    redis.call('HDEL', H, unpack(old))
    if card_n[P] then card_n[P] = card_n[P] - #old end
  end
end

-- The start time of the rate_n-th latest start or booking (the window's oldest one
-- that counts), or nil when fewer than rate_n are left in the window.
local function nth_latest(S, B, rate_n)
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
local function room_at(S, rate_n, rate_ms)
  local a = redis.call('ZREVRANGE', S, rate_n - 1, rate_n - 1, 'WITHSCORES')
  return tonumber(a[2]) + rate_ms + 1
end

-- Release m's permit if holder holds it, then hand the free ones to the first waiters:
-- appended to out (their members); how many were.
local function release(P, H, W, m, holder, conc, hold, out)
  expire(P, H)
  local n = card(P)
  if redis.call('HGET', H, m) == holder then
    redis.call('HDEL', H, m)
    n = n - redis.call('ZREM', P, m)
  end
  local handed = 0
  while n < conc and card_n[W] ~= 0 do
    local top = redis.call('ZPOPMIN', W)
    if #top == 0 then
      card_n[W] = 0
      break
    end
    if card_n[W] then card_n[W] = card_n[W] - 1 end
    -- Handed to the waiter: held for it until it takes it (or the deadline passes).
    redis.call('HSET', H, top[1], '')
    redis.call('ZADD', P, now + hold, top[1])
    out[#out + 1] = top[1]
    handed = handed + 1
    n = n + 1
  end
  card_n[P] = n
  -- Holders left without a permit (none in a consistent key) go with the last permit.
  if n == 0 then redis.call('DEL', P, H) end
  return handed
end

-- Acquire m's permit: code, delay (as the header's 'a').
local function acquire(P, H, W, S, B, m, holder, conc, rate_n, rate_ms, hold, nominal)
  local have = false
  if conc > 0 then
    expire(P, H)
    if rate_n == 0 and card(P) < conc then
      -- A grant without a rate: the holder is written by the call that tells whether
      -- it had a permit already (handed to it, or its own: then only its holder and
      -- deadline change).
      if redis.call('HSETNX', H, m, holder) == 0 then
        redis.call('HSET', H, m, holder)
        redis.call('ZADD', P, now + hold, m)
        return 1, 0
      end
      redis.call('ZADD', P, now + hold, m)
      card_n[P] = card_n[P] + 1
      -- Out of the waiters (no call when the key is known to have none).
      local q = card_n[W]
      if q ~= 0 then
        local r = redis.call('ZREM', W, m)
        if q then card_n[W] = q - r end
      end
      return 1, 0
    end
    local cur = redis.call('HGET', H, m)
    if cur then
      have = true  -- handed to it, or its own (a re-sent acquire, or a later attempt)
    elseif card(P) >= conc then
      -- Queued in the order asked within a call too (a batch shares its `now`); one
      -- already queued keeps its place (NX).
      queued = queued + 1
      local added = redis.call('ZADD', W, 'NX', now + queued / QUEUE_STEPS, m)
      if card_n[W] then card_n[W] = card_n[W] + added end
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
        if full then at = math.max(tonumber(booked), room_at(S, rate_n, rate_ms)) end
      else
        local nth = nth_latest(S, B, rate_n)
        if nth and nth + rate_ms + 1 > now then at = nth + rate_ms + 1 end
        if full and not at then at = room_at(S, rate_n, rate_ms) end
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
    if not have then
      card_n[P] = card(P) + 1
      -- Out of the waiters: a member with a permit (handed or its own) is never in
      -- them (no call when the key is known to have none).
      local q = card_n[W]
      if q ~= 0 then
        local r = redis.call('ZREM', W, m)
        if q then card_n[W] = q - r end
      end
    end
  end
  return 1, 0
end

local op = ARGV[1]
if op == 'A' or op == 'R' then
  local hold, out = tonumber(ARGV[2]), {}
  local width = op == 'A' and 3 or 2
  local i, g = 3, 0
  while i <= #ARGV do
    local c, conc = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
    local rate_n, rate_ms = tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
    local P, H, W, S, B = KEYS[g + 1], KEYS[g + 2], KEYS[g + 3], KEYS[g + 4], KEYS[g + 5]
    g, i = g + 5, i + 4
    if c > 1 and conc > 0 then card(W) end  -- several jobs: count its waiters once
    for _ = 1, c do
      local m, holder = ARGV[i], ARGV[i + 1]
      if op == 'A' then
        local code, delay = acquire(P, H, W, S, B, m, holder, conc, rate_n, rate_ms, hold,
          ARGV[i + 2])
        out[#out + 1] = code
        out[#out + 1] = delay
      else
        local at = #out + 1
        out[at] = 0
        out[at] = release(P, H, W, m, holder, conc, hold, out)
      end
      i = i + width
    end
  end
  return out
end

local m, holder = ARGV[2], ARGV[3]
local conc, rate_n, rate_ms = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local hold = tonumber(ARGV[7])
local P, H, W, S, B = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]

if op == 'l' then
  local first = redis.call('ZRANGE', P, 0, 0, 'WITHSCORES')
  local booked = redis.call('ZRANGEBYSCORE', B, now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  local handed = 0
  if redis.call('HLEN', H) > 0 then
    for _, v in ipairs(redis.call('HVALS', H)) do if v == '' then handed = handed + 1 end end
  end
  local window = rate_ms > 0 and redis.call('ZCOUNT', S, now - rate_ms, '+inf') or 0
  return {redis.call('ZCARD', P) - handed, redis.call('ZCARD', W), handed,
    first[2] and tonumber(first[2]) or -1, booked[2] and tonumber(booked[2]) or -1,
    window, now}
end

if op == 'x' then
  if redis.call('HGET', H, m) ~= holder then return 0 end
  redis.call('ZADD', P, now + hold, m)
  return 1
end

if op == 'r' then
  local woken = {}
  release(P, H, W, m, holder, conc, hold, woken)
  return woken
end

-- op 'a': acquire.
local code, delay = acquire(P, H, W, S, B, m, holder, conc, rate_n, rate_ms, hold, ARGV[8])
return {code, delay}
