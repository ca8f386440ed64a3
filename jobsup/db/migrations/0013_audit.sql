-- jobsup schema, version 13: the audit. One row per action an operator took through the web console
-- (requeue, cancel, retry, pause and resume of a queue or a schedule, a change of limits): who, what,
-- on which jobs or which queue, schedule or kind, and when. Written in the transaction of the action
-- itself, so a row exists exactly when the action committed.
--
-- Pruned with the events, by the same window (--keep-events; a week by default), in bounded batches
-- found through audit_at_idx (retention.sql, prune_audit).
--
-- Upgrading needs no stop: a new table, no lock on the jobs.
CREATE TABLE jobsup.audit (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT now(),
    who text NOT NULL,             -- the user's name (a login, a host app's user, or `token` without auth)
    role text NOT NULL,            -- operator, or what the host app named
    action text NOT NULL,          -- requeue, cancel, retry, pause, resume, limit, ...
    target text NOT NULL,          -- what it acted on, in words: `job 42`, `kind email`, `queue mail`
    job_ids bigint[] NOT NULL DEFAULT '{}',  -- the jobs it changed, when it changed jobs
    detail text NOT NULL DEFAULT '' -- what it did, as the page said it
);
CREATE INDEX audit_at_idx ON jobsup.audit (at DESC);
