-- 0008: the pause state of the Postgres mode (issue 34), of record here as the jobs are.
-- Pause and resume write it in a transaction that holds the namespace's pause lock while
-- they write Redis; reconcile puts it back in Redis (under the same lock) after a loss.
-- (0007 is another change's: migrations are applied by number, each once.)
CREATE TABLE tickwheel_paused (
    ns       text   NOT NULL,
    -- the paused task's name; '' for the whole namespace
    task     text   NOT NULL,
    -- when it was paused first (Unix ms): pausing what is paused keeps it
    since_ms bigint NOT NULL,
    PRIMARY KEY (ns, task)
);
