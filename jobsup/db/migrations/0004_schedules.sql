-- Schedules (app.every): one row per schedule name, written by the supervisors whose app declares it.
-- A fire is identified by (name, fire time): `fired_through` is the watermark that makes it happen once.
-- Every supervisor fires a schedule in a transaction that locks its row, enqueues the fires in
-- (fired_through, now()] and moves fired_through to now(); the next one to take the lock finds nothing
-- left to do, so each fire is enqueued exactly once without a leader. (The unique index on
-- jobs.unique_key covers only live jobs, so it alone could not stop a late supervisor from enqueueing a
-- fire whose job had already finished.)
CREATE TABLE jobsup.schedules (
    name           text        PRIMARY KEY,
    kind           text        NOT NULL,
    expression     text        NOT NULL,   -- as declared: "0 3 * * *", "@daily", "30s"
    tz             text        NOT NULL DEFAULT 'UTC',
    payload        jsonb       NOT NULL DEFAULT '{}',
    queue          text        NOT NULL DEFAULT 'default',
    priority       integer     NOT NULL DEFAULT 0,
    max_attempts   integer     NOT NULL DEFAULT 3,
    missed         text        NOT NULL DEFAULT 'latest' CHECK (missed IN ('latest', 'none', 'all')),
    paused         boolean     NOT NULL DEFAULT false,
    -- Every fire at or before this was enqueued or skipped (paused, or by the missed-fire policy).
    fired_through  timestamptz NOT NULL DEFAULT now(),
    next_fire      timestamptz,
    last_fire      timestamptz,             -- the fire time of the last job enqueued (cron run: when)
    last_job_id    bigint,
    declared_at    timestamptz NOT NULL DEFAULT now(),
    -- The last supervisor that fired or watched this schedule, and when: a schedule no running app
    -- declares goes stale here and shows as orphaned.
    seen_at        timestamptz,
    seen_by        text
);
