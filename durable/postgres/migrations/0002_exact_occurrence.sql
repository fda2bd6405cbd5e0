-- 0002: an ack or an end state completes the job row only for the occurrence it names;
-- a retry's attempt and its next run time are recorded, for reconcile to restore.
--
-- A job row's due_ms is its current occurrence (the nominal due Redis claims it at).
-- Until now tickwheel_ack and tickwheel_dead changed the row whatever occurrence the
-- caller held. Since a job can be moved (reschedule) or overwritten (replace) while a
-- stalled worker still holds an expired lease on its old occurrence, that worker's late
-- ack would complete, or its last failure kill, the new occurrence in PostgreSQL, and a
-- Redis loss would then lose it. Now the done row is still written (that occurrence ran),
-- but the job row moves on only when its due_ms is the acked occurrence.
--
-- Workers of the previous release keep working against this schema: tickwheel_ack keeps
-- its signature, and the 5-argument tickwheel_dead stays beside the new 6-argument one.

-- A pending occurrence that was retried runs next at run_ms as attempt `attempt`
-- (run_ms 0: it was not retried, and runs at due_ms as attempt 1). Redis holds the same; reconcile
-- writes it back from here after a Redis loss, so a failing job neither gets its
-- attempts back nor loses its backoff.
ALTER TABLE tickwheel_jobs ADD COLUMN run_ms bigint NOT NULL DEFAULT 0;

-- Refuse (TWFEN, DETAIL the stored epoch) unless p_epoch is the shard's stored epoch,
-- whose row stays share-locked to the caller's commit (an epoch raise waits for it).
CREATE FUNCTION tickwheel_fence(p_ns text, p_shard integer, p_epoch bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_cur bigint;
BEGIN
    SELECT e.epoch INTO v_cur FROM tickwheel_shard_epochs e
        WHERE e.ns = p_ns AND e.shard = p_shard FOR SHARE;
    IF v_cur IS NULL OR v_cur <> p_epoch THEN
        RAISE EXCEPTION USING ERRCODE = 'TWFEN', DETAIL = coalesce(v_cur, 0)::text,
            MESSAGE = format('shard %s epoch is %s, caller has %s', p_shard,
                             coalesce(v_cur, 0), p_epoch);
    END IF;
END
$$;

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
        ELSIF p_nexts[k] > 0 THEN
            UPDATE tickwheel_jobs j SET due_ms = p_nexts[k], attempt = 1, run_ms = 0,
                epoch = p_epoch, updated_at = now()
            WHERE j.ns = p_ns AND j.id = p_ids[k] AND j.state = 0
              AND j.due_ms = p_nominals[k];
            v_out := v_out || 2;
        ELSE
            UPDATE tickwheel_jobs j SET state = 1, attempt = p_attempts[k], run_ms = 0,
                epoch = p_epoch, updated_at = now()
            WHERE j.ns = p_ns AND j.id = p_ids[k] AND j.state = 0
              AND j.due_ms = p_nominals[k];
            v_out := v_out || 1;
        END IF;
    END LOOP;
    RETURN v_out;
END
$$;

-- tickwheel_dead for one occurrence: the row dies only if p_nominal is its due_ms.
CREATE FUNCTION tickwheel_dead(
    p_ns text, p_shard integer, p_epoch bigint, p_id text, p_attempt integer,
    p_nominal bigint)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM tickwheel_fence(p_ns, p_shard, p_epoch);
    UPDATE tickwheel_jobs j SET state = 2, attempt = p_attempt, epoch = p_epoch,
        updated_at = now()
    WHERE j.ns = p_ns AND j.id = p_id AND j.state = 0 AND j.due_ms = p_nominal;
END
$$;

-- A retry (retry.lua said "due again"): occurrence p_nominal of the job runs next at
-- p_run as attempt p_attempt. Under the epoch, like an ack; a row that moved on to
-- another occurrence is left alone, and an attempt never goes down.
CREATE FUNCTION tickwheel_retried(
    p_ns text, p_shard integer, p_epoch bigint, p_id text, p_nominal bigint,
    p_attempt integer, p_run bigint)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM tickwheel_fence(p_ns, p_shard, p_epoch);
    UPDATE tickwheel_jobs j SET attempt = p_attempt, run_ms = p_run, epoch = p_epoch,
        updated_at = now()
    WHERE j.ns = p_ns AND j.id = p_id AND j.state = 0 AND j.due_ms = p_nominal
      AND j.attempt <= p_attempt;
END
$$;
