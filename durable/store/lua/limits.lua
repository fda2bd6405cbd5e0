-- limits.lua: the permits of one flow key of one task (docs/limits.md). Every key here
-- carries the key's own hash tag {ns:L:<hash>} (Keys.limit_keys): one slot per
-- (task, key), whatever shards its jobs are in, on one Redis or a Redis Cluster.
-- KEYS[1] permits   ZSET "<shard>|<id>" -> the permit's deadline (ms, this node's clock)
-- KEYS[2] holders   HASH "<shard>|<id>" -> "<epoch>:<attempt>" of the run holding it;
--                   "" for a permit handed to a waiter (release) and not taken yet
-- KEYS[3] waiters   LIST of "<shard>|<id>", first come first (RPUSH, LPOP): a
--                   listpack of a dozen bytes an entry, not a sorted set's ~100. An
--                   entry is not removed when its job stops waiting otherwise (it is
--                   cancelled, moved by a user, or its acquire was sent twice): it is
--                   popped in turn, and a member that holds a permit already is skipped;
--                   the wake of one whose job no longer waits finds none (wake.lua: 0)
-- KEYS[4] starts    ZSET "<shard>|<id>|<nominal>|<attempt>" -> start time (rate window)
-- KEYS[5] booked    ZSET "<shard>|<id>|<nominal>" -> a start time booked for a job that
--                   waits for the rate (so waiters are spread over the windows)
-- ARGV[1]  op       'a' acquire, 'r' release, 'x' extend, 'l' look (read only); 'A',
--                   'R' and 'K' (recheck): batches (below)
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
--   ARGV[1] 'A' acquire, 'R' release or 'K' recheck; ARGV[2] hold_ms; then per group,
--   in the order of KEYS: the count c of its jobs, conc, rate_n, rate_ms, then c jobs
--   of 3 values with 'A' (member, holder, nominal), 2 with 'R' (member, holder), none
--   with 'K' (c is 1; 'K' reads only conc: -1 for a task with no concurrency limit of
--   record any more, whose waiters are all handed out, RECHECK_MAX a call). The limits
--   go once a group, not once a job: each value is a string Redis makes for the script.
--   'A' returns {code_1, delay_1, code_2, delay_2, ...}, as 'a' per job in order;
--   'R' returns {count_1, member.., count_2, member..}: per job, as 'r', its count first.
--   'K' (the safety net of a lost wake, Limiter's recheck): per key, the permits past
--   their deadline freed (a handed one that nobody took goes back to the head of the
--   waiters), the free ones handed to the first waiters, and returns {waiters left,
--   new, all, member..}: the `new` members handed now, then the members handed before
--   and not taken yet (`all` in all), each to be woken (again).
-- Errors: none (the client checks the limits; a Redis error only for a wrong type).
-- Re-sent safely: an acquire of a member that holds its permit is granted again (its
-- deadline renewed), a queued one is queued twice (above: harmless); a release by a
-- holder that no longer holds it frees nothing of another's.
-- The acquire (lim_acquire), the count of a key's permits and waiters read once a call
-- (lim_card) and the sweep of permits past their deadline (lim_expire) are _lib.lua's:
-- claim.lua takes permits with them too (one Redis).
local now = lim_start()
local card_n = LIM.card
local RECHECK_MAX = 200

-- Release m's permit if holder holds it, then hand the free ones to the first waiters:
-- appended to out (their members); how many were.
local function release(P, H, W, m, holder, conc, hold, out)
  if m ~= '' and redis.call('HGET', H, m) == holder then
    redis.call('HDEL', H, m)
    local r = redis.call('ZREM', P, m)
    if card_n[P] then card_n[P] = card_n[P] - r end
  end
  lim_expire(P, H, W)
  local n = lim_card(P, 'ZCARD')
  local cap = conc
  if conc < 0 then cap = n + RECHECK_MAX end  -- no concurrency limit of record any more
  local handed = 0
  while n < cap and card_n[W] ~= 0 do
    local top = redis.call('LPOP', W)
    if not top then
      card_n[W] = 0
      break
    end
    if card_n[W] then card_n[W] = card_n[W] - 1 end
    -- A member with a permit (its own, or handed already) is not handed another.
    if redis.call('HEXISTS', H, top) == 0 then
      -- Handed to the waiter: held for it until it takes it (or the deadline passes).
      redis.call('HSET', H, top, '')
      redis.call('ZADD', P, now + hold, top)
      out[#out + 1] = top
      handed = handed + 1
      n = n + 1
    end
  end
  card_n[P] = n
  -- Holders left without a permit (none in a consistent key) go with the last permit.
  if n == 0 then redis.call('DEL', P, H) end
  return handed
end

-- The recheck of one key ('K'): appended to out as the header says.
local function recheck(P, H, W, conc, hold, out)
  local at = #out
  out[at + 1], out[at + 2], out[at + 3] = 0, 0, 0
  local new = {}
  local n = release(P, H, W, '', '', conc, hold, new)
  for i = 1, n do out[#out + 1] = new[i] end
  if redis.call('EXISTS', H) == 1 then
    local seen = {}
    for i = 1, n do seen[new[i]] = true end
    local all = redis.call('HGETALL', H)
    for i = 1, #all, 2 do
      if all[i + 1] == '' and not seen[all[i]] then out[#out + 1] = all[i] end
    end
  end
  out[at + 1], out[at + 2], out[at + 3] = redis.call('LLEN', W), n, #out - at - 3
end

local op = ARGV[1]
if op == 'A' or op == 'R' or op == 'K' then
  local hold, out = tonumber(ARGV[2]), {}
  local width = (op == 'A' and 3) or (op == 'R' and 2) or 0
  local i, g = 3, 0
  while i <= #ARGV do
    local c, conc = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
    local rate_n, rate_ms = tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
    local P, H, W, S, B = KEYS[g + 1], KEYS[g + 2], KEYS[g + 3], KEYS[g + 4], KEYS[g + 5]
    g, i = g + 5, i + 4
    if c > 1 and conc > 0 and op ~= 'K' then lim_card(W, 'LLEN') end  -- count its waiters once
    for _ = 1, c do
      local m, holder = ARGV[i], ARGV[i + 1]
      if op == 'K' then
        recheck(P, H, W, conc, hold, out)
      elseif op == 'A' then
        local code, delay = lim_acquire(P, H, W, S, B, m, holder, conc, rate_n, rate_ms, hold,
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
  return {redis.call('ZCARD', P) - handed, redis.call('LLEN', W), handed,
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
local code, delay = lim_acquire(P, H, W, S, B, m, holder, conc, rate_n, rate_ms, hold, ARGV[8])
return {code, delay}
