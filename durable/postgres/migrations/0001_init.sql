-- 0001: jobs, done occurrences, outbox, shard epochs.
-- Every table carries the namespace (the Redis key prefix), so one database can serve
-- several namespaces; the primary keys start with it.

-- One row per job id. A pending row is the job's current occurrence: due_ms is its
-- nominal due (the occurrence's identity, with id). record is the job record exactly as
-- schedule.lua takes it (msgpack, see durable/_record.py), so the relay and reconcile
-- put the job back in Redis byte for byte; the columns beside it are for SQL readers.
CREATE TABLE tickwheel_jobs (
    ns           text     NOT NULL,
    id           text     NOT NULL,
    shard        integer  NOT NULL,
    task         text     NOT NULL,
    payload      bytea    NOT NULL,
    json_payload boolean  NOT NULL,
    max_attempts integer  NOT NULL,
    due_ms       bigint   NOT NULL,
    -- recurrence as the Redis record has it: rkind 0 none, 1 interval, 2 cron; rspec the
    -- interval in ms or the cron text; policy 0 once, 1 all, 2 skip.
    rkind        smallint NOT NULL DEFAULT 0,
    rspec        text     NOT NULL DEFAULT '',
    policy       smallint NOT NULL DEFAULT 0,
    max_catch_up integer  NOT NULL DEFAULT 0,
    grace_ms     bigint   NOT NULL DEFAULT 0,
    record       bytea    NOT NULL,
    -- 0 pending, 1 done (a one-shot job acked), 2 dead
    state        smallint NOT NULL DEFAULT 0,
    -- the attempt and owner epoch of the last ack or end state written here
    attempt      integer  NOT NULL DEFAULT 1,
    epoch        bigint   NOT NULL DEFAULT 0,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (ns, id),
    CHECK (state IN (0, 1, 2))
);
-- Reconcile and the operators read pending rows by due time; done and dead rows are not
-- in it, so the index stays the size of the pending set.
CREATE INDEX tickwheel_jobs_pending_due ON tickwheel_jobs (ns, due_ms, id) WHERE state = 0;

-- One row per completed occurrence: an occurrence recorded here never runs again.
CREATE TABLE tickwheel_done (
    ns         text        NOT NULL,
    id         text        NOT NULL,
    nominal_ms bigint      NOT NULL,
    epoch      bigint      NOT NULL,
    attempt    integer     NOT NULL,
    done_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (ns, id, nominal_ms)
);

-- Retention (tickwheel pg prune) deletes old rows by time: done rows arrive in time
-- order, so a BRIN index finds them for a few pages; completed job rows are few next
-- to the pending ones, and a partial index keeps them apart.
CREATE INDEX tickwheel_done_done_at ON tickwheel_done USING brin (done_at);
CREATE INDEX tickwheel_jobs_completed ON tickwheel_jobs (updated_at) WHERE state = 1;

-- Index entries still to be written to Redis, in the producer's transaction.
CREATE TABLE tickwheel_outbox (
    seq        bigserial   PRIMARY KEY,
    ns         text        NOT NULL,
    id         text        NOT NULL,
    due_ms     bigint      NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- The highest owner epoch seen per shard (as Redis's take handed it out): an ack under
-- a lower epoch is refused here as it is in Redis.
CREATE TABLE tickwheel_shard_epochs (
    ns    text    NOT NULL,
    shard integer NOT NULL,
    epoch bigint  NOT NULL,
    PRIMARY KEY (ns, shard)
);

-- Outbox rows are read oldest first, per namespace.
CREATE INDEX tickwheel_outbox_ns_seq ON tickwheel_outbox (ns, seq);

-- Errors raised by the functions below, by SQLSTATE (the client maps them):
--   TWFEN  the caller's shard epoch is stale (DETAIL: the stored epoch)

-- Schedule one job: one round trip, in the caller's transaction. Status codes are
-- schedule.lua's: 1 created, 2 kept (a pending or dead job has this id; when = its due),
-- 5 done (this occurrence completed already; nothing written). A created job gets an
-- outbox row, which the relay turns into its Redis index entry after the commit.
-- A job whose last occurrence completed (state 1) is replaced by the new one.
-- p_mode 1: p_time is a delay added to this server's clock; 0: an absolute due (ms).
CREATE FUNCTION tickwheel_schedule(
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
    PERFORM pg_notify('tickwheel_outbox', p_ns);  -- delivered at commit, to the relays
    status := 1; when_ms := v_due;
END
$$;

-- Record a claim's epoch and say which claimed occurrences are done already. The shard's
-- stored epoch only moves up; a caller below it is stale: TWFEN, DETAIL the stored epoch.
-- Returns the 1-based positions in p_ids whose (id, nominal) is in tickwheel_done.
CREATE FUNCTION tickwheel_claimed(
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
        FROM unnest(p_ids, p_nominals) WITH ORDINALITY AS c(id, nominal, k)
        JOIN tickwheel_done d ON d.ns = p_ns AND d.id = c.id AND d.nominal_ms = c.nominal;
END
$$;

-- Ack claimed occurrences of one shard under epoch p_epoch: each is recorded done (once:
-- the primary key), and its job row completes (state 1) or, for a recurring job with
-- p_nexts > 0, moves to its next occurrence, in this one transaction. Refused whole
-- (TWFEN) unless p_epoch is the shard's stored epoch. Returns per job (in order):
-- 1 acked, 2 acked and moved to its next occurrence, 3 done already (a re-send).
CREATE FUNCTION tickwheel_ack(
    p_ns text, p_shard integer, p_epoch bigint, p_ids text[], p_attempts integer[],
    p_nominals bigint[], p_nexts bigint[])
RETURNS integer[]
LANGUAGE plpgsql AS $$
DECLARE
    v_cur bigint;
    v_out integer[] := '{}';
    v_n   integer;
BEGIN
    SELECT e.epoch INTO v_cur FROM tickwheel_shard_epochs e
        WHERE e.ns = p_ns AND e.shard = p_shard FOR SHARE;
    IF v_cur IS NULL OR v_cur <> p_epoch THEN
        RAISE EXCEPTION USING ERRCODE = 'TWFEN', DETAIL = coalesce(v_cur, 0)::text,
            MESSAGE = format('shard %s epoch is %s, caller has %s', p_shard,
                             coalesce(v_cur, 0), p_epoch);
    END IF;
    FOR k IN 1 .. coalesce(array_length(p_ids, 1), 0) LOOP
        INSERT INTO tickwheel_done (ns, id, nominal_ms, epoch, attempt)
        VALUES (p_ns, p_ids[k], p_nominals[k], p_epoch, p_attempts[k])
        ON CONFLICT DO NOTHING;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        IF v_n = 0 THEN
            v_out := v_out || 3;
        ELSIF p_nexts[k] > 0 THEN
            UPDATE tickwheel_jobs j SET due_ms = p_nexts[k], attempt = 1, epoch = p_epoch,
                updated_at = now()
            WHERE j.ns = p_ns AND j.id = p_ids[k] AND j.state = 0;
            v_out := v_out || 2;
        ELSE
            UPDATE tickwheel_jobs j SET state = 1, attempt = p_attempts[k], epoch = p_epoch,
                updated_at = now()
            WHERE j.ns = p_ns AND j.id = p_ids[k] AND j.state = 0;
            v_out := v_out || 1;
        END IF;
    END LOOP;
    RETURN v_out;
END
$$;

-- Delete outbox rows whose jobs were written to Redis by the producer itself. Losing
-- this delete in a crash is harmless (the relay writes the entry again, a no-op), so
-- its commit does not wait for the WAL flush.
CREATE FUNCTION tickwheel_relayed(p_ns text, p_seqs bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    DELETE FROM tickwheel_outbox o WHERE o.ns = p_ns AND o.seq = ANY(p_seqs);
END
$$;

-- A job's last attempt failed (or it was retried with final): it is dead, under epoch
-- p_epoch (refused whole, TWFEN, unless that is the shard's stored epoch). A dead row is
-- not pending, so reconcile does not bring it back; requeue and purge of dead letters
-- follow Redis with tickwheel_requeued / tickwheel_purged.
CREATE FUNCTION tickwheel_dead(
    p_ns text, p_shard integer, p_epoch bigint, p_id text, p_attempt integer)
RETURNS void
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
    UPDATE tickwheel_jobs j SET state = 2, attempt = p_attempt, epoch = p_epoch,
        updated_at = now()
    WHERE j.ns = p_ns AND j.id = p_id AND j.state = 0;
END
$$;
