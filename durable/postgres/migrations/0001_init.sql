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
CREATE INDEX tickwheel_jobs_pending_due ON tickwheel_jobs (ns, due_ms) WHERE state = 0;

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
