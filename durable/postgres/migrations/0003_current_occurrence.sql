-- 0003: an ack, a retry or an end state changes the job row only when the occurrence it
-- names is the row's current one, and waits for a replace or reschedule of the same id
-- that is still committing.
--
-- Two gaps of 0002, where the row needed due_ms = the acked occurrence:
--
-- 1. A recurring job is moved forward by Redis alone, by its missed-run policy (once or
--    skip): the occurrence a worker claims can be later than the row's due_ms. 0002 then
--    left the row behind for good, and after a Redis loss reconcile brought back an
--    occurrence long past. Now a recurring row at or before the acked occurrence is its
--    current one and catches up to it.
-- 2. replace and reschedule change Redis inside a PostgreSQL transaction that holds the
--    id's advisory lock (PgStore.locked), and write the row just before their commit. A
--    worker could claim the new occurrence and ack it in between: its ack found the old
--    due_ms, wrote the done row and left the row pending at an occurrence already done.
--    Now every ack, retry and end state takes the id's advisory lock, shared, before it
--    looks at the row: it waits for such a transaction and sees what it wrote.
--
-- Lock order. PgStore.locked takes its advisory locks (exclusive), then its row locks,
-- each in id order. tickwheel_current takes the advisory lock (shared) before the row
-- lock of each id, and PgStore.ack sends its ids in id order. A transaction holding an
-- id's row lock therefore holds its advisory lock too, so no cycle can form between the
-- two.
--
-- Workers of the previous release keep working against this schema: the functions keep
-- their signatures, and tickwheel_ack still returns 1, 2 or 3 per job (and 4, below).

-- Hold job p_id for the caller's transaction (its advisory lock shared, then its row)
-- and return true if occurrence p_nominal is the row's current one: the row is pending
-- and its due_ms is p_nominal or, for a recurring job, before it.
CREATE FUNCTION tickwheel_current(p_ns text, p_id text, p_nominal bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtextextended(p_ns || ':' || p_id, 0));
    PERFORM 1 FROM tickwheel_jobs j
        WHERE j.ns = p_ns AND j.id = p_id AND j.state = 0
          AND (j.due_ms = p_nominal OR (j.rkind <> 0 AND j.due_ms < p_nominal))
        FOR UPDATE;
    RETURN FOUND;
END
$$;

-- Returns per job: 1 acked, 2 acked and moved to its next occurrence, 3 done already (a
-- re-send), 4 acked, but the row had moved on to another occurrence (left as it is).
CREATE OR REPLACE FUNCTION tickwheel_ack(
    p_ns text, p_shard integer, p_epoch bigint, p_ids text[], p_attempts integer[],
    p_nominals bigint[], p_nexts bigint[])
RETURNS integer[]
LANGUAGE plpgsql AS $$
DECLARE
    v_out integer[] := '{}';
    v_n   integer;
BEGIN
    PERFORM tickwheel_fence(p_ns, p_shard, p_epoch);
    FOR k IN 1 .. coalesce(array_length(p_ids, 1), 0) LOOP
        INSERT INTO tickwheel_done (ns, id, nominal_ms, epoch, attempt)
        VALUES (p_ns, p_ids[k], p_nominals[k], p_epoch, p_attempts[k])
        ON CONFLICT DO NOTHING;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        IF v_n = 0 THEN
            v_out := v_out || 3;
        ELSIF NOT tickwheel_current(p_ns, p_ids[k], p_nominals[k]) THEN
            v_out := v_out || 4;
        ELSIF p_nexts[k] > 0 THEN
            UPDATE tickwheel_jobs j SET due_ms = p_nexts[k], attempt = 1, run_ms = 0,
                epoch = p_epoch, updated_at = now()
            WHERE j.ns = p_ns AND j.id = p_ids[k];
            v_out := v_out || 2;
        ELSE
            UPDATE tickwheel_jobs j SET state = 1, due_ms = p_nominals[k],
                attempt = p_attempts[k], run_ms = 0, epoch = p_epoch, updated_at = now()
            WHERE j.ns = p_ns AND j.id = p_ids[k];
            v_out := v_out || 1;
        END IF;
    END LOOP;
    RETURN v_out;
END
$$;

-- The row dies only if p_nominal is its current occurrence.
CREATE OR REPLACE FUNCTION tickwheel_dead(
    p_ns text, p_shard integer, p_epoch bigint, p_id text, p_attempt integer,
    p_nominal bigint)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM tickwheel_fence(p_ns, p_shard, p_epoch);
    IF tickwheel_current(p_ns, p_id, p_nominal) THEN
        UPDATE tickwheel_jobs j SET state = 2, due_ms = p_nominal, attempt = p_attempt,
            epoch = p_epoch, updated_at = now()
        WHERE j.ns = p_ns AND j.id = p_id;
    END IF;
END
$$;

-- A retry of the row's current occurrence p_nominal: it runs next at p_run as attempt
-- p_attempt (a recurring row behind p_nominal catches up to it); an attempt never goes
-- down.
CREATE OR REPLACE FUNCTION tickwheel_retried(
    p_ns text, p_shard integer, p_epoch bigint, p_id text, p_nominal bigint,
    p_attempt integer, p_run bigint)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM tickwheel_fence(p_ns, p_shard, p_epoch);
    IF tickwheel_current(p_ns, p_id, p_nominal) THEN
        UPDATE tickwheel_jobs j SET due_ms = p_nominal, attempt = p_attempt, run_ms = p_run,
            epoch = p_epoch, updated_at = now()
        WHERE j.ns = p_ns AND j.id = p_id AND j.attempt <= p_attempt;
    END IF;
END
$$;
