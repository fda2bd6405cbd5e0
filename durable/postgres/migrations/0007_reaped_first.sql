-- 0007: the reaper's returns are decided in PostgreSQL before Redis makes them.
--
-- An expired lease whose run started comes back at attempt + 1 (or dies after its last
-- attempt). Until now only Redis recorded that, so after a Redis loss a reconcile
-- brought the occurrence back at the attempt PostgreSQL last had, and a job whose
-- worker was killed again and again could run more than max_attempts times. The
-- reaper now reads the expired leases first (reap.lua, looking only), records here
-- what it is about to do, then reaps. A lease that an ack or a retry took meanwhile is
-- not reaped, and PostgreSQL is then at most one attempt ahead: never behind.
--
-- tickwheel_reaped(): per lease k, under the caller's epoch, checked as
-- tickwheel_claimed checks it (a new owner reaps before its first claim: a higher epoch
-- is recorded, a lower one refused), in one round trip, ids in code point order as every
-- writer locks them (0003):
--   p_dead[k] false: occurrence p_nominals[k] runs next as attempt p_attempts[k] from
--     p_run (tickwheel_retried: only the current occurrence, the attempt never goes down);
--   p_dead[k] true: it died at attempt p_attempts[k] (tickwheel_dead).
CREATE FUNCTION tickwheel_reaped(
    p_ns text, p_shard integer, p_epoch bigint, p_ids text[], p_nominals bigint[],
    p_attempts integer[], p_dead boolean[], p_run bigint)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM * FROM tickwheel_claimed(p_ns, p_shard, p_epoch, '{}', '{}');
    FOR k IN 1 .. coalesce(array_length(p_ids, 1), 0) LOOP
        IF p_dead[k] THEN
            PERFORM tickwheel_dead(p_ns, p_shard, p_epoch, p_ids[k], p_attempts[k],
                                   p_nominals[k]);
        ELSE
            PERFORM tickwheel_retried(p_ns, p_shard, p_epoch, p_ids[k], p_nominals[k],
                                      p_attempts[k], p_run);
        END IF;
    END LOOP;
END
$$;
