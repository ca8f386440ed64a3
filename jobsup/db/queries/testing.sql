-- jobsup.testing (jobsup/testing.py): drain and the enqueued-job assertions, for tests of an app's
-- handlers. The drain's claims and outcome writes are the supervisor's own (lifecycle.sql).

-- name: testing_queues
-- jobsup.testing.drain with no queues given: every queue that has queued jobs.
SELECT DISTINCT queue FROM jobsup.jobs WHERE status = 'queued' ORDER BY queue

-- name: testing_due_now
-- drain(with_scheduled=True): what waits (a retry, a snooze, a delayed job) is due now.
UPDATE jobsup.jobs SET run_at = now()
WHERE status = 'queued' AND run_at > now() AND queue = ANY(%(queues)s::text[])
RETURNING id

-- name: testing_enqueued
-- jobsup.testing.enqueued: jobs of a kind (NULL: any) whose payload contains the given subset.
SELECT id, kind, queue, payload, status, priority, attempts, max_attempts, run_at, snoozes
FROM jobsup.jobs
WHERE (%(kind)s::text IS NULL OR kind = %(kind)s::text) AND payload @> %(subset)s::jsonb
ORDER BY id
