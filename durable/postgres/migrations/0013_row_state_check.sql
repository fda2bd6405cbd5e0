-- 0013: a claimed entry behind its row's state is stale, whatever its version.
--
-- A late index write (the write behind a `schedule`, a relay's write, held long) is
-- schedule.lua with replace off: it creates an entry only where Redis has none. Retries,
-- reaper returns, dead letters, a recurring job's ack and the claim's missed-run move
-- keep the row's version (0012), so after a Redis loss such a write landed at that
-- version and brought the job back as first written: attempt 1 at its nominal due. A
-- job retried to attempt 2 with a backoff ran again at once as attempt 1; a dead job
-- ran, and its ack was accepted: more runs than max_attempts.
--
-- tickwheel_claim_check with a seventh argument (the claimed entries' attempts) also
-- names as gone, among the claimed entries that are not done already and not newer
-- than their row (version 0, or the row's own), those whose row
--   - is not pending (dead, or done at another occurrence), or
--   - is at a later occurrence (due_ms above the entry's nominal: a recurring ack or a
--     missed-run move, both decided in PostgreSQL first), or
--   - is at the same occurrence at a higher attempt (a retry or a reaper return, both
--     decided in PostgreSQL first).
-- The worker removes them unrun, as the stale versions of 0012, and hands a pending row
-- to the relays, which now write it from its state (attempt, run time), as reconcile
-- does: so the entry they write passes this check, and nothing loops.
--
-- Never stale by these rules: an entry of a higher version than its row (Redis ahead:
-- a reschedule or replace whose commit failed runs as Redis has it), an entry ahead of
-- its row (a higher attempt, a later occurrence: PostgreSQL never decides these after
-- Redis, except for writers of the previous release), and an occurrence done already
-- (acked unrun, as before).
--
-- Same key lookup per id as 0012's body, which this one restates: the row's state,
-- due, attempt and version are read from the tuple its primary-key lookup finds. An
-- occurrence done already is reported done, not stale (its entry is acked unrun, as
-- before): the stale positions less the done ones, a hashed EXCEPT, only when a claim
-- has both. Measured against the six-argument function (bench/probes/pg_claim_check.py):
-- see docs/postgres.md. The five- and six-argument functions stay as they are, for
-- workers of the previous release.

CREATE FUNCTION tickwheel_claim_check(
    p_ns text, p_shard integer, p_epoch bigint, p_ids text[], p_nominals bigint[],
    p_versions bigint[], p_attempts integer[])
RETURNS TABLE (pos integer, gone boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_done    integer[];
    v_missing text[];
    v_stale   bigint[];
BEGIN
    -- The epoch, and the occurrences done already, as tickwheel_claimed() has them.
    SELECT array_agg(c.pos) INTO v_done
        FROM tickwheel_claimed(p_ns, p_shard, p_epoch, p_ids, p_nominals) AS c(pos);
    -- One key lookup per id (0010): the ids with no row, and the entries behind their
    -- row (stale: taken out unrun as the gone ones are).
    SELECT array_agg(c.id ORDER BY c.id COLLATE "C") FILTER (WHERE x.version IS NULL),
           array_agg(c.k) FILTER (
               WHERE (c.ver > 0 AND c.ver < x.version)
                   OR ((c.ver = 0 OR c.ver = x.version) AND (
                       x.state <> 0
                       OR x.due_ms > c.nominal
                       OR (x.due_ms = c.nominal AND x.attempt > c.att))))
        INTO v_missing, v_stale
        FROM unnest(p_ids, p_nominals, p_versions, p_attempts) WITH ORDINALITY
             AS c(id, nominal, ver, att, k)
        LEFT JOIN LATERAL (SELECT j.version, j.state, j.due_ms, j.attempt
                           FROM tickwheel_jobs j
                           WHERE j.ns = p_ns AND j.id = c.id OFFSET 0) AS x ON true;
    IF v_done IS NOT NULL THEN
        RETURN QUERY SELECT d.pos, false FROM unnest(v_done) AS d(pos);
        IF v_stale IS NOT NULL THEN  -- done wins: acked unrun (a hashed EXCEPT)
            SELECT array_agg(s.k) INTO v_stale
                FROM (SELECT unnest(v_stale) EXCEPT SELECT unnest(v_done)) AS s(k);
        END IF;
    END IF;
    IF v_stale IS NOT NULL THEN
        RETURN QUERY SELECT s.k::integer, true FROM unnest(v_stale) AS s(k);
    END IF;
    IF v_missing IS NULL THEN
        RETURN;
    END IF;
    -- Wait for a replace (or cancel) of these ids that is still committing (0006).
    PERFORM pg_advisory_xact_lock_shared(hashtextextended(p_ns || ':' || m.id, 0))
        FROM unnest(v_missing) AS m(id);
    -- A statement of its own: it sees what those transactions committed.
    RETURN QUERY
        SELECT c.k::integer, true
        FROM unnest(p_ids) WITH ORDINALITY AS c(id, k)
        LEFT JOIN LATERAL (SELECT 1 AS hit FROM tickwheel_jobs j
                           WHERE j.ns = p_ns AND j.id = c.id OFFSET 0) AS x ON true
        WHERE c.id = ANY (v_missing) AND x.hit IS NULL;
END
$$;
