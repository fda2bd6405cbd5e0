-- ack.lua: complete leased jobs of one shard; record each occurrence in done.
-- KEYS[1] leased  KEYS[2] due  KEYS[3] done  KEYS[4] epoch  KEYS[5] clock  KEYS[6] far
-- KEYS[7] faro  KEYS[8] prio  the priority index (_lib.lua: prio_add)
-- KEYS[9] trail  HASH id -> a pending trailing run (flow.lua), created here
-- KEYS[10..] jobs buckets (all of the shard's, in order)
-- ARGV[1]  epoch      the caller's fencing epoch for this shard
-- ARGV[2]  keep       ms: done entries older than this are trimmed
-- ARGV[3]  batch      msgpack array, 5 values per job: id, attempt, nominal, next, bucket
--   (the lease is (epoch, attempt, nominal); next: the next occurrence's due in ms for a
--   recurring job, computed by the client from the nominal due; 0 = none; bucket: the
--   index from 0 among KEYS[10..] of the id's record hash, as claim.lua returned it, so
--   the id is not hashed again here)
-- Returns: {status_1 .. status_n}: 1 acked and removed, 2 acked and re-inserted at
--   next (in due, or in the far index when next is that far off), 0 lease lost (not
--   leased, or leased under another epoch, attempt or nominal),
--   3 the occurrence is in done already: an ack of it ran before (a re-send of this
--   one whose first reply was lost, or another holder's), so nothing is left to do.
--   A lost lease still records the occurrence in done: the handler did run, so a copy
--   of it waiting in due (reaped after the lease expired) is dropped at its claim
--   instead of running a second time.
-- A one-shot job acked (status 1) with a trailing run pending (flow.lua: a debounced or
--   throttled schedule of its id while it ran) is created again at once, in due, with
--   that schedule's record: throttle at max(now, the id's last throttled due + window),
--   debounce at now + window, no later than the first such call + max_wait; its flow
--   key ({ns:s}:thr:<id> or deb:<id>, built from KEYS[9]'s name: same hash tag, same
--   slot; the one key here no caller names, as the pending run names its id only) set
--   as flow.lua sets it. A recurring job's (status 2) pending run is dropped.
--   One EXISTS when none is pending (the common case).
-- Errors: TW_FENCED if ARGV[1] is not the shard's current epoch, TW_BADARG for a bucket
--   index out of range (nothing written either way).
local FIRST = 9
local leased_key, due_key, done_key = KEYS[1], KEYS[2], KEYS[3]
local err = fence(KEYS[4], ARGV[1])
if err then return err end
local epoch = tonumber(ARGV[1])
local items = cmsgpack.unpack(ARGV[3])
local count = #items / 5
local ids, given = {}, {}
for k = 1, count do
  ids[k] = items[5 * k - 4]
  given[k] = items[5 * k]
end
local recs, key_of = get_records(ids, count, FIRST, given)
local now = clock_now(KEYS[5], true)
redis.call('ZREMRANGEBYSCORE', done_key, '-inf', '(' .. fmt(now - tonumber(ARGV[2])))
-- A record carries a lease epoch exactly while its id is in leased (every script that
-- takes an id out of leased deletes its record or zeroes the epoch in the same call;
-- tests/durable_support.py's check_shard asserts it after each test): so a record
-- leased under the caller's epoch is in leased, and leased is not read here (a
-- ZMSCORE: 5k Redis instructions a job, callgrind).
local out = {}
local unlease, del, done, hset, zadd = {}, {}, {}, {}, {}
local slots, by_slot = {}, {}
local nu, nn, nz = 0, 0, 0
local acked = {}
local snow = fmt(now)
local mp_unpack, format = cmsgpack.unpack, string.format
for k = 1, count do
  local id = ids[k]
  local status = 0
  if recs[k] and not acked[id] then
    -- The lease's fields read into locals (no table: holds() on rec_decode, unrolled);
    -- a recurring job going on to its next occurrence is decoded in full below.
    local _, _, _, _, nom, att, ep, rkind = mp_unpack(recs[k])
    local nominal = items[5 * k - 2]
    if ep == epoch and (att or DEFAULTS[F_ATTEMPT]) == items[5 * k - 3]
        and (nom or DEFAULTS[F_NOMINAL]) == nominal then
      local nxt = items[5 * k - 1]
      nu = nu + 1
      unlease[nu] = id
      done[nn + 1], done[nn + 2] = snow, format('%d', nominal) .. ':' .. id  -- done_member
      nn = nn + 2
      if nxt > 0 and (rkind or DEFAULTS[F_RKIND]) ~= 0 then
        local r = rec_decode(recs[k])
        r[F_NOMINAL], r[F_ATTEMPT], r[F_EPOCH], r[F_ERROR] = 0, 1, 0, ''
        if goes_far(now, nxt) then
          r[F_NOMINAL] = nxt
          far_group(slots, by_slot, nxt, id)
        else
          zadd[nz + 1], zadd[nz + 2] = fmt(nxt), id
          nz = nz + 2
        end
        buffer(hset, key_of[k], id, rec_encode(r))
        prio_add(KEYS[8], id, nxt, r[F_PRIORITY])
        status = 2
      else
        buffer(del, key_of[k], id)
        status = 1
      end
      acked[id] = true  -- a repeated id in this call is lost the second time
    end
  end
  if status == 0 and not acked[id] then
    local member = done_member(items[5 * k - 2], id)
    -- Recorded done already: this ack (or a re-send of it) ran before; say so.
    if redis.call('ZSCORE', done_key, member) then status = 3 end
    done[nn + 1], done[nn + 2] = snow, member
    nn = nn + 2
  end
  out[k] = status
end
if nu > 0 then bulk('ZREM', leased_key, unlease) end
flush('HDEL', del)
if nn > 0 then bulk('ZADD', done_key, done) end
flush('HSET', hset)
if nu > 0 and redis.call('EXISTS', KEYS[9]) == 1 then
  local tag = string.sub(KEYS[9], 1, -6)  -- '{ns:s}:' of '{ns:s}:trail'
  for k = 1, count do
    local id = ids[k]
    local pending = (out[k] == 1 or out[k] == 2) and redis.call('HGET', KEYS[9], id)
    if pending then
      redis.call('HDEL', KEYS[9], id)
      if out[k] == 1 then
        local kind, window, max_wait, rec, p, first = cmsgpack.unpack(pending)
        local due = now + window
        local flow_key = tag .. (kind == 't' and 'thr:' or 'deb:') .. id
        if kind == 't' then
          local last = tonumber(redis.call('GET', flow_key))
          due = now
          if last and last + window > due then due = last + window end
          redis.call('SET', flow_key, fmt(due), 'PX', fmt(due - now + window))
        elseif max_wait > 0 then
          local deadline = math.max(first + max_wait, now)
          if due > deadline then due = deadline end
          redis.call('SET', flow_key, fmt(deadline), 'PX', fmt(deadline - now + window))
        else
          redis.call('DEL', flow_key)
        end
        redis.call('HSET', key_of[k], id, rec)
        zadd[nz + 1], zadd[nz + 2] = fmt(due), id
        nz = nz + 2
        prio_add(KEYS[8], id, due, p)
      end
    end
  end
end
if nz > 0 then bulk('ZADD', due_key, zadd) end
far_push(KEYS[6], KEYS[7], slots, by_slot)
return out
