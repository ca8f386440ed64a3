-- Every statement jobsup sends, by name. Python calls them by name (jobsup/sql.py); none is assembled
-- from strings at run time. Parameters are psycopg's %(name)s placeholders.
--
-- The fence of every outcome write (DESIGN.md, invariant 2): a row changes only while it is still
-- 'running' under the writer's locked_by and the same attempt, so a late result from a supervisor whose
-- lease was reaped changes nothing.

-- name: enqueue
INSERT INTO jobsup.jobs (queue, kind, payload, priority, run_at, max_attempts, unique_key)
VALUES (%(queue)s, %(kind)s, %(payload)s::jsonb, %(priority)s,
        coalesce(%(run_at)s::timestamptz, now()) + make_interval(secs => %(delay)s::float8),
        %(max_attempts)s, %(unique_key)s)
ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND status IN ('queued', 'running') DO NOTHING
RETURNING id

-- name: enqueue_many
-- One statement for any number of jobs. Rows are inserted in input order, so ids ascend with it;
-- a duplicate unique_key (of a live job, or earlier in the same batch) is skipped. The arrays go as
-- binary parameters: as text, psycopg would escape every element, each '"' of each payload included,
-- which took longer than the insert itself.
INSERT INTO jobsup.jobs (queue, kind, payload, priority, run_at, max_attempts, unique_key)
SELECT q, k, p::jsonb, pr, coalesce(r, now()) + make_interval(secs => d), m, u
FROM unnest(%(queues)b::text[], %(kinds)b::text[], %(payloads)b::text[], %(priorities)b::int[],
            %(run_ats)b::timestamptz[], %(delays)b::float8[], %(max_attempts)b::int[],
            %(unique_keys)b::text[]) WITH ORDINALITY AS t(q, k, p, pr, r, d, m, u, n)
ORDER BY n
ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND status IN ('queued', 'running') DO NOTHING
RETURNING id, unique_key

-- name: enqueue_many_unkeyed
-- enqueue_many for a batch where no job has a unique_key, so nothing can conflict. Without ON CONFLICT
-- each row is a plain insert instead of a speculative one (a lock taken and released and one more WAL
-- record per row), which makes a large batch about a tenth faster.
INSERT INTO jobsup.jobs (queue, kind, payload, priority, run_at, max_attempts)
SELECT q, k, p::jsonb, pr, coalesce(r, now()) + make_interval(secs => d), m
FROM unnest(%(queues)b::text[], %(kinds)b::text[], %(payloads)b::text[], %(priorities)b::int[],
            %(run_ats)b::timestamptz[], %(delays)b::float8[], %(max_attempts)b::int[])
     WITH ORDINALITY AS t(q, k, p, pr, r, d, m, n)
ORDER BY n
RETURNING id

-- name: claim
-- One ordered scan of the ready index per queue (`queue = ANY(...)` would read and sort every ready
-- row), then the best `limit` of them. Rows locked here but not taken are free again at commit.
WITH picked AS (
    SELECT c.id
    FROM unnest(%(queues)s::text[]) AS q(name)
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at FROM jobsup.jobs
        WHERE status = 'queued' AND queue = q.name AND run_at <= now()
        ORDER BY priority DESC, run_at, id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) c
    ORDER BY c.priority DESC, c.run_at, c.id
    LIMIT %(limit)s
)
UPDATE jobsup.jobs j
SET status = 'running', attempts = j.attempts + 1, locked_by = %(locked_by)s,
    locked_until = now() + make_interval(secs => %(lease)s::float8), started_at = now()
FROM picked
WHERE j.id = picked.id
-- The columns of jobsup.job.Job, in its order.
RETURNING j.id, j.kind, j.payload, j.queue, j.attempts, j.max_attempts, j.priority, j.run_at, j.created_at

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
WITH done AS (
    UPDATE jobsup.jobs j
    SET status = 'done', done_at = now(), locked_until = NULL
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
WITH failed AS (
    UPDATE jobsup.jobs j
    SET status = CASE WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'queued' END,
        run_at = CASE WHEN j.attempts >= j.max_attempts THEN j.run_at
                      ELSE now() + make_interval(secs =>
                               least(%(backoff_cap)s::float8,
                                     %(backoff_base)s::float8 * power(2, least(j.attempts - 1, 60)))
                               * (1 - %(jitter)s::float8 * random())) END,
        done_at = CASE WHEN j.attempts >= j.max_attempts THEN now() END,
        locked_until = NULL,
        locked_by = CASE WHEN j.attempts >= j.max_attempts THEN j.locked_by END,
        last_error = o.error,
        errors = j.errors || jsonb_build_array(jsonb_build_object(
            'attempt', j.attempts, 'at', now(), 'error', o.error, 'traceback', o.traceback,
            'by', %(locked_by)s))
    FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(errors)s::text[], %(tracebacks)s::text[])
         AS o(id, attempt, error, traceback)
    WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = o.id AND j.attempts = o.attempt  -- bounded: see complete
      AND j.status = 'running' AND j.locked_by = %(locked_by)s
    RETURNING j.id, j.kind, j.status, j.run_at
), totals AS (
    INSERT INTO jobsup.kind_totals AS t (kind, slot, failed, dead)
    SELECT kind, mod(pg_backend_pid(), 16)::smallint, count(*), count(*) FILTER (WHERE status = 'dead') FROM failed GROUP BY kind
    ON CONFLICT (kind, slot) DO UPDATE SET failed = t.failed + excluded.failed, dead = t.dead + excluded.dead
)
SELECT id, status, run_at FROM failed

-- name: release
-- Hands back jobs this supervisor holds without counting the attempt: prefetched jobs never started,
-- and (with a reason) jobs interrupted by shutdown, which are never buried for it.
WITH released AS (
    UPDATE jobsup.jobs j
    SET status = 'queued', attempts = j.attempts - 1, locked_by = NULL, locked_until = NULL,
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

-- name: extend
UPDATE jobsup.jobs j
SET locked_until = now() + make_interval(secs => %(lease)s::float8)
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS o(id, attempt)
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = o.id AND j.attempts = o.attempt  -- bounded: see complete
  AND j.status = 'running' AND j.locked_by = %(locked_by)s
RETURNING j.id

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
    SET status = CASE WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'queued' END,
        done_at = CASE WHEN j.attempts >= j.max_attempts THEN now() END,
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
    INSERT INTO jobsup.kind_totals AS t (kind, slot, failed, dead)
    SELECT kind, mod(pg_backend_pid(), 16)::smallint, count(*), count(*) FILTER (WHERE status = 'dead') FROM reaped GROUP BY kind
    ON CONFLICT (kind, slot) DO UPDATE SET failed = t.failed + excluded.failed, dead = t.dead + excluded.dead
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

-- name: live_counts
-- Queued and running jobs by kind and queue; each half reads only its partial index.
SELECT kind, queue,
       count(*) FILTER (WHERE run_at <= now()) AS ready,
       count(*) FILTER (WHERE run_at > now()) AS scheduled,
       0::bigint AS running
FROM jobsup.jobs WHERE status = 'queued' GROUP BY kind, queue
UNION ALL
SELECT kind, queue, 0, 0, count(*) FROM jobsup.jobs WHERE status = 'running' GROUP BY kind, queue

-- name: kind_totals
SELECT kind, sum(done)::bigint AS done, sum(failed)::bigint AS failed, sum(dead)::bigint AS dead
FROM jobsup.kind_totals GROUP BY kind ORDER BY kind

-- name: oldest_ready
SELECT queue, extract(epoch FROM now() - min(run_at))::float8 AS age
FROM jobsup.jobs WHERE status = 'queued' AND run_at <= now()
GROUP BY queue ORDER BY queue

-- name: expiring_leases
SELECT id, kind, locked_by, attempts, extract(epoch FROM locked_until - now())::float8 AS remaining
FROM jobsup.jobs WHERE status = 'running'
ORDER BY locked_until
LIMIT %(limit)s

-- name: attempts_histogram
SELECT status, attempts, count(*) AS count FROM (
    SELECT status, attempts FROM jobsup.jobs WHERE status = 'queued'
    UNION ALL SELECT status, attempts FROM jobsup.jobs WHERE status = 'running'
    UNION ALL SELECT status, attempts FROM jobsup.jobs WHERE status = 'dead'
) live
GROUP BY status, attempts ORDER BY status, attempts

-- name: job
SELECT id, kind, queue, payload, status, priority, attempts, max_attempts, run_at, created_at,
       started_at, locked_until, locked_by, done_at, last_error, errors, unique_key
FROM jobsup.jobs WHERE id = %(id)s

-- name: recent_events
SELECT id, at, action, supervisor, count, job_ids, detail
FROM jobsup.events ORDER BY at DESC LIMIT %(limit)s

-- name: supervisors
SELECT id, host, pid, version, queues, procs, started_at, heartbeat_at, state, workers, jobs_done,
       extract(epoch FROM now() - heartbeat_at)::float8 AS heartbeat_age
FROM jobsup.supervisors ORDER BY host, pid

-- name: heartbeat
INSERT INTO jobsup.supervisors AS s (id, host, pid, version, queues, procs, state, workers, jobs_done)
VALUES (%(id)s, %(host)s, %(pid)s, %(version)s, %(queues)s, %(procs)s, %(state)s, %(workers)s, %(jobs_done)s)
ON CONFLICT (id) DO UPDATE
SET heartbeat_at = now(), state = excluded.state, workers = excluded.workers, jobs_done = excluded.jobs_done

-- name: supervisor_gone
DELETE FROM jobsup.supervisors WHERE id = %(id)s

-- name: forget_stale_supervisors
-- Rows of supervisors that died without cleaning up, long after their heartbeat stopped.
DELETE FROM jobsup.supervisors WHERE heartbeat_at < now() - make_interval(secs => %(older_than)s::float8)
RETURNING id


-- name: migration_isolation
-- The first statement of a migration's transaction. Under REPEATABLE READ (some servers' default) the
-- snapshot would be taken while waiting for the lock, and would miss the migrations applied meanwhile.
SET TRANSACTION ISOLATION LEVEL READ COMMITTED

-- name: migration_lock
SELECT pg_advisory_xact_lock(%(key)s)

-- name: migrations_table
CREATE TABLE IF NOT EXISTS jobsup.migrations (
    version     integer     PRIMARY KEY,
    name        text        NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
)

-- name: migrations_applied
SELECT version FROM jobsup.migrations

-- name: migration_done
INSERT INTO jobsup.migrations (version, name) VALUES (%(version)s, %(name)s)

-- name: schema_exists
SELECT to_regclass('jobsup.migrations') IS NOT NULL

-- name: schema_version
SELECT coalesce(max(version), 0) FROM jobsup.migrations

-- console
-- Statements of `jobsup top` beyond the shared ones above. Each reads the partial index of dead jobs,
-- the events index or nothing, so a refresh costs the same with a million finished jobs as with none.
-- %(match)s narrows to jobs whose kind or queue contains it, ignoring case; NULL matches every job.

-- name: console_clock
SELECT now() AS now

-- name: dead_jobs
-- The newest dead jobs, narrowed by %(match)s as the console section says (NULL: all of them).
SELECT id, kind, queue, attempts, max_attempts, done_at, last_error
FROM jobsup.jobs
WHERE status = 'dead'
  AND (%(match)s::text IS NULL OR strpos(lower(kind), lower(%(match)s::text)) > 0
       OR strpos(lower(queue), lower(%(match)s::text)) > 0)
ORDER BY done_at DESC, id DESC
LIMIT %(limit)s

-- name: dead_groups
-- Dead jobs by kind and exact last error, so "412 x email: SMTP timeout" is one row; the largest first.
SELECT kind, last_error, count(*) AS count, max(done_at) AS last_at
FROM jobsup.jobs
WHERE status = 'dead'
  AND (%(match)s::text IS NULL OR strpos(lower(kind), lower(%(match)s::text)) > 0
       OR strpos(lower(queue), lower(%(match)s::text)) > 0)
GROUP BY kind, last_error
ORDER BY count(*) DESC, max(done_at) DESC, kind
LIMIT %(limit)s

-- name: console_dead_ids
-- The ids a bulk requeue will touch, taken when the console asks for confirmation, so it requeues
-- exactly the jobs whose number it stated. by_error matches a NULL last error too.
SELECT id FROM jobsup.jobs
WHERE status = 'dead'
  AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
  AND (NOT %(by_error)s::bool OR last_error IS NOT DISTINCT FROM %(error)s::text)
ORDER BY id

-- name: console_reaper_passes
SELECT id, at, supervisor, count, job_ids, detail
FROM jobsup.events WHERE action = 'reaped'
ORDER BY at DESC LIMIT %(limit)s

-- name: console_reaped_per_minute
-- Jobs the reapers returned in each of the last %(minutes)s minutes (0 = the current one).
SELECT floor(extract(epoch FROM now() - at) / 60)::int AS minutes_ago, sum(count)::bigint AS count
FROM jobsup.events
WHERE action = 'reaped' AND at > now() - make_interval(mins => %(minutes)s::int)
GROUP BY 1

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

-- name: listen
LISTEN jobsup


-- Rows of supervisors that are certainly gone (issue 12): this host's, whose process has ended.

-- name: silent_supervisors_of_host
-- The other supervisors of this host whose heartbeat stopped a while ago; the caller asks the operating
-- system whether their pids still run.
SELECT id, pid FROM jobsup.supervisors
WHERE host = %(host)s AND id <> %(id)s AND heartbeat_at < now() - make_interval(secs => %(older_than)s::float8)

-- name: forget_supervisors
-- The heartbeat condition again: a row that beat since it was read is not deleted.
DELETE FROM jobsup.supervisors
WHERE id = ANY(%(ids)s) AND heartbeat_at < now() - make_interval(secs => %(older_than)s::float8)
RETURNING id
