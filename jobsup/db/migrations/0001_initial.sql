-- jobsup schema, version 1. Applied by `jobsup migrate` under an advisory lock, in one transaction.

CREATE TABLE jobsup.jobs (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue         text        NOT NULL DEFAULT 'default',
    kind          text        NOT NULL,
    payload       jsonb       NOT NULL DEFAULT '{}',
    status        text        NOT NULL DEFAULT 'queued'
                  CHECK (status IN ('queued', 'running', 'done', 'dead')),
    -- Higher runs first; ties go to the earlier run_at, then the lower id.
    priority      integer     NOT NULL DEFAULT 0,
    -- Counts claims: a handler sees attempts = 1 on its first run.
    attempts      integer     NOT NULL DEFAULT 0,
    max_attempts  integer     NOT NULL DEFAULT 3 CHECK (max_attempts >= 1),
    run_at        timestamptz NOT NULL DEFAULT now(),
    created_at    timestamptz NOT NULL DEFAULT now(),
    started_at    timestamptz,
    locked_until  timestamptz,
    locked_by     text,
    done_at       timestamptz,
    last_error    text,
    -- One entry per failed or interrupted attempt: {attempt, at, error, traceback, by}.
    errors        jsonb       NOT NULL DEFAULT '[]',
    unique_key    text
);

-- The hot queries touch only live rows, so these stay small however many finished jobs the table holds.
CREATE INDEX jobs_ready_idx ON jobsup.jobs (queue, priority DESC, run_at, id) WHERE status = 'queued';
CREATE INDEX jobs_running_idx ON jobsup.jobs (locked_until) WHERE status = 'running';
CREATE UNIQUE INDEX jobs_unique_key_idx ON jobsup.jobs (unique_key)
    WHERE unique_key IS NOT NULL AND status IN ('queued', 'running');
CREATE INDEX jobs_dead_idx ON jobsup.jobs (done_at DESC) WHERE status = 'dead';

-- Per-kind totals of finished jobs, kept with the outcome writes so the console never counts the table.
-- `done` and `failed` (attempts that failed) only grow; `dead` is the number of jobs dead now (requeue
-- lowers it). Writers spread over `slot` so concurrent supervisors never wait on one hot row; readers
-- sum the slots.
CREATE TABLE jobsup.kind_totals (
    kind    text     NOT NULL,
    slot    smallint NOT NULL,
    done    bigint   NOT NULL DEFAULT 0,
    failed  bigint   NOT NULL DEFAULT 0,
    dead    bigint   NOT NULL DEFAULT 0,
    PRIMARY KEY (kind, slot)
);

-- One row per live supervisor, upserted by its heartbeat, removed on a clean stop.
CREATE TABLE jobsup.supervisors (
    id            text        PRIMARY KEY,   -- the value it writes to jobs.locked_by
    host          text        NOT NULL,
    pid           integer     NOT NULL,
    version       text        NOT NULL,
    queues        text[]      NOT NULL,
    procs         integer     NOT NULL,
    started_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now(),
    state         text        NOT NULL DEFAULT 'running',
    -- [{pid, state, job_id, kind, job_started_at (ISO), rss (bytes), cpu (percent), jobs_done,
    --   restarts, last_exit}], state one of starting, idle, busy, stopping
    workers       jsonb       NOT NULL DEFAULT '[]',
    jobs_done     bigint      NOT NULL DEFAULT 0
);

-- Things the console shows that happened once: reaper passes that returned jobs.
CREATE TABLE jobsup.events (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    action      text        NOT NULL,
    supervisor  text,
    count       integer     NOT NULL,
    job_ids     bigint[]    NOT NULL DEFAULT '{}',
    detail      jsonb       NOT NULL DEFAULT '{}'
);
CREATE INDEX events_at_idx ON jobsup.events (at DESC);

-- One NOTIFY per INSERT statement, however many rows it inserted. The payload names at most 20 queues
-- (an empty list means "look at every queue") and the earliest run_at, so it stays far below the
-- 8000-byte limit whatever is inserted.
CREATE FUNCTION jobsup.notify_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    queues text[];
    earliest timestamptz;
BEGIN
    SELECT array_agg(DISTINCT queue), min(run_at) INTO queues, earliest FROM inserted;
    IF queues IS NULL THEN
        RETURN NULL;
    END IF;
    IF cardinality(queues) > 20 OR octet_length(array_to_string(queues, ',')) > 2000 THEN
        queues := '{}';
    END IF;
    PERFORM pg_notify('jobsup', json_build_object('queues', queues,
                                                  'run_at', extract(epoch FROM earliest))::text);
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_notify_inserted AFTER INSERT ON jobsup.jobs
    REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION jobsup.notify_inserted();
