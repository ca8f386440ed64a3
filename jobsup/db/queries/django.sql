-- Django's Tasks framework (jobsup/django.py): a task's result read back. Its enqueue is jobs.sql's
-- `enqueue`, run on Django's own connection (so inside the caller's atomic() block).

-- name: task_result
SELECT id, kind, queue, payload, status, priority, attempts, run_at, created_at, started_at, done_at,
       locked_by, errors, return_value
FROM jobsup.jobs WHERE id = %(id)s
