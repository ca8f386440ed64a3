-- Django's Tasks framework (jobsup/django.py): a task enqueued through Django's own connection, and its
-- result read back.

-- name: task_enqueue
-- One task, inserted through Django's own connection (so inside the caller's atomic() block); the
-- insert trigger's NOTIFY goes out at commit like any enqueue's. created_at is the database's clock.
INSERT INTO jobsup.jobs (queue, kind, payload, priority, run_at, max_attempts)
VALUES (%(queue)s, %(kind)s, %(payload)s::jsonb, %(priority)s, coalesce(%(run_at)s::timestamptz, now()),
        %(max_attempts)s)
RETURNING id, created_at

-- name: task_result
SELECT id, kind, queue, payload, status, priority, attempts, run_at, created_at, started_at, done_at,
       locked_by, errors, return_value
FROM jobsup.jobs WHERE id = %(id)s
