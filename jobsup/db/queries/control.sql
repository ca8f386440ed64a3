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
-- `jobsup cancel`: by ids, every live job of a kind (in a queue), or every live job of a workflow. A
-- waiting, queued (or scheduled) job is cancelled at once; a running one gets the request (cancelled_by)
-- and its supervisor is told. Row by row the UPDATE re-reads a row that changed under it, so a job
-- claimed meanwhile gets the request. The jobs that wait for a job cancelled here are settled by the
-- trigger jobs_finished (migration 0009) at the end of this statement: cancel_followed reads what it did.
WITH target AS (
    SELECT id FROM jobsup.jobs WHERE id = ANY(%(ids)s::bigint[])
    UNION ALL
    SELECT id FROM jobsup.jobs
    WHERE %(kind)s::text IS NOT NULL AND status = 'queued' AND kind = %(kind)s::text
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
    UNION ALL
    SELECT id FROM jobsup.jobs
    WHERE %(kind)s::text IS NOT NULL AND status = 'running' AND kind = %(kind)s::text
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
    UNION ALL
    SELECT id FROM jobsup.jobs
    WHERE %(kind)s::text IS NOT NULL AND status = 'waiting' AND kind = %(kind)s::text
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
    UNION ALL
    -- jobs_workflow_idx: the workflow's unfinished jobs, however many it has finished.
    SELECT id FROM jobsup.jobs
    WHERE workflow_id = %(workflow)s::bigint AND status IN ('waiting', 'queued', 'running')
), locked AS (
    -- In id order, as settle_children locks the children of a parent whose outcome is being written:
    -- a cancel of parents and children together never holds a child that such a write waits for while
    -- it waits for that parent.
    SELECT j.id FROM jobsup.jobs j WHERE j.id IN (SELECT id FROM target) ORDER BY j.id FOR NO KEY UPDATE
), changed AS (
    UPDATE jobsup.jobs j
    SET status = CASE WHEN j.status IN ('waiting', 'queued') THEN 'cancelled' ELSE j.status END,
        done_at = CASE WHEN j.status IN ('waiting', 'queued') THEN now() ELSE j.done_at END,
        cancelled_by = %(by)s::text,
        last_error = CASE WHEN j.status IN ('waiting', 'queued') THEN 'cancelled by ' || %(by)s::text
                          ELSE j.last_error END,
        errors = CASE WHEN j.status IN ('waiting', 'queued')
                      THEN j.errors || jsonb_build_array(jsonb_build_object(
                               'attempt', j.attempts, 'at', now(), 'error', 'cancelled by ' || %(by)s::text,
                               'by', %(by)s::text))
                      ELSE j.errors END
    FROM locked t
    WHERE j.id = t.id AND (j.status IN ('waiting', 'queued') OR (j.status = 'running' AND j.cancelled_by IS NULL))
    -- RETURNING sees the new row only: a job that was waiting still counts parents it waited for, where
    -- a queued one has none left (settle_children brings the count to 0 as it queues a job).
    RETURNING j.id, j.kind, j.queue, j.status, j.locked_by, j.parents_left > 0 AS was_waiting
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
SELECT id, kind, queue, status, locked_by, was_waiting, (SELECT count(*) FROM told) AS told FROM changed
ORDER BY id

-- name: cancel_followed
-- What the trigger jobs_finished did, in this transaction, to the jobs that wait for the jobs cancel_jobs
-- just cancelled (%(ids)s): those it cancelled under the policy 'cancel' (transitively: cancelled_by
-- 'workflow' at this transaction's now(), reached through 'cancel' dependencies), and those under 'run'
-- it queued (each was waiting while its parent had not finished, so queued now means released now).
-- The walk follows dependencies by parent_id, the leading column of their primary key.
WITH RECURSIVE gone(id) AS (
    SELECT unnest(%(ids)s::bigint[])
    UNION
    SELECT c.id FROM gone g
    JOIN jobsup.dependencies e ON e.parent_id = g.id AND e.on_parent_failure = 'cancel'
    JOIN jobsup.jobs c ON c.id = e.child_id
    WHERE c.status = 'cancelled' AND c.cancelled_by = 'workflow' AND c.done_at = now()
)
SELECT c.id, c.kind, 'cascaded' AS action, c.status, c.last_error AS note
FROM gone g JOIN jobsup.jobs c ON c.id = g.id
WHERE NOT c.id = ANY(%(ids)s::bigint[])
UNION ALL
SELECT c.id, c.kind, 'released', c.status,
       'queued: it waited for job ' || min(e.parent_id) || ' with on_parent_failure run'
FROM gone g
JOIN jobsup.dependencies e ON e.parent_id = g.id AND e.on_parent_failure = 'run'
JOIN jobsup.jobs c ON c.id = e.child_id
WHERE c.status = 'queued'
GROUP BY c.id
ORDER BY 1

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
