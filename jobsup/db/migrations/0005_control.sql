-- jobsup schema, version 5: control. The `cancelled` status, a job's snooze count, a cancel request on
-- a running job, and paused queues.

-- `cancelled`: stopped on purpose (an operator's `jobsup cancel`, a handler's Discard), never retried,
-- kept and pruned like a dead job (jobs_finished_idx of 0002 names it already).
--
-- The jobs table may hold millions of rows. Replacing the CHECK the plain way (DROP, then ADD) makes
-- PostgreSQL read every row to validate the new one while this transaction holds the table's ACCESS
-- EXCLUSIVE lock: every claim and outcome write waits for the whole scan. The new check allows a
-- superset of what the old one did, so every row already satisfies it: it is added NOT VALID (no scan;
-- new and updated rows are checked all the same), in the same ALTER that drops the old one, so the lock
-- is held for the catalog change only. `ALTER TABLE jobsup.jobs VALIDATE CONSTRAINT jobs_status_check`
-- marks it validated if wanted; it scans under SHARE UPDATE EXCLUSIVE, which blocks no claim or write.
ALTER TABLE jobsup.jobs
    DROP CONSTRAINT jobs_status_check,
    ADD CONSTRAINT jobs_status_check
        CHECK (status IN ('queued', 'running', 'done', 'dead', 'cancelled')) NOT VALID;

-- Adding a column with a constant default (or none) is a catalog change since PostgreSQL 11: no rewrite.
-- snoozes: how many times a handler raised Snooze (each gave its attempt back).
ALTER TABLE jobsup.jobs ADD COLUMN snoozes integer NOT NULL DEFAULT 0;
-- cancelled_by: who stopped the job (`user@host` of a `jobsup cancel`, or `handler` for a Discard).
-- On a running job it is the cancel request itself: the supervisor holding it learns of it by NOTIFY or
-- from its next lease renewal, stops the worker and writes `cancelled`; a failure, reap or release of a
-- job with a request writes `cancelled` too, so a requested job is never run again.
ALTER TABLE jobsup.jobs ADD COLUMN cancelled_by text;

-- Jobs cancelled ever, per kind (as `done`): the console's and stats' `cancelled` column.
ALTER TABLE jobsup.kind_totals ADD COLUMN cancelled bigint NOT NULL DEFAULT 0;

-- A paused queue: no supervisor claims from it while its row exists (running jobs finish). Supervisors
-- read the table at start and with every heartbeat, and hear each change at once on the jobsup channel
-- as {"queue": name, "paused": true|false}. Empty, it costs the claim nothing: the supervisor leaves
-- paused queues out of the claim's queue list, so the claim never reads this table.
CREATE TABLE jobsup.queue_pauses (
    queue      text        PRIMARY KEY,
    paused_at  timestamptz NOT NULL DEFAULT now(),
    paused_by  text
);
