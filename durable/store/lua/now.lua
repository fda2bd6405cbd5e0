-- now.lua: the shard's "now" (ms) without advancing its clock.
-- KEYS[1]  {ns:s}:clock
-- Returns: max(TIME, clock) in ms.
-- Errors: none.
return clock_now(KEYS[1], false)
