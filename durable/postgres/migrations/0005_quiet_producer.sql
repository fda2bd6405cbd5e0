-- 0005: a producer that indexes its own jobs does not wake the relays.
--
-- Scheduler.schedule without conn= commits the job and its outbox row, writes the job to
-- Redis itself, then deletes the outbox row. tickwheel_schedule() notified the relays at
-- that commit too, and they raced the producer: measured, the relays re-sent 1,266 of
-- 2,000 jobs scheduled one by one (each a Redis write of a job indexed already, and an
-- outbox read and delete). The outbox row is still the safety net: if the producer dies
-- between its commit and its Redis write, a relay's periodic round (every second)
-- indexes the job.
--
-- tickwheel_put() and tickwheel_put_many() are tickwheel_schedule() (0001) and
-- tickwheel_schedule_many() (0004) with a first argument, p_notify; their bodies are
-- restated whole, with the notify under it. The old names stay, with their signatures
-- and their behaviour (they notify), so workers of the previous release keep working;
-- CREATE OR REPLACE keeps their identity for statements those workers have prepared.
-- The library calls tickwheel_put*(false, ...) on its own path and (true, ...) in the
-- application's transaction (conn=), where the relays are the only indexers.

CREATE FUNCTION tickwheel_put(
    p_notify boolean,
    p_ns text, p_id text, p_shard integer, p_task text, p_payload bytea, p_json boolean,
    p_max integer, p_mode integer, p_time bigint, p_rkind smallint, p_rspec text,
    p_policy smallint, p_cap integer, p_grace bigint, p_record bytea,
    OUT status integer, OUT when_ms bigint, OUT seq bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_due   bigint := p_time;
    v_state smallint;
    v_cur   bigint;
    v_n     integer;
BEGIN
    IF p_mode = 1 THEN
        v_due := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint + p_time;
    END IF;
    SELECT j.state, j.due_ms INTO v_state, v_cur
        FROM tickwheel_jobs j WHERE j.ns = p_ns AND j.id = p_id FOR UPDATE;
    IF v_state IS NOT NULL AND v_state <> 1 THEN
        status := 2; when_ms := v_cur; RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM tickwheel_done d
               WHERE d.ns = p_ns AND d.id = p_id AND d.nominal_ms = v_due) THEN
        status := 5; when_ms := v_due; RETURN;
    END IF;
    IF v_state IS NULL THEN
        INSERT INTO tickwheel_jobs AS j (ns, id, shard, task, payload, json_payload,
            max_attempts, due_ms, rkind, rspec, policy, max_catch_up, grace_ms, record)
        VALUES (p_ns, p_id, p_shard, p_task, p_payload, p_json, p_max, v_due, p_rkind,
            p_rspec, p_policy, p_cap, p_grace, p_record)
        ON CONFLICT (ns, id) DO NOTHING;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        IF v_n = 0 THEN  -- a concurrent producer created it first
            SELECT j.due_ms INTO v_cur FROM tickwheel_jobs j WHERE j.ns = p_ns AND j.id = p_id;
            status := 2; when_ms := v_cur; RETURN;
        END IF;
    ELSE
        UPDATE tickwheel_jobs j SET shard = p_shard, task = p_task, payload = p_payload,
            json_payload = p_json, max_attempts = p_max, due_ms = v_due, rkind = p_rkind,
            rspec = p_rspec, policy = p_policy, max_catch_up = p_cap, grace_ms = p_grace,
            record = p_record, state = 0, attempt = 1, epoch = 0, updated_at = now()
        WHERE j.ns = p_ns AND j.id = p_id;
    END IF;
    INSERT INTO tickwheel_outbox (ns, id, due_ms) VALUES (p_ns, p_id, v_due)
        RETURNING tickwheel_outbox.seq INTO seq;
    IF p_notify THEN  -- delivered at commit, to the relays
        PERFORM pg_notify('tickwheel_outbox', p_ns);
    END IF;
    status := 1; when_ms := v_due;
END
$$;

CREATE FUNCTION tickwheel_put_many(
    p_notify boolean,
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

CREATE OR REPLACE FUNCTION tickwheel_schedule(
    p_ns text, p_id text, p_shard integer, p_task text, p_payload bytea, p_json boolean,
    p_max integer, p_mode integer, p_time bigint, p_rkind smallint, p_rspec text,
    p_policy smallint, p_cap integer, p_grace bigint, p_record bytea,
    OUT status integer, OUT when_ms bigint, OUT seq bigint)
LANGUAGE sql AS $$
    SELECT * FROM tickwheel_put(true, p_ns, p_id, p_shard, p_task, p_payload, p_json, p_max,
        p_mode, p_time, p_rkind, p_rspec, p_policy, p_cap, p_grace, p_record)
$$;


CREATE OR REPLACE FUNCTION tickwheel_schedule_many(
    p_ns text, p_ids text[], p_shards integer[], p_tasks text[], p_payloads bytea[],
    p_jsons boolean[], p_maxs integer[], p_modes integer[], p_times bigint[],
    p_rkinds smallint[], p_rspecs text[], p_policies smallint[], p_caps integer[],
    p_graces bigint[], p_records bytea[])
RETURNS TABLE (k bigint, status integer, when_ms bigint, seq bigint)
LANGUAGE sql AS $$
    SELECT * FROM tickwheel_put_many(true, p_ns, p_ids, p_shards, p_tasks, p_payloads,
        p_jsons, p_maxs, p_modes, p_times, p_rkinds, p_rspecs, p_policies, p_caps, p_graces,
        p_records)
$$;
