-- 0011: tickwheel_ack as three set statements instead of two statements per job.
--
-- Same signature, same results (1 acked, 2 acked and moved to its next occurrence, 3 done
-- already, 4 acked but the row had moved on), same rows written, same lock order
-- (the ids' advisory locks shared, in the caller's order, then each acked job's row, in
-- the caller's order), so workers of the previous release get the new body too, and
-- rows written before this migration are acked as before: nothing in the tables changes.
--
-- Why. 0003's body ran an INSERT and an UPDATE per job in a plpgsql loop. Measured on
-- an ack of 100 fresh rows (fsync and synchronous_commit on, alternated, medians): the
-- loop 4.9-5.2 ms a call, this body 3.0-3.3 ms. The writes are the same; what goes is
-- one executor start-up (and plan-cache lookup) per statement, 200 of them.
--
-- How, and why not a plain join. Each step is planner-proof on a table never analyzed
-- (0010's lesson: an `id = ANY(array)` or a join against the ids read a whole
-- namespace there):
--   1. the done rows, one INSERT ... ON CONFLICT DO NOTHING over the batch (a unique-key
--      probe per row, whatever the statistics); RETURNING names the ids that were new;
--   2. the job rows of those ids, locked by one primary-key lookup per id (a LATERAL
--      subquery with FOR UPDATE: never flattened into a join) in the caller's order,
--      tested with 0003's CASE (state pending, due_ms the acked occurrence) after the
--      lock, as the loop's UPDATE tested it; their ctids are kept;
--   3. one UPDATE of exactly those ctids (a TID scan), in a later statement, so that
--      its snapshot sees the row version step 2 locked (one committed by another
--      transaction while step 2 waited is visible only to a later statement).
-- A batch that names an id twice (two occurrences of one recurring job) runs the loop
-- of 0003 (tickwheel_ack_each below): there the second occurrence must see the row the
-- first one moved, which one UPDATE cannot do.

-- 0003's loop, for a batch naming an id twice. The caller holds the fence and the
-- ids' advisory locks.
CREATE FUNCTION tickwheel_ack_each(
    p_ns text, p_epoch bigint, p_ids text[], p_attempts integer[], p_nominals bigint[],
    p_nexts bigint[])
RETURNS integer[]
LANGUAGE plpgsql AS $$
DECLARE
    v_out integer[] := '{}';
    v_n   integer;
BEGIN
    FOR k IN 1 .. coalesce(array_length(p_ids, 1), 0) LOOP
        INSERT INTO tickwheel_done (ns, id, nominal_ms, epoch, attempt)
        VALUES (p_ns, p_ids[k], p_nominals[k], p_epoch, p_attempts[k])
        ON CONFLICT DO NOTHING;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        IF v_n = 0 THEN
            v_out := v_out || 3;
            CONTINUE;
        END IF;
        IF p_nexts[k] > 0 THEN
            UPDATE tickwheel_jobs j SET due_ms = p_nexts[k], attempt = 1, run_ms = 0,
                epoch = p_epoch, updated_at = now()
            WHERE j.ns = p_ns AND j.id = p_ids[k]
              AND CASE WHEN j.state <> 0 THEN false ELSE j.due_ms = p_nominals[k] END;
        ELSE
            UPDATE tickwheel_jobs j SET state = 1, attempt = p_attempts[k], run_ms = 0,
                epoch = p_epoch, updated_at = now()
            WHERE j.ns = p_ns AND j.id = p_ids[k]
              AND CASE WHEN j.state <> 0 THEN false ELSE j.due_ms = p_nominals[k] END;
        END IF;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        v_out := v_out || CASE WHEN v_n = 0 THEN 4 WHEN p_nexts[k] > 0 THEN 2 ELSE 1 END;
    END LOOP;
    RETURN v_out;
END
$$;

CREATE OR REPLACE FUNCTION tickwheel_ack(
    p_ns text, p_shard integer, p_epoch bigint, p_ids text[], p_attempts integer[],
    p_nominals bigint[], p_nexts bigint[])
RETURNS integer[]
LANGUAGE plpgsql AS $$
DECLARE
    v_n    integer := coalesce(array_length(p_ids, 1), 0);
    v_new  text[];    -- the ids whose done row this call inserted
    v_newks integer[]; -- their positions
    v_ks   integer[]; -- those whose job row is at the acked occurrence
    v_tids tid[];     -- and those rows, locked
    v_up   integer[]; -- the positions whose row was updated
    v_out  integer[];
BEGIN
    PERFORM tickwheel_fence(p_ns, p_shard, p_epoch);
    PERFORM pg_advisory_xact_lock_shared(hashtextextended(p_ns || ':' || u.id, 0))
        FROM unnest(p_ids) AS u(id);
    IF v_n = 0 THEN
        RETURN '{}';
    END IF;
    IF (SELECT count(DISTINCT u.id) FROM unnest(p_ids) AS u(id)) < v_n THEN
        RETURN tickwheel_ack_each(p_ns, p_epoch, p_ids, p_attempts, p_nominals, p_nexts);
    END IF;
    WITH ins AS (
        INSERT INTO tickwheel_done (ns, id, nominal_ms, epoch, attempt)
        SELECT p_ns, u.id, u.nominal, p_epoch, u.attempt
        FROM unnest(p_ids, p_nominals, p_attempts) WITH ORDINALITY AS u(id, nominal, attempt, k)
        ORDER BY u.k
        ON CONFLICT DO NOTHING
        RETURNING tickwheel_done.id
    )
    SELECT array_agg(ins.id) INTO v_new FROM ins;
    IF v_new IS NULL THEN
        RETURN array_fill(3, ARRAY[v_n]);
    END IF;
    -- Their positions: a GROUP BY over both lists (never a loop of one over the other).
    SELECT array_agg(s.k ORDER BY s.k) INTO v_newks
    FROM (SELECT max(a.k) AS k
          FROM (SELECT u.id, u.k::integer AS k FROM unnest(p_ids) WITH ORDINALITY AS u(id, k)
                UNION ALL
                SELECT n.id, NULL FROM unnest(v_new) AS n(id)) AS a
          GROUP BY a.id HAVING count(*) > 1) AS s;
    SELECT array_agg(n.k ORDER BY n.k), array_agg(x.ctid ORDER BY n.k) INTO v_ks, v_tids
    FROM unnest(v_newks) AS n(k),
        LATERAL (SELECT j.ctid FROM tickwheel_jobs j
                 WHERE j.ns = p_ns AND j.id = p_ids[n.k]
                   AND CASE WHEN j.state <> 0 THEN false
                            ELSE j.due_ms = p_nominals[n.k] END
                 FOR UPDATE) AS x;
    IF v_tids IS NOT NULL THEN
        WITH up AS (
            UPDATE tickwheel_jobs j
            SET state = CASE WHEN p_nexts[t.k] > 0 THEN 0 ELSE 1 END,
                due_ms = CASE WHEN p_nexts[t.k] > 0 THEN p_nexts[t.k] ELSE j.due_ms END,
                attempt = CASE WHEN p_nexts[t.k] > 0 THEN 1 ELSE p_attempts[t.k] END,
                run_ms = 0, epoch = p_epoch, updated_at = now()
            FROM unnest(v_tids, v_ks) AS t(tid, k)
            WHERE j.ctid = ANY(v_tids) AND j.ctid = t.tid
            RETURNING t.k
        )
        SELECT array_agg(up.k) INTO v_up FROM up;
    END IF;
    SELECT array_agg(CASE WHEN NOT g.new THEN 3 WHEN NOT g.up THEN 4
                          WHEN p_nexts[g.k] > 0 THEN 2 ELSE 1 END ORDER BY g.k)
    INTO v_out
    FROM (SELECT a.k, bool_or(a.new) AS new, bool_or(a.up) AS up
          FROM (SELECT k, false AS new, false AS up FROM generate_series(1, v_n) AS k
                UNION ALL
                SELECT k, true, false FROM unnest(v_newks) AS k
                UNION ALL
                SELECT k, true, true FROM unnest(v_up) AS k) AS a
          GROUP BY a.k) AS g;
    RETURN v_out;
END
$$;
