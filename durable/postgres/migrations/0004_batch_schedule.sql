-- 0004: schedule_many as one set-based statement instead of tickwheel_schedule() once
-- per job.
--
-- Per job, tickwheel_schedule() runs five statements (lock the row, look up done,
-- insert the job, insert its outbox row, notify): about 43 us a job in a batch of
-- 1,000, most of the Postgres mode's schedule_many. This function does the same for a
-- batch of distinct ids, each step once for the whole batch, and returns what
-- tickwheel_schedule() would have returned per job, with k its position in the batch.
--
-- Same rules as tickwheel_schedule() (0001): 1 created (with its outbox seq), 2 kept
-- (a pending or dead job has the id: when_ms is its due), 5 done (this occurrence
-- completed already: nothing written). A completed one-shot row (state 1) is
-- overwritten by the new job. One difference, for the caller to finish: a job that a
-- concurrent producer created after this statement began is kept with when_ms NULL
-- (the statement's snapshot cannot see that row; PgStore.schedule reads its due).
--
-- The caller sends distinct ids (PgStore.schedule uses tickwheel_schedule() per job for
-- a batch that names an id twice) sorted by id: existing rows are locked, and new ids
-- inserted, in id order (code-point order, COLLATE "C", as every other writer), so
-- batches never deadlock.
--
-- Two statements. The first locks the rows there are. The second (the steps as CTEs,
-- each reading the one before it, which orders them) decides and writes, with a
-- snapshot taken after the locks: a row whose lock it waited for, because an ack was
-- committing, is seen with that ack's done row. In one statement the done lookup used
-- the snapshot from before the wait, missed the done row, and put the completed
-- occurrence back to pending (found in review: the per-job function said DONE).
CREATE FUNCTION tickwheel_schedule_many(
    p_ns text, p_ids text[], p_shards integer[], p_tasks text[], p_payloads bytea[],
    p_jsons boolean[], p_maxs integer[], p_modes integer[], p_times bigint[],
    p_rkinds smallint[], p_rspecs text[], p_policies smallint[], p_caps integer[],
    p_graces bigint[], p_records bytea[])
RETURNS TABLE (k bigint, status integer, when_ms bigint, seq bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
PERFORM 1 FROM tickwheel_jobs j
    WHERE j.ns = p_ns AND j.id = ANY (p_ids) ORDER BY j.id COLLATE "C" FOR UPDATE;
RETURN QUERY
WITH b AS (
    SELECT u.*, CASE WHEN u.mode = 1
                THEN floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint + u.t
                ELSE u.t END AS due
    FROM unnest(p_ids, p_shards, p_tasks, p_payloads, p_jsons, p_maxs, p_modes, p_times,
                p_rkinds, p_rspecs, p_policies, p_caps, p_graces, p_records)
         WITH ORDINALITY AS u(id, shard, task, payload, json, max, mode, t, rkind, rspec,
                              policy, cap, grace, record, k)
),
cur AS MATERIALIZED (  -- locked by the first statement
    SELECT j.id, j.state, j.due_ms FROM tickwheel_jobs j
    WHERE j.ns = p_ns AND j.id = ANY (p_ids)
),
plan AS MATERIALIZED (
    SELECT b.*, c.state AS cur_state, c.due_ms AS cur_due,
           CASE WHEN c.state IS NOT NULL AND c.state <> 1 THEN 2
                WHEN EXISTS (SELECT 1 FROM tickwheel_done d
                             WHERE d.ns = p_ns AND d.id = b.id AND d.nominal_ms = b.due)
                THEN 5
                ELSE 1 END AS status
    FROM b LEFT JOIN cur c ON c.id = b.id
),
overwritten AS (
    UPDATE tickwheel_jobs j SET shard = p.shard, task = p.task, payload = p.payload,
        json_payload = p.json, max_attempts = p.max, due_ms = p.due, rkind = p.rkind,
        rspec = p.rspec, policy = p.policy, max_catch_up = p.cap, grace_ms = p.grace,
        record = p.record, state = 0, attempt = 1, run_ms = 0, epoch = 0,
        updated_at = now()
    FROM plan p
    WHERE p.status = 1 AND p.cur_state = 1 AND j.ns = p_ns AND j.id = p.id
    RETURNING j.id
),
inserted AS (
    INSERT INTO tickwheel_jobs AS j (ns, id, shard, task, payload, json_payload,
        max_attempts, due_ms, rkind, rspec, policy, max_catch_up, grace_ms, record)
    SELECT p_ns, p.id, p.shard, p.task, p.payload, p.json, p.max, p.due, p.rkind, p.rspec,
           p.policy, p.cap, p.grace, p.record
    FROM plan p WHERE p.status = 1 AND p.cur_state IS NULL ORDER BY p.id COLLATE "C"
    ON CONFLICT (ns, id) DO NOTHING
    RETURNING j.id
),
written AS (
    SELECT id FROM overwritten UNION ALL SELECT id FROM inserted
),
box AS (
    INSERT INTO tickwheel_outbox (ns, id, due_ms)
    SELECT p_ns, p.id, p.due FROM plan p JOIN written w ON w.id = p.id ORDER BY p.k
    RETURNING tickwheel_outbox.id, tickwheel_outbox.seq
),
notified AS (  -- delivered at commit, to the relays
    SELECT count(pg_notify('tickwheel_outbox', p_ns)) AS n
    FROM (SELECT 1 FROM box LIMIT 1) AS one
)
SELECT p.k,
       CASE WHEN p.status = 1 AND w.id IS NULL THEN 2 ELSE p.status END,
       CASE WHEN p.status = 2 THEN p.cur_due
            WHEN p.status = 1 AND w.id IS NULL THEN NULL
            ELSE p.due END,
       box.seq
FROM plan p
LEFT JOIN written w ON w.id = p.id
LEFT JOIN box ON box.id = p.id
CROSS JOIN notified
ORDER BY p.k;
END
$$;
