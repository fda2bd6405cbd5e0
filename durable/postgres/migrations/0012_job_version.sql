-- 0012: a version per job row, carried by its Redis entry (record field 19).
--
-- A single schedule commits its row and outbox row, then writes the Redis entry after
-- the call returned (_behind.py). That late write could land after another process had
-- replaced the job and after the replacement ran and was acked: it put the old entry
-- back in Redis, and the claim ran it (its occurrence, another nominal, was not done).
--
-- Now every write of a whole job row takes a version from the outbox's sequence, after
-- the row's lock: tickwheel_put and tickwheel_put_many (here; the version is the outbox
-- row's seq, so the producer that wrote the row knows it), and the replace paths of the
-- library (their own statement, under the id's advisory and row locks). The Redis entry
-- written from the row carries it. Acks, retries, moves, dead letters and requeues
-- leave it as it is (their Redis scripts keep the record's field).
--
-- tickwheel_claim_check with a sixth argument (the claimed entries' versions) also
-- names, as gone, the claimed entries older than their row: the worker removes them
-- unrun and indexes a pending row again. An entry of version 0 (written before this
-- migration, or by a writer of the previous release) is never found stale. Its body is
-- 0010's five-argument one (unchanged, for workers of the previous release), with the
-- version read in the same key lookup as the row's existence: calling the five-argument
-- function and then looking the ids up again measured 0.79 against 0.51 ms a check of
-- 100 ids of pending rows, this body 0.63 against 0.58 (medians of 300 alternated).
--
-- tickwheel_put and tickwheel_put_many keep their signatures and results: CREATE OR
-- REPLACE, bodies restated from 0005 and 0010 with the version added.

ALTER TABLE tickwheel_jobs ADD COLUMN version bigint NOT NULL DEFAULT 0;

CREATE OR REPLACE FUNCTION tickwheel_put(
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
    v_seq   regclass := pg_get_serial_sequence('tickwheel_outbox', 'seq')::regclass;
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
    -- The version, taken under the row's lock: the outbox row's seq.
    seq := nextval(v_seq);
    IF v_state IS NULL THEN
        INSERT INTO tickwheel_jobs AS j (ns, id, shard, task, payload, json_payload,
            max_attempts, due_ms, rkind, rspec, policy, max_catch_up, grace_ms, record,
            version)
        VALUES (p_ns, p_id, p_shard, p_task, p_payload, p_json, p_max, v_due, p_rkind,
            p_rspec, p_policy, p_cap, p_grace, p_record, seq)
        ON CONFLICT (ns, id) DO NOTHING;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        IF v_n = 0 THEN  -- a concurrent producer created it first
            SELECT j.due_ms INTO v_cur FROM tickwheel_jobs j WHERE j.ns = p_ns AND j.id = p_id;
            status := 2; when_ms := v_cur; seq := NULL; RETURN;
        END IF;
    ELSE
        UPDATE tickwheel_jobs j SET shard = p_shard, task = p_task, payload = p_payload,
            json_payload = p_json, max_attempts = p_max, due_ms = v_due, rkind = p_rkind,
            rspec = p_rspec, policy = p_policy, max_catch_up = p_cap, grace_ms = p_grace,
            record = p_record, state = 0, attempt = 1, epoch = 0, updated_at = now(),
            version = seq
        WHERE j.ns = p_ns AND j.id = p_id;
    END IF;
    INSERT INTO tickwheel_outbox (seq, ns, id, due_ms) VALUES (seq, p_ns, p_id, v_due);
    IF p_notify THEN  -- delivered at commit, to the relays
        PERFORM pg_notify('tickwheel_outbox', p_ns);
    END IF;
    status := 1; when_ms := v_due;
END
$$;

CREATE OR REPLACE FUNCTION tickwheel_put_many(
    p_notify boolean,
    p_ns text, p_ids text[], p_shards integer[], p_tasks text[], p_payloads bytea[],
    p_jsons boolean[], p_maxs integer[], p_modes integer[], p_times bigint[],
    p_rkinds smallint[], p_rspecs text[], p_policies smallint[], p_caps integer[],
    p_graces bigint[], p_records bytea[])
RETURNS TABLE (k bigint, status integer, when_ms bigint, seq bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_seq regclass := pg_get_serial_sequence('tickwheel_outbox', 'seq')::regclass;
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
plan AS MATERIALIZED (  -- ver: the version (and outbox seq) of a row written
    SELECT b.*, c.state AS cur_state, c.due_ms AS cur_due,
           CASE WHEN c.state IS NOT NULL AND c.state <> 1 THEN 2
                WHEN dn.hit IS NOT NULL THEN 5
                ELSE 1 END AS status,
           nextval(v_seq) AS ver
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
        updated_at = now(), version = p.ver
    FROM plan p
    WHERE p.status = 1 AND p.cur_state = 1 AND j.ns = p_ns AND j.id = p.id
    RETURNING j.id
),
inserted AS (
    INSERT INTO tickwheel_jobs AS j (ns, id, shard, task, payload, json_payload,
        max_attempts, due_ms, rkind, rspec, policy, max_catch_up, grace_ms, record, version)
    SELECT p_ns, p.id, p.shard, p.task, p.payload, p.json, p.max, p.due, p.rkind, p.rspec,
           p.policy, p.cap, p.grace, p.record, p.ver
    FROM plan p WHERE p.status = 1 AND p.cur_state IS NULL ORDER BY p.id COLLATE "C"
    ON CONFLICT (ns, id) DO NOTHING
    RETURNING j.id
),
written AS (
    SELECT id FROM overwritten UNION ALL SELECT id FROM inserted
),
box AS (
    INSERT INTO tickwheel_outbox (seq, ns, id, due_ms)
    SELECT p.ver, p_ns, p.id, p.due FROM plan p JOIN written w ON w.id = p.id ORDER BY p.k
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

CREATE FUNCTION tickwheel_claim_check(
    p_ns text, p_shard integer, p_epoch bigint, p_ids text[], p_nominals bigint[],
    p_versions bigint[])
RETURNS TABLE (pos integer, gone boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_missing text[];
    v_stale   bigint[];
BEGIN
    -- The epoch, and the occurrences done already, as tickwheel_claimed() has them.
    RETURN QUERY
        SELECT c.pos, false
        FROM tickwheel_claimed(p_ns, p_shard, p_epoch, p_ids, p_nominals) AS c(pos);
    -- One key lookup per id (0010): the ids with no row, and the entries older than
    -- their row (stale: taken out unrun as the gone ones are).
    SELECT array_agg(c.id ORDER BY c.id COLLATE "C") FILTER (WHERE x.version IS NULL),
           array_agg(c.k) FILTER (WHERE c.ver > 0 AND c.ver < x.version)
        INTO v_missing, v_stale
        FROM unnest(p_ids, p_versions) WITH ORDINALITY AS c(id, ver, k)
        LEFT JOIN LATERAL (SELECT j.version FROM tickwheel_jobs j
                           WHERE j.ns = p_ns AND j.id = c.id OFFSET 0) AS x ON true;
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
