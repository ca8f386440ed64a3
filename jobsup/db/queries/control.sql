-- Control by an operator: `jobsup cancel`, `retry`, `requeue-dead`, `pause` and `resume`
-- (jobsup/cli/<command>.py) and the console, through jobsup/ops/control.py. A cancel of a running job
-- sets cancelled_by (the request) and is announced as {"cancel": [ids] or null (too many to list: every
-- supervisor renews its leases now), "by": who}; the lease renewal (extend, lifecycle.sql) returns the
-- requests as well, as the backstop. A pause is announced as {"queue": name, "paused": true|false}; the
-- heartbeat (supervisors.sql) returns the paused queues, as the backstop. A handler's own verbs
-- (Snooze, RetryAfter, Discard) are outcome writes: lifecycle.sql.

-- name: jobs_status
-- The status of each of these ids that exists (`jobsup cancel` and `retry` refuse unknown ones first).
SELECT id, kind, status, attempts, run_at > now() AS waiting, locked_by, cancelled_by
FROM jobsup.jobs WHERE id = ANY(%(ids)s::bigint[])
ORDER BY id

-- name: cancel_jobs
-- `jobsup cancel`: by ids, or every live job of a kind (in a queue). A queued (or scheduled) job is
-- cancelled at once; a running one gets the request (cancelled_by) and its supervisor is told. Row by row
-- the UPDATE re-reads a row that changed under it, so a job claimed meanwhile gets the request.
WITH target AS (
    SELECT id FROM jobsup.jobs WHERE id = ANY(%(ids)s::bigint[])
    UNION ALL
    SELECT id FROM jobsup.jobs
    WHERE %(ids)s::bigint[] IS NULL AND status = 'queued' AND kind = %(kind)s::text
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
    UNION ALL
    SELECT id FROM jobsup.jobs
    WHERE %(ids)s::bigint[] IS NULL AND status = 'running' AND kind = %(kind)s::text
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
), changed AS (
    UPDATE jobsup.jobs j
    SET status = CASE WHEN j.status = 'queued' THEN 'cancelled' ELSE j.status END,
        done_at = CASE WHEN j.status = 'queued' THEN now() ELSE j.done_at END,
        cancelled_by = %(by)s::text,
        last_error = CASE WHEN j.status = 'queued' THEN 'cancelled by ' || %(by)s::text ELSE j.last_error END,
        errors = CASE WHEN j.status = 'queued'
                      THEN j.errors || jsonb_build_array(jsonb_build_object(
                               'attempt', j.attempts, 'at', now(), 'error', 'cancelled by ' || %(by)s::text,
                               'by', %(by)s::text))
                      ELSE j.errors END
    FROM target t
    WHERE j.id = t.id AND (j.status = 'queued' OR (j.status = 'running' AND j.cancelled_by IS NULL))
    RETURNING j.id, j.kind, j.queue, j.status, j.locked_by
), totals AS (
    INSERT INTO jobsup.kind_totals AS t (kind, slot, cancelled)
    SELECT kind, mod(pg_backend_pid(), 16)::smallint, count(*) FROM changed WHERE status = 'cancelled' GROUP BY kind
    ON CONFLICT (kind, slot) DO UPDATE SET cancelled = t.cancelled + excluded.cancelled
), told AS (
    -- One NOTIFY for every running job; past 500 ids (the 8000-byte limit) it names none, and every
    -- supervisor renews its leases at once, which returns the requests.
    SELECT pg_notify('jobsup', json_build_object(
               'cancel', CASE WHEN count(*) <= 500 THEN array_agg(id) END, 'by', %(by)s::text)::text)
    FROM changed WHERE status = 'running'
    HAVING count(*) > 0
)
SELECT id, kind, queue, status, locked_by, (SELECT count(*) FROM told) AS told FROM changed
ORDER BY id

-- name: retry_now
-- `jobsup retry`: a job waiting for its backoff (queued, run_at in the future, attempted before) is due
-- now; the NOTIFY wakes the supervisors of its queue.
WITH moved AS (
    UPDATE jobsup.jobs j SET run_at = now()
    WHERE j.id = ANY(%(ids)s::bigint[]) AND j.status = 'queued' AND j.attempts > 0 AND j.run_at > now()
    RETURNING j.id, j.queue
)
SELECT id, pg_notify('jobsup', json_build_object('queues', ARRAY[queue])::text) FROM moved

-- name: requeue_dead
-- Dead jobs back to the queue, attempts reset, their error history kept. Narrowed by ids, kind and
-- error (NULL means any); a job whose unique_key is live again is left dead rather than duplicated, and
-- of several dead jobs sharing a key only the newest goes back.
WITH picked AS (
    SELECT j.id, j.unique_key, row_number() OVER (PARTITION BY j.unique_key ORDER BY j.id DESC) AS nth
    FROM jobsup.jobs j
    WHERE j.status = 'dead'
      AND (%(ids)s::bigint[] IS NULL OR j.id = ANY(%(ids)s::bigint[]))
      AND (%(kind)s::text IS NULL OR j.kind = %(kind)s::text)
      AND (%(error)s::text IS NULL OR j.last_error = %(error)s::text)
      AND (j.unique_key IS NULL OR NOT EXISTS (
              SELECT 1 FROM jobsup.jobs o
              WHERE o.unique_key = j.unique_key AND o.status IN ('queued', 'running')))
), requeued AS (
    UPDATE jobsup.jobs j
    SET status = 'queued', attempts = 0, run_at = now(), done_at = NULL, started_at = NULL,
        locked_by = NULL, locked_until = NULL
    FROM picked p
    WHERE j.id = p.id AND j.status = 'dead' AND (p.unique_key IS NULL OR p.nth = 1)
    RETURNING j.id, j.kind, j.queue
), totals AS (
    INSERT INTO jobsup.kind_totals AS t (kind, slot, dead)
    SELECT kind, mod(pg_backend_pid(), 16)::smallint, -count(*) FROM requeued GROUP BY kind
    ON CONFLICT (kind, slot) DO UPDATE SET dead = t.dead + excluded.dead
)
SELECT id, pg_notify('jobsup', json_build_object('queues', ARRAY[queue])::text) FROM requeued

-- name: queue_pause
-- No row back when the queue was paused already.
WITH paused AS (
    INSERT INTO jobsup.queue_pauses (queue, paused_by) VALUES (%(queue)s, %(by)s)
    ON CONFLICT (queue) DO NOTHING
    RETURNING queue
)
SELECT queue, pg_notify('jobsup', json_build_object('queue', queue, 'paused', true)::text) FROM paused

-- name: queue_resume
WITH resumed AS (
    DELETE FROM jobsup.queue_pauses WHERE queue = %(queue)s RETURNING queue
)
SELECT queue, pg_notify('jobsup', json_build_object('queue', queue, 'paused', false)::text) FROM resumed

-- name: queue_pauses
SELECT queue, paused_at, paused_by FROM jobsup.queue_pauses ORDER BY queue
