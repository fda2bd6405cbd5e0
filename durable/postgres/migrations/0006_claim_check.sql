-- 0006: a claimed job that has no row in PostgreSQL is not run.
--
-- PostgreSQL wins every disagreement, but a claim only asked it which occurrences were
-- done. A job can reach Redis after its row was deleted by a cancel:
--   - the producer writes Redis after its commit, and the cancel came in between (it
--     found the row, deleted it, and found nothing in Redis yet);
--   - a reconcile read the row, then the cancel ran, then the reconcile wrote Redis.
-- The job then ran although the cancel had returned True.
--
-- tickwheel_claim_check() calls tickwheel_claimed() (0001), then also names the claimed
-- ids with no row at all: the worker takes those out of Redis unrun. One id has a row
-- only later than its Redis entry on purpose: a replace of a new id writes Redis inside
-- a transaction that holds the id's advisory lock, and commits the row after. So an id
-- found without a row is looked at again once its advisory lock is free (taken shared,
-- in code point order as every holder takes them): a replace still committing is
-- waited for, and its row is then seen.
--
-- Rows kept are untouched: a done occurrence still has its row (state 1), and is
-- reported done as before. tickwheel_claimed() stays for workers of the previous
-- release.

CREATE FUNCTION tickwheel_claim_check(
    p_ns text, p_shard integer, p_epoch bigint, p_ids text[], p_nominals bigint[])
RETURNS TABLE (pos integer, gone boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_missing text[];
BEGIN
    -- The epoch, and the occurrences done already, as tickwheel_claimed() (0001) has them.
    RETURN QUERY
        SELECT c.pos, false
        FROM tickwheel_claimed(p_ns, p_shard, p_epoch, p_ids, p_nominals) AS c(pos);
    SELECT array_agg(c.id ORDER BY c.id COLLATE "C") INTO v_missing
        FROM unnest(p_ids) AS c(id)
        WHERE NOT EXISTS (SELECT 1 FROM tickwheel_jobs j WHERE j.ns = p_ns AND j.id = c.id);
    IF v_missing IS NULL THEN
        RETURN;
    END IF;
    -- Wait for a replace (or cancel) of these ids that is still committing.
    PERFORM pg_advisory_xact_lock_shared(hashtextextended(p_ns || ':' || m.id, 0))
        FROM unnest(v_missing) AS m(id);
    -- A statement of its own: it sees what those transactions committed.
    RETURN QUERY
        SELECT c.k::integer, true
        FROM unnest(p_ids) WITH ORDINALITY AS c(id, k)
        WHERE c.id = ANY (v_missing)
          AND NOT EXISTS (SELECT 1 FROM tickwheel_jobs j WHERE j.ns = p_ns AND j.id = c.id);
END
$$;
