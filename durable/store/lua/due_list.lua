-- due_list.lua: a page of one shard's scheduled jobs (read only): the parked ones (due
-- jobs of paused tasks, see _lib.lua) first, then those in due, then those of the far
-- index (all due later, see _lib.lua); each part in due order.
-- KEYS[1] due  KEYS[2] leased  KEYS[3] dead  KEYS[4] far  KEYS[5] faro  KEYS[6] parked
-- KEYS[7] waiting  HASH task -> jobs waiting for their flow key: those waiting for a
--   permit are in no index, so neither in the total nor on a page
-- KEYS[8..] jobs buckets (all of the shard's, in order)
-- ARGV[1]  offset
-- ARGV[2]  count
-- Returns: {total, then per job: id, due, field_1 .. field_18} (20 values per job).
--   A page that reaches into the far index reads it from its start: O(offset).
-- Errors: TW_TOOMANY when that would read more than FAR_WALK far entries.
local FIRST = 7
local due_key, parked_key = KEYS[1], KEYS[6]
local offset, count = tonumber(ARGV[1]), tonumber(ARGV[2])
local held = redis.call('ZCARD', parked_key)
local near = redis.call('ZCARD', due_key)
local out = {held + near + far_count(due_key, KEYS[2], KEYS[3], FIRST, parked_key, KEYS[7])}
local n, rows = 1, 0
if offset < held then
  local hits = redis.call('ZRANGE', parked_key, offset, offset + count - 1, 'WITHSCORES')
  n, rows = page_rows(out, n, hits, FIRST)
end
local from = math.max(0, offset - held)
if rows < count and from < near then
  local hits = redis.call('ZRANGE', due_key, from, from + count - rows - 1, 'WITHSCORES')
  local more
  n, more = page_rows(out, n, hits, FIRST)
  rows = rows + more
end
if rows < count then
  local skip = math.max(0, offset - held - near)
  far_walk(due_key, KEYS[2], KEYS[3], KEYS[4], KEYS[5], FIRST, nil, function(id, due, r)
    if skip > 0 then
      skip = skip - 1
      return false
    end
    out[n + 1], out[n + 2] = id, due
    n = rec_row(out, n + 2, r, due)
    rows = rows + 1
    return rows >= count
  end, parked_key)
end
return out
