-- 0009: schedule(..., replace=True, conn=) in the application's transaction.
--
-- A replace changes a job only if Redis says it is not leased (running), and Redis can
-- say so only at the moment the replace is made, which is after the application's
-- commit. So a replace in the application's transaction does not touch the job row: it
-- writes the replacement here, beside it, and a relay applies it after the commit (the
-- asyncio mode's own replace: Redis decides inside a transaction holding the id, and the
-- row follows). A rollback leaves nothing here, and both stores as they were.
--
-- One row per job id: a later replacement of the id overwrites the earlier one (the
-- last committed wins) and takes a new generation, `gen`. The relay applies a
-- replacement only while the row it read still has that generation, under the id's
-- advisory lock; every later write of the id (a replace of its own, a cancel, in either
-- mode) deletes the id's replacement in its own transaction, and a reschedule moves it.
-- So a relay that comes late can never overtake a later write: what it would apply is
-- gone, or has a generation it did not read.
--
-- A replacement whose job is leased when the relay comes is kept (Redis said BUSY) and
-- tried again at the next relay round: it is applied once the run has ended (acked,
-- retried or dead), from the job's state then. Its occurrence done by then (PostgreSQL
-- has its done row): dropped, as a replace of a done occurrence is.
CREATE SEQUENCE tickwheel_replacing_gen;

CREATE TABLE tickwheel_replacing (
    ns           text     NOT NULL,
    id           text     NOT NULL,
    gen          bigint   NOT NULL DEFAULT nextval('tickwheel_replacing_gen'),
    shard        integer  NOT NULL,
    task         text     NOT NULL,
    payload      bytea    NOT NULL,
    json_payload boolean  NOT NULL,
    max_attempts integer  NOT NULL,
    due_ms       bigint   NOT NULL,
    rkind        smallint NOT NULL,
    rspec        text     NOT NULL,
    policy       smallint NOT NULL,
    max_catch_up integer  NOT NULL,
    grace_ms     bigint   NOT NULL,
    record       bytea    NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (ns, id)
);

-- Replace job p_id in the caller's transaction (the arguments are tickwheel_put's).
-- Holds the id's advisory lock (exclusive, to the commit) as every writer of the id
-- does. Status: 5 done (PostgreSQL has that occurrence done: nothing written), 3 the id
-- has a job (pending or dead) that the replacement is for, 1 it has none (the
-- replacement creates it). The relays are notified at the commit.
CREATE FUNCTION tickwheel_replace_in(
    p_ns text, p_id text, p_shard integer, p_task text, p_payload bytea, p_json boolean,
    p_max integer, p_mode integer, p_time bigint, p_rkind smallint, p_rspec text,
    p_policy smallint, p_cap integer, p_grace bigint, p_record bytea,
    OUT status integer, OUT when_ms bigint, OUT gen bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_due   bigint := p_time;
    v_state smallint;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(p_ns || ':' || p_id, 0));
    IF p_mode = 1 THEN
        v_due := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint + p_time;
    END IF;
    when_ms := v_due;
    IF EXISTS (SELECT 1 FROM tickwheel_done d
               WHERE d.ns = p_ns AND d.id = p_id AND d.nominal_ms = v_due) THEN
        status := 5; RETURN;
    END IF;
    SELECT j.state INTO v_state FROM tickwheel_jobs j WHERE j.ns = p_ns AND j.id = p_id;
    INSERT INTO tickwheel_replacing AS r (ns, id, shard, task, payload, json_payload,
        max_attempts, due_ms, rkind, rspec, policy, max_catch_up, grace_ms, record)
    VALUES (p_ns, p_id, p_shard, p_task, p_payload, p_json, p_max, v_due, p_rkind,
        p_rspec, p_policy, p_cap, p_grace, p_record)
    ON CONFLICT (ns, id) DO UPDATE SET gen = nextval('tickwheel_replacing_gen'),
        shard = excluded.shard, task = excluded.task, payload = excluded.payload,
        json_payload = excluded.json_payload, max_attempts = excluded.max_attempts,
        due_ms = excluded.due_ms, rkind = excluded.rkind, rspec = excluded.rspec,
        policy = excluded.policy, max_catch_up = excluded.max_catch_up,
        grace_ms = excluded.grace_ms, record = excluded.record, created_at = now()
    RETURNING r.gen INTO gen;
    PERFORM pg_notify('tickwheel_outbox', p_ns);
    status := CASE WHEN v_state IN (0, 2) THEN 3 ELSE 1 END;
END
$$;
