-- claim.lua: lease the jobs of one shard that are due by now + lookahead.
-- KEYS[1] due  KEYS[2] leased  KEYS[3] done  KEYS[4] epoch  KEYS[5] clock
-- KEYS[6] reply   where this claim's reply is kept ({ns:s}:claim:<token>)
-- KEYS[7] forget  the reply key of the caller's previous claim, now received: deleted
--                 (may equal KEYS[6]'s prefix with another token; same slot)
-- KEYS[8] dead  KEYS[9] far  KEYS[10] faro
-- KEYS[11] paused  KEYS[12] parked  KEYS[13] parkedx   (the shard's pause, _lib.lua)
-- KEYS[14] prio   the index of due jobs with a priority (_lib.lua: prio_lanes)
-- KEYS[15] waiting  HASH task -> its jobs waiting for their flow key (_lib.lua: a job
--                  claimed out of its wait, at its recheck time, leaves the count)
-- KEYS[16..] jobs buckets (all of the shard's, in order)
-- ARGV[1]  epoch      the caller's fencing epoch for this shard
-- ARGV[2]  lookahead  ms: claim jobs due by now + lookahead
-- ARGV[3]  limit      at most this many jobs
-- ARGV[4]  lease      ms: each lease ends at max(now, due) + lease
-- ARGV[5]  prestart   '1': the leases are pre-start leases, stored at deadline + 0.5 (a
--                     score with a half ms): the worker's extension when the run starts
--                     (extend.lua) stores a whole ms, and the reaper (reap.lua) returns
--                     an expired lease with the half ms without charging an attempt.
--                     '' or absent: whole ms (a started run's lease).
-- ARGV[6]  aging      ms: with priorities in use, a job due by now - aging is claimed
--                     before any priority, oldest first ('' or absent: 60000; negative:
--                     no aging). Without priorities (KEYS[14] empty), jobs are claimed
--                     in due order, as ever.
-- ARGV[7..] the flow limits the claim takes the permits of (docs/limits.md, "How a
--          limited job runs"): sent only on one Redis (never a Redis Cluster) and in
--          the Redis-only mode, by a worker of this version ('' or absent: none, every
--          limited job takes its permit at the worker's gate, limits.lua):
--   ARGV[7] hold_ms    a permit's length (the run's lease): its deadline is now +
--                      hold_ms, the job's own lease's (only a job due now takes one)
--   ARGV[8] recheck_ms a permit waiter's recheck bound (limit_wait's delay)
--   ARGV[9] shard      this shard's number (a permit's member is "<shard>|<id>")
--   ARGV[10] "{<ns>:L:" the flow keys' tag prefix (Keys.limit_keys)
--   ARGV[11] wakes     {ns:s}:kwake  ARGV[12] rechecks {ns:s}:krecheck (waits.lua's)
--   ARGV[13..] 3 per task with a concurrency and no rate: task, "<len>:<task>:" (the
--              start of its keys' names), conc
--   A one-shot job of such a task, due now, that the claim would lease takes its permit
--   here,--   with limits.lua's own acquire (_lib.lua: lim_acquire) in its key's keys: granted,
--   it is leased and its row's tag says so (below); over the limit it is not leased:
--   it waits as waits.lua's op 'w' makes it (_lib.lua: limit_wait: field 18, its key's
--   waiters, the waiting counts, the recheck timer) and is left out of the rows. The
--   keys of the flow keys and ARGV[11..12] are not in KEYS: they are of other slots
--   (the flow keys') or named here only. Redis checks neither outside a cluster, and
--   the client never sends ARGV[7..] to a cluster.
-- Returns: a msgpack array (one bulk string: it is kept as it is sent, below, and the
--   client decodes it faster than Redis converts a Lua table of it to RESP):
--   {now, dropped, parked, [waited,] then per job: id, due, deadline, tag, count,
--   field_1 .. field_count}: waited (only with ARGV[7]) counts the jobs over their flow
--   key's limit, left waiting; tag = dup + 2 * held + 4 * bucket, held 1 for a job
--   whose permit the claim took (held by "<epoch>:<attempt>"), where bucket is the
--   index from 0 of the job's record hash among KEYS[16..], for the ack to send back,
--   and dup is 0 or 1 (below);
--   count is 6 (task, payload, max, flags, nominal, attempt: the epoch is ARGV[1] and
--   the rest are at their defaults) for a one-shot job with no error, no timeout of
--   its own, no trace context and no flow key (a priority alone keeps it short); 7
--   (those 6, then the timeout) for such a job with a timeout of its own; 8 (those 7,
--   then the version) for such a job with a version (field 19, the Postgres mode), and
--   a priority or not; else 19 (NFIELDS); the nominal is resolved. dropped counts
--   one-shot jobs whose occurrence is in done already: removed, not returned. A
--   recurring job whose occurrence is done comes back leased with dup = 1: the client
--   acks it unrun, which re-inserts its next occurrence. parked counts the due jobs of paused tasks (a task
--   in KEYS[11], or all when it has the field ""): moved from due to the parked jobs
--   (_lib.lua), not leased, so no claim reads them again until a resume moves them back.
-- Re-sent safely: a claim whose reply is kept under KEYS[6] returns that reply again
--   (same jobs, same leases; nothing written), so a claim that ran but whose reply was
--   lost, re-sent by the client library or by the caller with the same token, cannot
--   lease a second batch and strand the first one until the reaper consumes an attempt.
--   The reply is kept for the lease's length (ARGV[4]); after that the leases it names
--   have expired anyway. An empty claim leases nothing and keeps nothing.
-- First the far index's chunks of slots up to the one after the horizon's move into due
--   (far_promote in _lib.lua; at most about LIMIT ids a call). If some are left, the
--   horizon stops short of the first one's slot, so jobs are still claimed in due order.
-- Errors: TW_FENCED if ARGV[1] is not the shard's current epoch (nothing written).
local FIRST = 15
local due_key, leased_key, done_key = KEYS[1], KEYS[2], KEYS[3]
local err = fence(KEYS[4], ARGV[1])
if err then return err end
if KEYS[7] ~= KEYS[6] then redis.call('DEL', KEYS[7]) end
local kept = redis.call('GET', KEYS[6])
if kept then return kept end
local epoch = tonumber(ARGV[1])
local now = clock_now(KEYS[5], true)
local lease = tonumber(ARGV[4])
local half = ARGV[5] == '1' and '.5' or ''
local horizon = now + tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local left = far_promote(due_key, leased_key, KEYS[8], KEYS[9], KEYS[10], FIRST,
  far_slot(horizon) + FAR_SLOT, limit, KEYS[12])
if left and left <= horizon then horizon = left - 1 end
local hits, removed = nil, 0  -- removed: the first hits are out of due already
if redis.call('EXISTS', KEYS[14]) == 0 then  -- no priorities: due order
  hits = redis.call('ZRANGEBYSCORE', due_key, '-inf', fmt(horizon), 'WITHSCORES', 'LIMIT', 0, limit)
else
  local aging = tonumber(ARGV[6] ~= '' and ARGV[6] or nil) or 60000
  hits, removed = prio_lanes(due_key, KEYS[14], now, horizon, limit, aging)
end
local lims = nil  -- task -> {its keys' name start, conc}: ARGV[7..]
if (ARGV[7] or '') ~= '' then
  lims = {}
  for i = 13, #ARGV, 3 do lims[ARGV[i]] = {ARGV[i + 1], tonumber(ARGV[i + 2])} end
end
if #hits == 0 then return cmsgpack.pack(lims and {now, 0, 0, 0} or {now, 0, 0}) end
if lims then batch_start() end  -- the waiting counts written once at the end
-- The paused tasks: one EXISTS when none is (the common case).
local paused, pause_all = nil, false
if redis.call('EXISTS', KEYS[11]) == 1 then
  paused = {}
  for _, t in ipairs(redis.call('HKEYS', KEYS[11])) do paused[t] = true end
  pause_all = paused[''] == true
end
-- The record of a one-shot job whose last field is its own timeout `to` or, with `ver`
-- (the Postgres mode's row version), whose last fields are the timeout, the priority `pr`
-- and the version, under `epoch` (0: not leased): vals[b - 5 .. b] are its first six
-- fields, the others at their defaults.
local function timed_record(vals, b, epoch, to, pr, ver)
  if ver then
    return cmsgpack.pack(vals[b - 5], vals[b - 4], vals[b - 3], vals[b - 2], vals[b - 1],
      vals[b], epoch, 0, '', 0, 0, 0, '', to, '', '', pr, 0, ver)
  end
  return cmsgpack.pack(vals[b - 5], vals[b - 4], vals[b - 3], vals[b - 2], vals[b - 1],
    vals[b], epoch, 0, '', 0, 0, 0, '', to)
end
local ids, dues = {}, {}
local count = #hits / 2
for k = 1, count do
  ids[k] = hits[2 * k - 1]
  dues[k] = tonumber(hits[2 * k])
end
if removed == 0 then
  bulk('ZREM', due_key, ids)
elseif removed < count then
  local rest = {}
  for k = removed + 1, count do rest[k - removed] = ids[k] end
  bulk('ZREM', due_key, rest)
end
local recs, key_of, index_of = get_records(ids, count, FIRST)
-- Read each record and resolve its occurrence, then look them all up in done at once.
-- A record of at most 6 fields (a one-shot job, not leased, no error: nearly all of
-- them) is read into the flat array `vals` (6 a job) and leased by appending to it
-- (below), with no table of its own and no re-encoding; `short[k]` is its field
-- count (1..6). A one-shot record whose only other field is its own timeout is read
-- so too (`short[k]` = F_TIMEOUT, the timeout in `tos[k]`) and packed again in one
-- call, as is a one-shot record with a version (the Postgres mode: all of its fields,
-- none leased, no error, trace, key or wait: `short[k]` = F_VERSION, the timeout,
-- priority and version in `tos[k]`, `prs[k]`, `vers[k]`). Any other record is decoded
-- into `decoded[k]` and encoded again.
local vals, short, decoded, members, noms, tos = {}, {}, {}, {}, {}, {}
local prs, vers = {}, {}
local mp_unpack, mp_pack, format = cmsgpack.unpack, cmsgpack.pack, string.format
for k = 1, count do
  local s = recs[k]
  local nominal = 0
  if s then
    local t, p, mx, fl, nom, att, ep, rk, rs, po, ca, gr, er, to, tr, ky, pr, wt, ver = mp_unpack(s)
    local n = (ep ~= nil and 7) or (att ~= nil and 6) or (nom ~= nil and 5)
      or (fl ~= nil and 4) or (mx ~= nil and 3) or (p ~= nil and 2) or (t ~= nil and 1) or 0
    if n == 7 and to ~= nil and tr == nil and to ~= 0 and ep == 0 and rk == 0 and rs == ''
      and po == 0 and ca == 0 and gr == 0 and er == '' then
      n = F_TIMEOUT  -- one-shot, no error or trace, a timeout of its own: tos[k]
      tos[k] = to
    elseif ver ~= nil and ver ~= 0 and ep == 0 and rk == 0 and rs == '' and po == 0
      and ca == 0 and gr == 0 and er == '' and tr == '' and ky == '' and wt == 0 then
      n = F_VERSION  -- one-shot with a version: tos[k], prs[k], vers[k]
      tos[k], prs[k], vers[k] = to, pr, ver
    end
    if n >= 1 and (n <= 4 or (n <= 6 and nom ~= 0) or n == F_TIMEOUT or n == F_VERSION) then
      nominal = nom or 0
      if nominal == 0 then nominal = dues[k] end
      local b = 6 * k
      vals[b - 5], vals[b - 4], vals[b - 3] = t, p or DEFAULTS[F_PAYLOAD], mx or DEFAULTS[F_MAX]
      vals[b - 2], vals[b - 1], vals[b] = fl or DEFAULTS[F_FLAGS], nominal, att or DEFAULTS[F_ATTEMPT]
      short[k] = n
    else
      local r = rec_decode(s)
      if r[F_NOMINAL] == 0 then r[F_NOMINAL] = dues[k] end
      wait_end(KEYS[15], r)  -- a flow-limit waiter claimed at its recheck time
      nominal = r[F_NOMINAL]
      decoded[k] = r
    end
  end
  noms[k] = nominal
  members[k] = format('%d', nominal) .. ':' .. ids[k]  -- done_member, inlined
end
local seen = {}
for k = 1, count, CHUNK do
  local part = redis.call('ZMSCORE', done_key, unpack(members, k, math.min(k + CHUNK - 1, count)))
  for j = 1, #part do seen[k + j - 1] = part[j] end
end
-- The permits of the limited jobs (ARGV[7..]): held[k] for a granted one. False: it
-- is leased (granted, or not limited); true: it waits (queued in its key's waiters).
local held, waited, keys_of = {}, 0, {}
local function permit_waits(k, id, due)
  local r, m = decoded[k], short[k]
  local lim = lims[m and vals[6 * k - 5] or r[F_TASK]]
  if not lim or (r and r[F_RKIND] ~= 0) then return false end  -- a recurring job: the gate
  -- A job claimed ahead of its due (the lookahead) takes its permit at the gate, when it
  -- fires: a permit is never held before its job is due, so a key's later claims of
  -- jobs due sooner are not kept waiting behind it, and a permit outlives its holder's
  -- death by one lease at most.
  if due > now then return false end
  if not LIM.now then lim_start() end
  local name = lim[1] .. (r and r[F_KEY] or '')
  local ks = keys_of[name]
  if not ks then
    local tag = ARGV[10] .. string.sub(redis.sha1hex(name), 1, 8) .. '}'
    ks = {tag .. ':p:' .. name, tag .. ':h:' .. name, tag .. ':q:' .. name,
      tag .. ':s:' .. name, tag .. ':b:' .. name}
    keys_of[name] = ks
  end
  local holder = ARGV[1] .. ':' .. format('%d', m and vals[6 * k] or r[F_ATTEMPT])
  local code = lim_acquire(ks[1], ks[2], ks[3], ks[4], ks[5], ARGV[9] .. '|' .. id, holder,
    lim[2], 0, 0, tonumber(ARGV[7]), '')
  if code == 1 then
    held[k] = true
    return false
  end
  return true
end
local out = lims and {now, 0, 0, 0} or {now, 0, 0}
local n, nz = #out, 0
local parked, pz, px = 0, {}, {}
local dropped = 0
local gone, hset, zadd = {}, {}, {}
local tails = rec_tails(epoch)
local last_deadline, sdeadline = nil, nil
for k = 1, count do
  local id = ids[k]
  local r, m = decoded[k], short[k]
  if not (r or m) then
    dropped = dropped + 1  -- an index entry without a record: nothing to run
  elseif seen[k] and (m or r[F_RKIND] == 0) then
    dropped = dropped + 1
    buffer(gone, key_of[k], id)
  elseif paused and (pause_all or paused[m and vals[6 * k - 5] or r[F_TASK]]) then
    -- Parked: its nominal made explicit (a 0 resolves against the due score).
    local due = dues[k]
    if not m then
      buffer(hset, key_of[k], id, rec_encode(r))
    elseif m <= 4 then
      buffer(hset, key_of[k], id, rec_with_nominal(recs[k], noms[k]))
    elseif m == F_TIMEOUT or m == F_VERSION then
      buffer(hset, key_of[k], id, timed_record(vals, 6 * k, 0, tos[k], prs[k], vers[k]))
    end
    parked = parked + 1
    pz[2 * parked - 1], pz[2 * parked] = fmt(due), id
    px[2 * parked - 1], px[2 * parked] = '0', park_member(m and vals[6 * k - 5] or r[F_TASK], due, id)
  elseif lims and permit_waits(k, id, dues[k]) then
    -- Over its key's limit: given back unleased, to wait for a permit (waits.lua 'w').
    local r = decoded[k]
    if not r then
      r = rec_decode(recs[k])
      r[F_NOMINAL] = noms[k]
    end
    if BATCH.nowakes == nil then  -- the wakes kept, looked at once a call
      redis.call('ZREMRANGEBYSCORE', ARGV[11], '-inf', '(' .. fmt(now))
      BATCH.nowakes = redis.call('EXISTS', ARGV[11]) == 0
    end
    limit_wait(nil, due_key, KEYS[14], KEYS[15], ARGV[11], ARGV[12], key_of[k], id, r, now,
      tonumber(ARGV[8]), true)
    waited = waited + 1
  else
    local due = dues[k]
    local deadline = (due > now and due or now) + lease
    if deadline ~= last_deadline then
      last_deadline, sdeadline = deadline, fmt(deadline) .. half
    end
    zadd[nz + 1], zadd[nz + 2] = sdeadline, id
    nz = nz + 2
    out[n + 1], out[n + 2], out[n + 3] = id, due, deadline
    out[n + 4] = (seen[k] and 1 or 0) + (held[k] and 2 or 0) + 4 * index_of[k]
    if m then
      local b = 6 * k
      -- Leased by appending (rec_tails): the defaults it lacks before the nominal, the
      -- nominal, the attempt and the epoch; or, when it has the nominal (m = 5) or the
      -- attempt too (m = 6), what follows them.
      -- A record with a timeout of its own (m = F_TIMEOUT) is packed again whole (one
      -- call, no table); its row is the short one and the timeout (7 fields).
      local leased
      if m <= 4 then
        leased = recs[k] .. (m <= 3 and tails[m] or '') .. mp_pack(vals[b - 1]) .. tails[4]
      elseif m <= 6 then
        leased = recs[k] .. (m == 5 and tails[4] or tails[5])
      else
        leased = timed_record(vals, b, epoch, tos[k], prs[k], vers[k])
      end
      buffer(hset, key_of[k], id, leased)
      out[n + 6], out[n + 7], out[n + 8] = vals[b - 5], vals[b - 4], vals[b - 3]
      out[n + 9], out[n + 10], out[n + 11] = vals[b - 2], vals[b - 1], vals[b]
      if m == F_TIMEOUT then
        out[n + 5], out[n + 12] = F_ATTEMPT + 1, tos[k]
        n = n + 12
      elseif m == F_VERSION then
        out[n + 5], out[n + 12], out[n + 13] = F_ATTEMPT + 2, tos[k], vers[k]
        n = n + 13
      else
        out[n + 5] = F_ATTEMPT
        n = n + 11
      end
    else
      r[F_EPOCH] = epoch
      buffer(hset, key_of[k], id, rec_encode(r))
      local count = (r[F_RKIND] == 0 and r[F_ERROR] == '' and r[F_TIMEOUT] == 0
        and r[F_TRACE] == '' and r[F_KEY] == '' and r[F_VERSION] == 0) and F_ATTEMPT
        or NFIELDS
      out[n + 5] = count
      n = n + 5
      for i = 1, count do out[n + i] = r[i] end
      n = n + count
    end
  end
end
flush('HDEL', gone)
flush('HSET', hset)
if nz > 0 then bulk('ZADD', leased_key, zadd) end
if parked > 0 then
  bulk('ZADD', KEYS[12], pz)
  bulk('ZADD', KEYS[13], px)
end
out[2], out[3] = dropped, parked
if lims then
  out[4] = waited
  counts_flush(KEYS[15])
end
local packed = cmsgpack.pack(out)
if nz > 0 then redis.call('SET', KEYS[6], packed, 'PX', lease) end
return packed
