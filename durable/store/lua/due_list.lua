-- due_list.lua: a page of one shard's scheduled jobs in due order (read only): those
-- in due first, then those of the far index (all due later, see _lib.lua).
-- KEYS[1] due  KEYS[2] leased  KEYS[3] dead  KEYS[4] far  KEYS[5] faro
-- KEYS[6..] jobs buckets (all of the shard's, in order)
-- ARGV[1]  offset
-- ARGV[2]  count
-- Returns: {total, then per job: id, due, field_1 .. field_14} (16 values per job).
--   A page that reaches into the far index reads it from its start: O(offset).
-- Errors: TW_TOOMANY when that would read more than FAR_WALK far entries.
local FIRST = 5
local due_key = KEYS[1]
local offset, count = tonumber(ARGV[1]), tonumber(ARGV[2])
local near = redis.call('ZCARD', due_key)
local out = {near + far_count(due_key, KEYS[2], KEYS[3], FIRST)}
local n, rows = 1, 0
if offset < near then
  local hits = redis.call('ZRANGE', due_key, offset, offset + count - 1, 'WITHSCORES')
  n, rows = page_rows(out, n, hits, FIRST)
end
if rows < count then
  local skip = math.max(0, offset - near)
  far_walk(due_key, KEYS[2], KEYS[3], KEYS[4], KEYS[5], FIRST, nil, function(id, due, r)
    if skip > 0 then
      skip = skip - 1
      return false
    end
    out[n + 1], out[n + 2] = id, due
    n = rec_row(out, n + 2, r, due)
    rows = rows + 1
    return rows >= count
  end)
end
return out
