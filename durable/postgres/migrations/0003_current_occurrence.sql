-- 0003: an ack, a retry or an end state waits for a replace or reschedule of the same
-- id that is still committing; a recurring job moved on unrun by its missed-run policy
-- is moved in PostgreSQL too.
--
-- Two gaps of 0002, where the row changes only when its due_ms is the named occurrence:
--
-- 1. replace and reschedule change Redis inside a PostgreSQL transaction that holds the
--    id's advisory lock (PgStore.locked), and write the row just before their commit. A
--    worker could claim the new occurrence and ack it in between: its ack found the old
--    due_ms, wrote the done row and left the row pending at an occurrence already done.
--    Now every ack, retry and end state takes the id's advisory lock, shared, before it
--    looks at the row: it waits for such a transaction and sees what it wrote.
-- 2. A claim moves a recurring job that missed runs (policy once-skipped or skip, or
--    past max_catch_up under all) to a later occurrence in Redis alone; the row stayed
--    at the old one, no later ack matched it, and after a Redis loss reconcile brought
--    back an occurrence long past. The claim now records the move (tickwheel_moved).
--    The row must match exactly: a looser rule (any later occurrence of a recurring row)
--    would let a stalled worker's late ack move a row that was rescheduled meanwhile.
--
-- Lock order. PgStore.locked takes its advisory locks (exclusive), then its row locks,
-- each in id order. These functions take the advisory locks (shared) of all their ids
-- first, in the order given, then row locks in that order, and their callers send ids
-- sorted. Id order is code-point order everywhere (Python's sort, COLLATE "C" in SQL):
-- a database collation such as en_US orders "B" before "a" where Python does not.
--
-- Workers of the previous release keep working against this schema: the functions keep
-- their signatures, and tickwheel_ack still returns 1, 2 or 3 per job (and 4, below).

-- Hold job p_id for the caller's transaction (its advisory lock shared, then its row)
-- and return true if occurrence p_nominal is the row's current one: the row is pending
-- at due_ms p_nominal. (The CASE leaves the planner only the primary key: see the ack.)
CREATE FUNCTION tickwheel_current(p_ns text, p_id text, p_nominal bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtextextended(p_ns || ':' || p_id, 0));
    PERFORM 1 FROM tickwheel_jobs j
        WHERE j.ns = p_ns AND j.id = p_id
          AND CASE WHEN j.state <> 0 THEN false ELSE j.due_ms = p_nominal END
        FOR UPDATE;
    RETURN FOUND;
END
$$;

-- Returns per job: 1 acked, 2 acked and moved to its next occurrence, 3 done already (a
-- re-send), 4 acked, but the row had moved on to another occurrence (left as it is).
-- The ids' advisory locks are taken first, in one statement and in the caller's order
-- (PgStore.ack sends them sorted); each UPDATE then locks its row and, if it waited
-- for a committing replace, checks the condition again on what that replace wrote. The
-- condition is tickwheel_current's, written inline: one statement per job, not two.
-- It is one CASE, state test included, on purpose: it leaves the planner only the
-- primary key. With `state = 0` and due_ms comparisons in the WHERE, a table not yet
-- analyzed (a new install, a burst of jobs) got the pending rows' (ns, due_ms, id)
-- index scanned for every acked job: 3-14x the ack's time at 500 jobs, growing with
-- the table (bench: the same ack before and after ANALYZE).
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
    PERFORM pg_advisory_xact_lock_shared(hashtextextended(p_ns || ':' || u.id, 0))
        FROM unnest(p_ids) AS u(id);
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

-- The row dies only if p_nominal is its current occurrence.
CREATE OR REPLACE FUNCTION tickwheel_dead(
    p_ns text, p_shard integer, p_epoch bigint, p_id text, p_attempt integer,
    p_nominal bigint)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM tickwheel_fence(p_ns, p_shard, p_epoch);
    IF tickwheel_current(p_ns, p_id, p_nominal) THEN
        UPDATE tickwheel_jobs j SET state = 2, attempt = p_attempt, epoch = p_epoch,
            updated_at = now()
        WHERE j.ns = p_ns AND j.id = p_id;
    END IF;
END
$$;

-- A retry of the row's current occurrence p_nominal: it runs next at p_run as attempt
-- p_attempt; an attempt never goes down.
CREATE OR REPLACE FUNCTION tickwheel_retried(
    p_ns text, p_shard integer, p_epoch bigint, p_id text, p_nominal bigint,
    p_attempt integer, p_run bigint)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM tickwheel_fence(p_ns, p_shard, p_epoch);
    IF tickwheel_current(p_ns, p_id, p_nominal) THEN
        UPDATE tickwheel_jobs j SET attempt = p_attempt, run_ms = p_run, epoch = p_epoch,
            updated_at = now()
        WHERE j.ns = p_ns AND j.id = p_id AND j.attempt <= p_attempt;
    END IF;
END
$$;

-- A claim moved recurring jobs on unrun (their missed-run policy): job p_ids[k] goes
-- from occurrence p_froms[k] to p_tos[k], at attempt 1, if p_froms[k] is its current
-- one. Part of a claim, so the epoch is checked as tickwheel_claimed checks it (it
-- records a higher one: a claim that moved every job it took recorded none yet).
-- Ids in the caller's (sorted) order.
CREATE FUNCTION tickwheel_moved(
    p_ns text, p_shard integer, p_epoch bigint, p_ids text[], p_froms bigint[],
    p_tos bigint[])
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM * FROM tickwheel_claimed(p_ns, p_shard, p_epoch, '{}', '{}');
    FOR k IN 1 .. coalesce(array_length(p_ids, 1), 0) LOOP
        IF tickwheel_current(p_ns, p_ids[k], p_froms[k]) THEN
            UPDATE tickwheel_jobs j SET due_ms = p_tos[k], attempt = 1, run_ms = 0,
                epoch = p_epoch, updated_at = now()
            WHERE j.ns = p_ns AND j.id = p_ids[k];
        END IF;
    END LOOP;
END
$$;
