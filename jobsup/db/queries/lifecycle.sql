-- The supervisor's statements on the jobs it runs, run by jobsup/db/lifecycle.py (and through it by the
-- supervisor and jobsup.testing.drain): claim; the outcome writes complete, fail, snooze, cancel_held
-- and release; release_orphans; the lease renewal (extend); the reaper (reap); and upcoming, for the
-- listener. claim_without_flush_wait is run by jobsup/supervisor/claimer.py.
--
-- The fence of every outcome write (docs/design/architecture.md, invariant 2): a row changes only
-- while it is still 'running' under the writer's locked_by and the same attempt, so a late result from
-- a supervisor whose lease was reaped changes nothing.
--
-- A handler's answer picks the write: a return complete, an exception fail, RetryAfter fail with its
-- delay, Snooze snooze, Discard cancel_held. A job whose cancel an operator requested (control.sql)
-- carries cancelled_by: whichever write ends its attempt makes it `cancelled`.

-- name: claim
-- One ordered scan of the ready index per queue (`queue = ANY(...)` would read and sort every ready
-- row), then the best `limit` of them. Rows locked here but not taken are free again at commit.
--
-- A queue's scan can start where the claimer's last one ended: its `after` key, the (priority, run_at,
-- id) of the last job it took there (NULL: start at the head). Every job claimed since the last vacuum
-- leaves a dead entry at the head of the ready index, and a scan from the head steps over all of them:
-- 120,000 into a backlog, 700 buffers and 12 ms for 100 jobs, against 6 buffers from the key. With a
-- key, the scan reads the levels above the key's priority from their head (so a job of a higher
-- priority is taken by the next claim; in a drain of one level this is one descent into an empty
-- range), then the key's level from the key on (an index range: `priority =` and a row comparison on
-- the next two columns), then the levels below. In that order the branches need no sort, and the
-- LIMIT stops the later ones unstarted. The key skips only what the claimer saw was not claimable in
-- its own level; the claimer forgets it whenever a job may have come back there (keys.py).
--
-- `kinds` (NULL: any) are the kinds the claimer's app can run: a job of another kind stays queued,
-- attempts untouched, for a supervisor that can run it. The index has no kind, so a claim steps over
-- such jobs where they stand ahead of its own; `jobsup doctor` and `jobsup check` name them.
--
-- Jobs of limited kinds are not in the ready index (`NOT limited` lets the scans use it): claim_limited
-- (migration 0008) takes them, and says which claim protocol it speaks, as the trigger
-- jobs_claim_protocol requires of a claim of a limited job. This claim takes none, so it says nothing:
-- a job marked limited after this statement's snapshot is locked FOR UPDATE and rechecked against the
-- new row, and passed over (one still being marked is locked, and skipped).
WITH picked AS (
    SELECT c.id
    FROM unnest(%(queues)s::text[], %(after_priorities)s::int[], %(after_run_ats)s::timestamptz[],
                %(after_ids)s::bigint[]) AS q(name, after_priority, after_run_at, after_id)
    CROSS JOIN LATERAL (
        SELECT * FROM (
            SELECT * FROM (
                SELECT id, priority, run_at FROM jobsup.jobs
                WHERE q.after_id IS NULL AND status = 'queued' AND queue = q.name AND run_at <= now()
                  AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[])) AND NOT limited
                ORDER BY priority DESC, run_at, id
                LIMIT %(limit)s
                FOR UPDATE SKIP LOCKED
            ) whole
            UNION ALL
            SELECT * FROM (
                SELECT id, priority, run_at FROM jobsup.jobs
                WHERE status = 'queued' AND queue = q.name AND priority > q.after_priority AND run_at <= now()
                  AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[])) AND NOT limited
                ORDER BY priority DESC, run_at, id
                LIMIT %(limit)s
                FOR UPDATE SKIP LOCKED
            ) above
            UNION ALL
            SELECT * FROM (
                SELECT id, priority, run_at FROM jobsup.jobs
                WHERE status = 'queued' AND queue = q.name AND priority = q.after_priority
                  AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[])) AND NOT limited
                  AND (run_at, id) > (q.after_run_at, q.after_id) AND run_at <= now()
                ORDER BY run_at, id
                LIMIT %(limit)s
                FOR UPDATE SKIP LOCKED
            ) level
            UNION ALL
            SELECT * FROM (
                SELECT id, priority, run_at FROM jobsup.jobs
                WHERE status = 'queued' AND queue = q.name AND priority < q.after_priority AND run_at <= now()
                  AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[])) AND NOT limited
                ORDER BY priority DESC, run_at, id
                LIMIT %(limit)s
                FOR UPDATE SKIP LOCKED
            ) below
        ) branches
        LIMIT %(limit)s
    ) c
    ORDER BY c.priority DESC, c.run_at, c.id
    LIMIT %(limit)s
)
UPDATE jobsup.jobs j
SET status = 'running', attempts = j.attempts + 1, locked_by = %(locked_by)s,
    locked_until = now() + make_interval(secs => %(lease)s::float8), started_at = now()
FROM picked
WHERE j.id = picked.id
-- The columns of jobsup.job.Job, in its order. errors is NULL for a job with no history (most of them),
-- so the client decodes no JSON for it.
RETURNING j.id, j.kind, j.payload, j.queue, j.attempts, j.max_attempts, j.priority, j.run_at, j.created_at,
          j.snoozes, nullif(j.errors, '[]'::jsonb), j.started_at, j.key, j.meta

-- name: claim_limited
-- Up to `limit` jobs of the limited `kinds` (sorted: claims lock the kinds' rows in one order), each
-- row a Job's columns and wake_at; a row without an id carries only wake_at, when a rate lets the next
-- start happen. The function is claim_limited of migration 0008, with each job's meta (migration 0010).
SELECT * FROM jobsup.claim_limited_with_meta(%(kinds)s::text[], %(queues)s::text[], %(limit)s, %(locked_by)s,
                                             %(lease)s::float8)

-- name: claim_without_flush_wait
-- Behind a transaction pooler, the claims connection's session setting (synchronous_commit=off, see
-- the supervisor) is set by each claim's own transaction instead.
SET LOCAL synchronous_commit = off

-- name: complete
-- `j.id = ANY(ids)` bounds every plan by the ids given: whatever the statistics say (a supervisor's
-- fresh locked_by has none, and estimates multiply to "one row"), the planner cannot pick a plan that
-- reads the table once per outcome. Two more things keep it on that primary-key path:
-- - the fence's status is `(SELECT 'running')`: as a bare constant it lets the planner answer the fence
--   from the partial index of running jobs, which it believes nearly empty whenever statistics were
--   taken with few jobs running (as after a burst was enqueued), and then every write reads every
--   running job of every supervisor, heap row and all (at 8 claimers x 100, 9 index and 4.6 heap rows
--   per job written); an InitPlan's value is unknown when the plan is made, so that index cannot serve;
-- - each row's attempt is looked up by its position among the ids, not by joining unnest(ids, attempts):
--   the generic plan of that join, which a prepared statement soon uses, rescans the pairs through the
--   executor for every row found. array_position compares integers instead, n^2/2 of them: ~0.1 ms for
--   100 outcomes, a few ms for the 1000 the supervisor writes at most.
-- return_values (JSON texts, by the ids' positions) is NULL when no job of the batch returned
-- anything: a subscript of a NULL array is NULL without its position being looked up, so a batch of
-- handlers that return None costs what it did before return values were stored.
WITH done AS (
    UPDATE jobsup.jobs j
    SET status = 'done', done_at = now(), locked_until = NULL,
        return_value = (%(return_values)b::text[])[array_position(%(ids)b::bigint[], j.id)]::jsonb
    WHERE j.id = ANY(%(ids)b::bigint[])
      AND j.attempts = (%(attempts)b::int[])[array_position(%(ids)b::bigint[], j.id)]
      AND j.status = (SELECT 'running'::text) AND j.locked_by = %(locked_by)s
    RETURNING j.id, j.kind
), totals AS (
    INSERT INTO jobsup.kind_totals AS t (kind, slot, done)
    SELECT kind, mod(pg_backend_pid(), 16)::smallint, count(*) FROM done GROUP BY kind
    ON CONFLICT (kind, slot) DO UPDATE SET done = t.done + excluded.done
)
SELECT id FROM done

-- name: fail
-- Retry after min(cap, base * 2^(attempt-1)) seconds, less up to `jitter` of it at random, so the cap
-- holds and retries of a burst spread out; the attempt that reaches max_attempts buries the job.
-- A delay given (RetryAfter: NULL for the others) replaces the backoff. A job whose cancel was
-- requested (control) is `cancelled` instead: never retried.
WITH failed AS (
    UPDATE jobsup.jobs j
    SET status = CASE WHEN j.cancelled_by IS NOT NULL THEN 'cancelled'
                      WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'queued' END,
        run_at = CASE WHEN j.attempts >= j.max_attempts OR j.cancelled_by IS NOT NULL THEN j.run_at
                      WHEN o.delay IS NOT NULL THEN now() + make_interval(secs => o.delay)
                      ELSE now() + make_interval(secs =>
                               least(%(backoff_cap)s::float8,
                                     %(backoff_base)s::float8 * power(2, least(j.attempts - 1, 60)))
                               * (1 - %(jitter)s::float8 * random())) END,
        done_at = CASE WHEN j.attempts >= j.max_attempts OR j.cancelled_by IS NOT NULL THEN now() END,
        locked_until = NULL,
        locked_by = CASE WHEN j.attempts >= j.max_attempts OR j.cancelled_by IS NOT NULL THEN j.locked_by END,
        last_error = o.error,
        errors = j.errors || jsonb_build_array(jsonb_build_object(
            'attempt', j.attempts, 'at', now(), 'error', o.error, 'traceback', o.traceback,
            'by', %(locked_by)s))
    FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(errors)s::text[], %(tracebacks)s::text[],
                %(delays)s::float8[])
         AS o(id, attempt, error, traceback, delay)
    WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = o.id AND j.attempts = o.attempt  -- bounded: see complete
      AND j.status = 'running' AND j.locked_by = %(locked_by)s
    RETURNING j.id, j.kind, j.status, j.run_at
), totals AS (
    INSERT INTO jobsup.kind_totals AS t (kind, slot, failed, dead, cancelled)
    SELECT kind, mod(pg_backend_pid(), 16)::smallint, count(*), count(*) FILTER (WHERE status = 'dead'),
           count(*) FILTER (WHERE status = 'cancelled') FROM failed GROUP BY kind
    ON CONFLICT (kind, slot) DO UPDATE SET failed = t.failed + excluded.failed, dead = t.dead + excluded.dead,
                                           cancelled = t.cancelled + excluded.cancelled
)
SELECT id, status, run_at FROM failed

-- name: snooze
-- Snooze(seconds): the attempt is given back, the snooze counted, and the job queued again after the
-- delay (fenced as every outcome write). Recorded in errors with its snooze number; last_error is kept.
WITH snoozed AS (
    UPDATE jobsup.jobs j
    SET status = CASE WHEN j.cancelled_by IS NULL THEN 'queued' ELSE 'cancelled' END,
        done_at = CASE WHEN j.cancelled_by IS NOT NULL THEN now() END,
        attempts = CASE WHEN j.cancelled_by IS NULL THEN j.attempts - 1 ELSE j.attempts END,
        snoozes = j.snoozes + 1,
        run_at = now() + make_interval(secs => o.delay),
        locked_until = NULL, started_at = NULL,
        locked_by = CASE WHEN j.cancelled_by IS NOT NULL THEN j.locked_by END,
        errors = j.errors || jsonb_build_array(jsonb_build_object(
            'attempt', j.attempts, 'at', now(), 'error', o.reason, 'snooze', j.snoozes + 1,
            'by', %(locked_by)s))
    FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(delays)s::float8[], %(reasons)s::text[])
         AS o(id, attempt, delay, reason)
    WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = o.id AND j.attempts = o.attempt  -- bounded: see complete
      AND j.status = 'running' AND j.locked_by = %(locked_by)s
    RETURNING j.id, j.kind, j.status, j.run_at
), totals AS (
    INSERT INTO jobsup.kind_totals AS t (kind, slot, cancelled)
    SELECT kind, mod(pg_backend_pid(), 16)::smallint, count(*) FROM snoozed WHERE status = 'cancelled' GROUP BY kind
    ON CONFLICT (kind, slot) DO UPDATE SET cancelled = t.cancelled + excluded.cancelled
)
SELECT id, status, run_at FROM snoozed

-- name: cancel_held
-- A held job becomes `cancelled` (fenced): a Discard (reason given, cancelled_by 'handler'), or a job
-- whose worker was stopped on an operator's request (reason NULL: "cancelled by <who>").
WITH cancelled AS (
    UPDATE jobsup.jobs j
    SET status = 'cancelled', done_at = now(), locked_until = NULL,
        cancelled_by = coalesce(j.cancelled_by, o.by),
        last_error = coalesce(o.reason, 'cancelled by ' || coalesce(j.cancelled_by, o.by, '?')),
        errors = j.errors || jsonb_build_array(jsonb_build_object(
            'attempt', j.attempts, 'at', now(),
            'error', coalesce(o.reason, 'cancelled by ' || coalesce(j.cancelled_by, o.by, '?')),
            'traceback', o.traceback, 'by', %(locked_by)s))
    FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(reasons)s::text[], %(tracebacks)s::text[],
                %(bys)s::text[]) AS o(id, attempt, reason, traceback, by)
    WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = o.id AND j.attempts = o.attempt  -- bounded: see complete
      AND j.status = 'running' AND j.locked_by = %(locked_by)s
    RETURNING j.id, j.kind
), totals AS (
    INSERT INTO jobsup.kind_totals AS t (kind, slot, cancelled)
    SELECT kind, mod(pg_backend_pid(), 16)::smallint, count(*) FROM cancelled GROUP BY kind
    ON CONFLICT (kind, slot) DO UPDATE SET cancelled = t.cancelled + excluded.cancelled
)
SELECT id FROM cancelled

-- name: release
-- Hands back jobs this supervisor holds without counting the attempt: prefetched jobs never started,
-- and (with a reason) jobs interrupted by shutdown, which are never buried for it. One whose cancel
-- was requested (control) becomes `cancelled` rather than queued.
WITH released AS (
    UPDATE jobsup.jobs j
    SET status = CASE WHEN j.cancelled_by IS NULL THEN 'queued' ELSE 'cancelled' END,
        done_at = CASE WHEN j.cancelled_by IS NOT NULL THEN now() END,
        attempts = j.attempts - 1, locked_by = NULL, locked_until = NULL,
        started_at = NULL,
        last_error = coalesce(o.reason, j.last_error),
        errors = CASE WHEN o.reason IS NULL THEN j.errors
                      ELSE j.errors || jsonb_build_array(jsonb_build_object(
                               'attempt', j.attempts, 'at', now(), 'error', o.reason, 'by', %(locked_by)s))
                 END
    FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(reasons)s::text[]) AS o(id, attempt, reason)
    WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = o.id AND j.attempts = o.attempt  -- bounded: see complete
      AND j.status = 'running' AND j.locked_by = %(locked_by)s
    RETURNING j.id, j.queue
)
-- PostgreSQL folds identical notifications of one transaction into one: one per queue.
SELECT id, pg_notify('jobsup', json_build_object('queues', ARRAY[queue])::text) FROM released

-- name: release_orphans
-- After a claim whose answer was lost with its connection: the rows it took are running under this
-- supervisor but unknown to it. Hand them back without counting the attempt, rather than wait for the
-- reaper to count it.
WITH released AS (
    UPDATE jobsup.jobs j
    SET status = 'queued', attempts = j.attempts - 1, locked_by = NULL, locked_until = NULL, started_at = NULL
    WHERE j.status = 'running' AND j.locked_by = %(locked_by)s AND NOT (j.id = ANY(%(held)s::bigint[]))
    RETURNING j.id, j.queue
)
SELECT id, pg_notify('jobsup', json_build_object('queues', ARRAY[queue])::text) FROM released

-- name: extend
UPDATE jobsup.jobs j
SET locked_until = now() + make_interval(secs => %(lease)s::float8)
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS o(id, attempt)
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = o.id AND j.attempts = o.attempt  -- bounded: see complete
  AND j.status = 'running' AND j.locked_by = %(locked_by)s
-- cancelled_by: a cancel request (control); the renewal is the backstop of its NOTIFY.
RETURNING j.id, j.cancelled_by

-- name: reap
-- Returns jobs whose lease ran out (their supervisor died or stalled). The lost attempt counts, so a job
-- that keeps killing its supervisor is buried after max_attempts like any other failure.
WITH expired AS (
    SELECT id, locked_by FROM jobsup.jobs
    WHERE status = 'running' AND locked_until < now()
    ORDER BY locked_until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), reaped AS (
    UPDATE jobsup.jobs j
    SET status = CASE WHEN j.cancelled_by IS NOT NULL THEN 'cancelled'  -- requested (control)
                      WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'queued' END,
        done_at = CASE WHEN j.attempts >= j.max_attempts OR j.cancelled_by IS NOT NULL THEN now() END,
        run_at = now(), locked_until = NULL, locked_by = NULL,
        last_error = 'lease expired: ' || coalesce(e.locked_by, '?') || ' stopped renewing it',
        errors = j.errors || jsonb_build_array(jsonb_build_object(
            'attempt', j.attempts, 'at', now(),
            'error', 'lease expired: ' || coalesce(e.locked_by, '?') || ' stopped renewing it',
            'by', %(reaper)s::text))
    FROM expired e
    WHERE j.id = e.id
    RETURNING j.id, j.kind, j.queue, j.status, e.locked_by
), totals AS (
    INSERT INTO jobsup.kind_totals AS t (kind, slot, failed, dead, cancelled)
    SELECT kind, mod(pg_backend_pid(), 16)::smallint, count(*), count(*) FILTER (WHERE status = 'dead'),
           count(*) FILTER (WHERE status = 'cancelled') FROM reaped GROUP BY kind
    ON CONFLICT (kind, slot) DO UPDATE SET failed = t.failed + excluded.failed, dead = t.dead + excluded.dead,
                                           cancelled = t.cancelled + excluded.cancelled
), event AS (
    INSERT INTO jobsup.events (action, supervisor, count, job_ids, detail)
    SELECT 'reaped', %(reaper)s::text, count(*), array_agg(id ORDER BY id),
           jsonb_build_object('from', jsonb_agg(DISTINCT locked_by),
                              'dead', count(*) FILTER (WHERE status = 'dead'))
    FROM reaped
    HAVING count(*) > 0
)
SELECT id, kind, status, locked_by, pg_notify('jobsup', json_build_object('queues', ARRAY[queue])::text)
FROM reaped

-- name: upcoming
-- The soonest future run_at times of the given queues, in epoch seconds. The listener asks whenever it
-- has just started listening: a delayed job enqueued while nobody listened sent its NOTIFY to no one,
-- and without this it would wait for the poll. The ready index orders by priority before run_at, so a
-- plain ORDER BY run_at reads every queued entry (300 ms with 1M scheduled jobs, at the moment a
-- restarted server has every supervisor reconnecting). Instead, walk the index's priority levels
-- (each found by one descent) and take the soonest of each: 0.4 ms for the same million.
WITH RECURSIVE levels AS (
    SELECT q.name AS queue,
           (SELECT max(priority) FROM jobsup.jobs WHERE status = 'queued' AND queue = q.name) AS priority
    FROM unnest(%(queues)s::text[]) AS q(name)
    UNION ALL
    SELECT l.queue,
           (SELECT max(priority) FROM jobsup.jobs
            WHERE status = 'queued' AND queue = l.queue AND priority < l.priority)
    FROM levels l
    WHERE l.priority IS NOT NULL
)
SELECT extract(epoch FROM s.run_at)::float8
FROM levels l
CROSS JOIN LATERAL (
    SELECT run_at FROM jobsup.jobs
    WHERE status = 'queued' AND queue = l.queue AND priority = l.priority AND run_at > now()
    ORDER BY run_at
    LIMIT %(limit)s
) s
ORDER BY s.run_at
LIMIT %(limit)s
