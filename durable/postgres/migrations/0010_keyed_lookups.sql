-- 0010: the batch statements look a job up by its key, one id at a time, whatever the
-- planner knows of the tables.
--
-- tickwheel_put_many (0005), tickwheel_claimed (0001) and tickwheel_claim_check (0006)
-- found a batch's rows with `id = ANY (array)`, a join or an EXISTS against the ids. On
-- a table not yet analyzed (a new install, a burst of jobs before autovacuum's analyze)
-- the planner scanned every row of the namespace instead, filtering each against the
-- whole array: measured on one namespace of 20,000 rows never analyzed, a
-- tickwheel_put_many of 500 new ids took 463 ms against 24 ms after ANALYZE, and a claim
-- check of 100 ids over 20,000 done rows 4.5 ms against 0.9 ms on empty tables. Now each
-- id is a LATERAL subquery on the full primary key (a unique key the planner always
-- uses; OFFSET 0 keeps it from being flattened into a join it could plan as a scan).
-- The lock of tickwheel_put_many takes the rows in the order of the ids given (id order,
-- as its callers sort them), as its ORDER BY did.
--
-- Same signatures, same results: CREATE OR REPLACE, so workers of the previous release
-- get the new bodies too.

CREATE OR REPLACE FUNCTION tickwheel_put_many(
    p_notify boolean,
    p_ns text, p_ids text[], p_shards integer[], p_tasks text[], p_payloads bytea[],
    p_jsons boolean[], p_maxs integer[], p_modes integer[], p_times bigint[],
    p_rkinds smallint[], p_rspecs text[], p_policies smallint[], p_caps integer[],
    p_graces bigint[], p_records bytea[])
RETURNS TABLE (k bigint, status integer, when_ms bigint, seq bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
-- The rows there are, locked one key lookup per id in the callers' order (id order).
PERFORM 1 FROM unnest(p_ids) AS l(id),
    LATERAL (SELECT 1 FROM tickwheel_jobs j WHERE j.ns = p_ns AND j.id = l.id
             FOR UPDATE) AS x;
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
cur AS MATERIALIZED (  -- locked by the first statement; a key lookup per id
    SELECT x.id, x.state, x.due_ms FROM unnest(p_ids) AS l(id),
        LATERAL (SELECT j.id, j.state, j.due_ms FROM tickwheel_jobs j
                 WHERE j.ns = p_ns AND j.id = l.id OFFSET 0) AS x
),
plan AS MATERIALIZED (
    SELECT b.*, c.state AS cur_state, c.due_ms AS cur_due,
           CASE WHEN c.state IS NOT NULL AND c.state <> 1 THEN 2
                WHEN dn.hit IS NOT NULL THEN 5
                ELSE 1 END AS status
    FROM b LEFT JOIN cur c ON c.id = b.id
    LEFT JOIN LATERAL (SELECT 1 AS hit FROM tickwheel_done d
                       WHERE d.ns = p_ns AND d.id = b.id AND d.nominal_ms = b.due
                       OFFSET 0) AS dn ON true
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
    FROM (SELECT 1 FROM box WHERE p_notify LIMIT 1) AS one
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

CREATE OR REPLACE FUNCTION tickwheel_claimed(
    p_ns text, p_shard integer, p_epoch bigint, p_ids text[], p_nominals bigint[])
RETURNS SETOF integer
LANGUAGE plpgsql AS $$
DECLARE
    v_cur bigint;
BEGIN
    -- Written only when the epoch moves: a claim under a known epoch writes nothing
    -- (and its commit waits for no WAL flush).
    SELECT e.epoch INTO v_cur FROM tickwheel_shard_epochs e
        WHERE e.ns = p_ns AND e.shard = p_shard;
    IF v_cur IS NULL OR v_cur < p_epoch THEN
        INSERT INTO tickwheel_shard_epochs AS e (ns, shard, epoch)
        VALUES (p_ns, p_shard, p_epoch)
        ON CONFLICT (ns, shard) DO UPDATE SET epoch = greatest(e.epoch, excluded.epoch)
        RETURNING e.epoch INTO v_cur;
    END IF;
    IF v_cur > p_epoch THEN
        RAISE EXCEPTION USING ERRCODE = 'TWFEN', DETAIL = v_cur::text,
            MESSAGE = format('shard %s epoch is %s, caller has %s', p_shard, v_cur, p_epoch);
    END IF;
    RETURN QUERY
        SELECT c.k::integer
        FROM unnest(p_ids, p_nominals) WITH ORDINALITY AS c(id, nominal, k),
            LATERAL (SELECT 1 FROM tickwheel_done d
                     WHERE d.ns = p_ns AND d.id = c.id AND d.nominal_ms = c.nominal
                     OFFSET 0) AS x;
END
$$;

CREATE OR REPLACE FUNCTION tickwheel_claim_check(
    p_ns text, p_shard integer, p_epoch bigint, p_ids text[], p_nominals bigint[])
RETURNS TABLE (pos integer, gone boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_missing text[];
BEGIN
    -- The epoch, and the occurrences done already, as tickwheel_claimed() has them.
    RETURN QUERY
        SELECT c.pos, false
        FROM tickwheel_claimed(p_ns, p_shard, p_epoch, p_ids, p_nominals) AS c(pos);
    SELECT array_agg(c.id ORDER BY c.id COLLATE "C") INTO v_missing
        FROM unnest(p_ids) AS c(id)
        LEFT JOIN LATERAL (SELECT 1 AS hit FROM tickwheel_jobs j
                           WHERE j.ns = p_ns AND j.id = c.id OFFSET 0) AS x ON true
        WHERE x.hit IS NULL;
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
        LEFT JOIN LATERAL (SELECT 1 AS hit FROM tickwheel_jobs j
                           WHERE j.ns = p_ns AND j.id = c.id OFFSET 0) AS x ON true
        WHERE c.id = ANY (v_missing) AND x.hit IS NULL;
END
$$;
