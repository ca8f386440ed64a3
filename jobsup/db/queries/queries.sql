-- Every statement jobsup sends, by name. Python calls them by name (jobsup/sql.py); none is assembled
-- from strings at run time. Parameters are psycopg's %(name)s placeholders.
--
-- The fence of every outcome write (docs/design/architecture.md, invariant 2): a row changes only while it is still
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
-- its own level; the dispatcher forgets it whenever a job may have come back there (dispatcher.py).
WITH picked AS (
    SELECT c.id
    FROM unnest(%(queues)s::text[], %(after_priorities)s::int[], %(after_run_ats)s::timestamptz[],
                %(after_ids)s::bigint[]) AS q(name, after_priority, after_run_at, after_id)
    CROSS JOIN LATERAL (
        SELECT * FROM (
            SELECT * FROM (
                SELECT id, priority, run_at FROM jobsup.jobs
                WHERE q.after_id IS NULL AND status = 'queued' AND queue = q.name AND run_at <= now()
                ORDER BY priority DESC, run_at, id
                LIMIT %(limit)s
                FOR UPDATE SKIP LOCKED
            ) whole
            UNION ALL
            SELECT * FROM (
                SELECT id, priority, run_at FROM jobsup.jobs
                WHERE status = 'queued' AND queue = q.name AND priority > q.after_priority AND run_at <= now()
                ORDER BY priority DESC, run_at, id
                LIMIT %(limit)s
                FOR UPDATE SKIP LOCKED
            ) above
            UNION ALL
            SELECT * FROM (
                SELECT id, priority, run_at FROM jobsup.jobs
                WHERE status = 'queued' AND queue = q.name AND priority = q.after_priority
                  AND (run_at, id) > (q.after_run_at, q.after_id) AND run_at <= now()
                ORDER BY run_at, id
                LIMIT %(limit)s
                FOR UPDATE SKIP LOCKED
            ) level
            UNION ALL
            SELECT * FROM (
                SELECT id, priority, run_at FROM jobsup.jobs
                WHERE status = 'queued' AND queue = q.name AND priority < q.after_priority AND run_at <= now()
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
          j.snoozes, nullif(j.errors, '[]'::jsonb), j.started_at

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
SELECT kind, sum(done)::bigint AS done, sum(failed)::bigint AS failed, sum(dead)::bigint AS dead,
       sum(cancelled)::bigint AS cancelled
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
-- The paused queues (control): the heartbeat is the backstop of their NOTIFY, at no extra statement.
RETURNING (SELECT coalesce(array_agg(queue), '{}') FROM jobsup.queue_pauses)

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

-- doctor
-- Statements of `jobsup doctor` (jobsup/doctor.py) and of the console's health line. They read the
-- server's views and statistics, the supervisors' rows and the partial index of running jobs; none
-- reads the finished jobs. Sessions count only in this database (and walsenders, which belong to none):
-- vacuum of a table here ignores the snapshots of other databases' sessions. Without pg_read_all_stats
-- (or pg_monitor) the server hides the state, times and query of other roles' sessions, but not their
-- backend_xmin, so a holder is still found, its age then only in transactions.

-- name: doctor_server
SELECT current_setting('server_version') AS server_version,
       current_setting('server_version_num')::int AS server_version_num,
       current_database() AS database, current_user AS role,
       pg_has_role('pg_read_all_stats', 'USAGE') AS sees_all_sessions,
       current_setting('autovacuum')::bool AS autovacuum,
       current_setting('autovacuum_vacuum_threshold')::float8 AS vacuum_threshold,
       current_setting('autovacuum_vacuum_scale_factor')::float8 AS vacuum_scale_factor,
       current_setting('max_connections')::int AS max_connections,
       -- reserved_connections is PostgreSQL 16's; NULL before
       current_setting('superuser_reserved_connections')::int
           + coalesce(current_setting('reserved_connections', true)::int, 0) AS reserved_connections,
       pg_notification_queue_usage()::float8 AS notify_usage

-- name: doctor_sessions
-- Sessions that hold back vacuum with a snapshot (backend_xmin) or a transaction id (backend_xid), or
-- that sit idle in a transaction; the oldest horizon first. xmin_xids is how many transactions old the
-- horizon is; xact_age and state_age (seconds) are NULL where the server hides them.
SELECT pid, usename AS role, application_name, state, backend_type, query_start,
       backend_xmin IS NOT NULL OR backend_xid IS NOT NULL AS holds_xmin,
       greatest(age(backend_xmin), age(backend_xid)) AS xmin_xids,
       extract(epoch FROM now() - xact_start)::float8 AS xact_age,
       extract(epoch FROM now() - state_change)::float8 AS state_age,
       left(regexp_replace(query, '\s+', ' ', 'g'), 120) AS query
FROM pg_stat_activity
WHERE pid <> pg_backend_pid()
  AND (datid IS NULL OR datname = current_database())
  AND backend_type IS DISTINCT FROM 'autovacuum worker'  -- its snapshot does not hold vacuum back
  AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL OR state LIKE 'idle in transaction%%')
ORDER BY greatest(age(backend_xmin), age(backend_xid)) DESC NULLS LAST, xact_start
LIMIT %(limit)s

-- name: doctor_prepared
SELECT gid, owner, age(transaction) AS xmin_xids, extract(epoch FROM now() - prepared)::float8 AS age
FROM pg_prepared_xacts WHERE database = current_database()
ORDER BY prepared

-- name: doctor_slots
-- A slot's xmin (a standby's hot_standby_feedback) holds back vacuum of every table; a logical slot's
-- catalog_xmin only the catalogs', but an inactive slot of either kind also keeps all WAL since it.
SELECT slot_name, slot_type, database, active, age(xmin) AS xmin_xids, age(catalog_xmin) AS catalog_xmin_xids
FROM pg_replication_slots
WHERE xmin IS NOT NULL OR catalog_xmin IS NOT NULL
ORDER BY greatest(age(xmin), age(catalog_xmin)) DESC

-- name: doctor_connections
-- Client connections by application name. Without pg_read_all_stats other roles' backend_type is
-- hidden; a process connected to a database is then taken for a client.
SELECT coalesce(application_name, '') AS application_name, count(*)::int AS count
FROM pg_stat_activity
WHERE coalesce(backend_type = 'client backend', datid IS NOT NULL)
GROUP BY 1

-- name: doctor_tables
-- Every table of the schema jobsup, a partition counted under its partitioned table: tuples from the
-- statistics, sizes from the files; nothing reads the tables themselves. vacuum_at is the dead-tuple
-- count at which autovacuum starts, with the table's own settings where it has them.
WITH t AS (
    SELECT coalesce(pg_partition_root(s.relid), s.relid) AS root, s.*, c.reloptions, c.reltuples
    FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
    WHERE s.schemaname = 'jobsup'
), o AS (
    SELECT t.relid,
           coalesce((SELECT option_value FROM pg_options_to_table(t.reloptions)
                     WHERE option_name = 'autovacuum_enabled'), 'on')::bool AS autovacuum_enabled,
           coalesce((SELECT option_value FROM pg_options_to_table(t.reloptions)
                     WHERE option_name = 'autovacuum_vacuum_threshold')::float8,
                    current_setting('autovacuum_vacuum_threshold')::float8)
           + coalesce((SELECT option_value FROM pg_options_to_table(t.reloptions)
                       WHERE option_name = 'autovacuum_vacuum_scale_factor')::float8,
                      current_setting('autovacuum_vacuum_scale_factor')::float8)
             * greatest(t.reltuples, 0) AS vacuum_at
    FROM t
)
SELECT n.nspname || '.' || c.relname AS name, count(*)::int AS tables,
       sum(t.n_live_tup)::bigint AS live_tuples, sum(t.n_dead_tup)::bigint AS dead_tuples,
       sum(o.vacuum_at)::bigint AS vacuum_at,
       bool_and(o.autovacuum_enabled) AS autovacuum_enabled,
       extract(epoch FROM now() - max(greatest(t.last_vacuum, t.last_autovacuum)))::float8 AS vacuum_age,
       sum(t.autovacuum_count + t.vacuum_count)::bigint AS vacuums,
       sum(pg_table_size(t.relid))::bigint AS table_bytes, sum(pg_indexes_size(t.relid))::bigint AS index_bytes
FROM t JOIN o ON o.relid = t.relid
JOIN pg_class c ON c.oid = t.root JOIN pg_namespace n ON n.oid = c.relnamespace
GROUP BY n.nspname, c.relname
ORDER BY n.nspname, c.relname

-- name: doctor_orphaned_jobs
-- Running jobs whose supervisor has no row, or a row whose heartbeat stopped: only a live supervisor's
-- reaper returns them, once their lease (lease_left seconds, negative when expired) runs out.
SELECT j.locked_by, count(*)::int AS jobs, min(j.id) AS first_id,
       extract(epoch FROM min(j.locked_until) - now())::float8 AS lease_left
FROM jobsup.jobs j
LEFT JOIN jobsup.supervisors s
       ON s.id = j.locked_by
      AND (%(stale_after)s::float8 = 0  -- 0: no row counts as stale
           OR s.heartbeat_at > now() - make_interval(secs => %(stale_after)s::float8))
WHERE j.status = 'running' AND s.id IS NULL
GROUP BY j.locked_by
ORDER BY count(*) DESC

-- name: health
-- The console's health line, every refresh: the oldest snapshot or transaction id holding back vacuum
-- here (a session or a prepared transaction), the oldest inactive replication slot holding xmin (it has
-- no age in time), and the tuples of jobsup.jobs from the statistics. It reads the server's state
-- through functions only, never a table.
WITH holder AS (
    SELECT 'session' AS holder, pid::text AS name, state,
           extract(epoch FROM now() - xact_start)::float8 AS age,
           greatest(age(backend_xmin), age(backend_xid)) AS xmin_xids
    FROM pg_stat_activity
    WHERE pid <> pg_backend_pid() AND (datid IS NULL OR datname = current_database())
      AND backend_type IS DISTINCT FROM 'autovacuum worker'
      AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
    UNION ALL
    SELECT 'prepared', gid, NULL, extract(epoch FROM now() - prepared)::float8, age(transaction)
    FROM pg_prepared_xacts WHERE database = current_database()
)
SELECT h.holder, h.name, h.state, h.age, h.xmin_xids, s.slot_name AS slot, s.xmin_xids AS slot_xmin_xids,
       pg_stat_get_live_tuples(to_regclass('jobsup.jobs'))::bigint AS live_tuples,
       pg_stat_get_dead_tuples(to_regclass('jobsup.jobs'))::bigint AS dead_tuples
FROM (SELECT 1) one
LEFT JOIN LATERAL (SELECT * FROM holder ORDER BY age DESC NULLS LAST, xmin_xids DESC LIMIT 1) h ON true
LEFT JOIN LATERAL (SELECT slot_name, age(xmin) AS xmin_xids FROM pg_replication_slots
                   WHERE xmin IS NOT NULL AND NOT active ORDER BY age(xmin) DESC LIMIT 1) s ON true

-- name: doctor_limits
-- For the doctor's own transaction: a jobsup table locked by a long ALTER or VACUUM FULL makes the
-- size lookup wait; the doctor would rather say so than hang a cron job or a probe.
SELECT set_config('lock_timeout', %(lock_timeout)s, true), set_config('statement_timeout', %(statement_timeout)s, true)

-- schedules
-- Recurring jobs (app.every). The supervisor's scheduler (jobsup/supervisor/scheduler.py) declares the
-- app's schedules, then fires each one in a transaction that holds its row: schedule_lock, the fires
-- enqueued with enqueue_many, schedule_fired. The CLI (`jobsup cron`) and the console list, run, pause
-- and resume them. A pause or resume is announced on the jobsup channel as {"schedule": name, ...}.

-- name: schedule_declare
-- A changed expression or time zone counts from now: the fires the old one would have had are not
-- "missed" under the new one.
INSERT INTO jobsup.schedules AS s (name, kind, expression, tz, payload, queue, priority, max_attempts, missed)
VALUES (%(name)s, %(kind)s, %(expression)s, %(tz)s, %(payload)s::jsonb, %(queue)s, %(priority)s,
        %(max_attempts)s, %(missed)s)
ON CONFLICT (name) DO UPDATE
SET kind = excluded.kind, expression = excluded.expression, tz = excluded.tz, payload = excluded.payload,
    queue = excluded.queue, priority = excluded.priority, max_attempts = excluded.max_attempts,
    missed = excluded.missed,
    fired_through = CASE WHEN (s.expression, s.tz) IS DISTINCT FROM (excluded.expression, excluded.tz)
                         THEN greatest(s.fired_through, now()) ELSE s.fired_through END,
    declared_at = CASE WHEN (s.expression, s.tz) IS DISTINCT FROM (excluded.expression, excluded.tz)
                       THEN now() ELSE s.declared_at END

-- name: schedule_lock
-- `watched`: another supervisor that is alive fired or watched this schedule within %(alive)s seconds,
-- so the fires due now are its on-time fires that this one happened to reach first, not missed ones.
SELECT s.fired_through, s.paused, now() AS now, clock_timestamp() AS clock,
       (s.seen_by IS DISTINCT FROM %(me)s::text
        AND s.seen_at > now() - make_interval(secs => %(alive)s::float8)
        AND EXISTS (SELECT 1 FROM jobsup.supervisors v
                    WHERE v.id = s.seen_by
                      AND v.heartbeat_at > now() - make_interval(secs => %(alive)s::float8))) AS watched
FROM jobsup.schedules s
WHERE s.name = %(name)s
FOR UPDATE

-- name: schedule_fire_next
-- The on-time fire in one statement: when the watermark sits between the previous fire (%(prev)s) and
-- this one, exactly this fire is due; enqueue it and move the watermark to it. A supervisor that comes
-- second waits on the row lock, then finds the watermark moved and enqueues nothing. No row back: not
-- this fire's turn (taken, paused, or a catch-up), and the full pass decides.
WITH s AS (
    SELECT name FROM jobsup.schedules
    WHERE name = %(name)s AND NOT paused AND fired_through >= %(prev)s AND fired_through < %(fire)s
      AND %(fire)s <= now()
    FOR UPDATE
), job AS (
    INSERT INTO jobsup.jobs (queue, kind, payload, priority, max_attempts, unique_key)
    SELECT %(queue)s, %(kind)s, %(payload)s::jsonb, %(priority)s, %(max_attempts)s, %(unique_key)s FROM s
    ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND status IN ('queued', 'running') DO NOTHING
    RETURNING id
), fired AS (
    UPDATE jobsup.schedules t
    SET fired_through = %(fire)s, next_fire = %(next_fire)s, seen_at = now(), seen_by = %(me)s,
        last_fire = %(fire)s, last_job_id = coalesce((SELECT id FROM job), t.last_job_id)
    FROM s WHERE t.name = s.name
)
SELECT (SELECT id FROM job), clock_timestamp() FROM s

-- name: schedule_fired
-- greatest(): a pass whose transaction began before the winner's (then waited for the lock) has an
-- older now(); the watermark never moves back, or the winner's fires would be due again.
UPDATE jobsup.schedules
SET fired_through = greatest(fired_through, %(through)s), next_fire = %(next_fire)s, seen_at = now(), seen_by = %(me)s,
    last_fire = coalesce(%(last_fire)s, last_fire), last_job_id = coalesce(%(last_job_id)s, last_job_id)
WHERE name = %(name)s

-- name: schedule_touch
-- The scheduler's sign of life for the schedules it runs, and the database's clock.
UPDATE jobsup.schedules SET seen_at = now(), seen_by = %(me)s
WHERE name = ANY(%(names)s::text[])
RETURNING clock_timestamp()

-- name: schedule_list
-- `state`: paused; orphaned when no supervisor has fired or watched it for %(orphan_after)s seconds (no
-- running app declares it); otherwise active. The last job's status is looked up by its id.
SELECT s.name, s.kind, s.expression, s.tz, s.queue, s.priority, s.max_attempts, s.missed, s.paused,
       s.next_fire, s.last_fire, s.last_job_id, j.status AS last_status, s.seen_at, s.seen_by,
       CASE WHEN s.paused THEN 'paused'
            WHEN s.seen_at IS NULL OR s.seen_at < now() - make_interval(secs => %(orphan_after)s::float8)
            THEN 'orphaned' ELSE 'active' END AS state,
       now() AS now
FROM jobsup.schedules s
LEFT JOIN jobsup.jobs j ON j.id = s.last_job_id
ORDER BY s.name

-- name: schedule_run
-- `jobsup cron run NAME`: one job now, outside the fire times (fired_through does not move).
WITH s AS (
    SELECT name, kind, payload, queue, priority, max_attempts,
           to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"') AS at
    FROM jobsup.schedules WHERE name = %(name)s
    FOR UPDATE
), job AS (
    INSERT INTO jobsup.jobs (queue, kind, payload, priority, max_attempts, unique_key)
    SELECT queue, kind, payload || jsonb_build_object('schedule', name, 'fire_at', at, 'manual', true),
           priority, max_attempts, 'cron:' || name || ':run:' || at
    FROM s
    RETURNING id
), noted AS (
    UPDATE jobsup.schedules SET last_fire = now(), last_job_id = (SELECT id FROM job)
    WHERE name = %(name)s
)
SELECT id FROM job

-- name: schedule_pause
-- Pause (%(paused)s true) or resume (false); no row when there is no such schedule. A paused schedule's
-- fires are skipped, not kept for later.
WITH old AS (
    SELECT name, paused FROM jobsup.schedules WHERE name = %(name)s FOR UPDATE
), changed AS (
    UPDATE jobsup.schedules s SET paused = %(paused)s::bool
    FROM old
    WHERE s.name = old.name AND old.paused IS DISTINCT FROM %(paused)s::bool
    RETURNING s.name, pg_notify('jobsup', json_build_object('schedule', s.name, 'paused', s.paused)::text)
)
SELECT (SELECT count(*) FROM changed) AS changed FROM old
-- retention
-- The pruner (jobsup/retention.py) removes finished jobs past their window in bounded batches, each its
-- own short transaction that first takes the pruning turn. Finding them reads jobs_finished_idx, so a
-- batch costs the same with a billion finished rows as with a thousand; SKIP LOCKED steps over a dead
-- job being requeued rather than waiting for it. %(keep)s is the window in seconds.

-- name: prune_turn
-- One supervisor prunes at a time. Transaction-scoped, so nothing outlives the batch (and it works
-- behind a transaction-mode PgBouncer); whoever does not get it skips the batch.
SELECT pg_try_advisory_xact_lock(%(key)s)

-- name: prune_turn_wait
-- `jobsup prune` waits for its turn: a supervisor's batch takes milliseconds.
SELECT pg_advisory_xact_lock(%(key)s)

-- name: prune_timeout
-- For this batch's transaction only.
SELECT set_config('statement_timeout', %(ms)s::text, true)

-- name: prune_done
-- The rows go by `id = ANY(ARRAY(...))`, each found through the primary key: joined with the CTE, the
-- planner hashes the batch and reads the whole table to find them.
DELETE FROM jobsup.jobs
WHERE id = ANY(ARRAY(
    SELECT id FROM jobsup.jobs
    WHERE status = 'done' AND done_at < now() - make_interval(secs => %(keep)s::float8)
    ORDER BY done_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED))

-- name: prune_dead
-- Dead and cancelled jobs, each status its own ordered range of jobs_finished_idx (one `status IN`
-- scan in no order is what the planner swaps for a sequential scan when many rows are dead). A batch
-- takes up to `limit` of each. `dead` of the per-kind totals is "dead now", the jobs one can still
-- requeue, so deleting a dead job lowers it as requeueing does; `done` and `failed` count every job
-- ever and are left alone.
WITH dead AS (
    SELECT id FROM jobsup.jobs
    WHERE status = 'dead' AND done_at < now() - make_interval(secs => %(keep)s::float8)
    ORDER BY done_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED
), cancelled AS (
    SELECT id FROM jobsup.jobs
    WHERE status = 'cancelled' AND done_at < now() - make_interval(secs => %(keep)s::float8)
    ORDER BY done_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM jobsup.jobs
    WHERE id = ANY(ARRAY(SELECT id FROM dead UNION ALL SELECT id FROM cancelled))
    RETURNING kind, status
), totals AS (
    INSERT INTO jobsup.kind_totals AS t (kind, slot, dead)
    SELECT kind, mod(pg_backend_pid(), 16)::smallint, -count(*) FROM gone WHERE status = 'dead' GROUP BY kind
    ON CONFLICT (kind, slot) DO UPDATE SET dead = t.dead + excluded.dead
)
SELECT count(*) FROM gone

-- name: prune_events
DELETE FROM jobsup.events
WHERE id = ANY(ARRAY(
    SELECT id FROM jobsup.events
    WHERE at < now() - make_interval(secs => %(keep)s::float8)
    ORDER BY at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED))

-- name: prunable
-- What a prune would remove now, for `jobsup prune --dry-run`. NULL windows (keep forever) count 0.
SELECT
    (SELECT count(*) FROM jobsup.jobs
     WHERE %(keep_done)s::float8 IS NOT NULL AND status = 'done'
       AND done_at < now() - make_interval(secs => %(keep_done)s::float8)),
    (SELECT count(*) FROM jobsup.jobs
     WHERE %(keep_dead)s::float8 IS NOT NULL AND status IN ('dead', 'cancelled')
       AND done_at < now() - make_interval(secs => %(keep_dead)s::float8)),
    (SELECT count(*) FROM jobsup.events
     WHERE at < now() - make_interval(secs => %(keep_events)s::float8))
-- Django's Tasks framework (jobsup/django.py)

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
-- pooler (issue 11)

-- name: claim_without_flush_wait
-- Behind a transaction pooler, the claims connection's session setting (synchronous_commit=off, see
-- the supervisor) is set by each claim's own transaction instead.
SET LOCAL synchronous_commit = off

-- bench (issue 11): the statements of `jobsup bench` and benchmarks/bench_supervisor.py. Its table
-- lives in the jobsup schema, so dropping the schema (or the scratch database) takes it too.

-- name: bench_pickup_table
CREATE TABLE jobsup.bench_pickup (job_id bigint PRIMARY KEY, started float8 NOT NULL)

-- name: bench_pickup_started
INSERT INTO jobsup.bench_pickup (job_id, started) VALUES (%(job_id)s, %(started)s)

-- name: bench_pickup_clear
TRUNCATE jobsup.bench_pickup

-- name: bench_pickup_count
SELECT count(*) FROM jobsup.bench_pickup

-- name: bench_pickup_times
SELECT job_id, started FROM jobsup.bench_pickup

-- name: bench_done_of_kind
SELECT coalesce(sum(done), 0) FROM jobsup.kind_totals WHERE kind = %(kind)s

-- name: bench_workers
SELECT workers FROM jobsup.supervisors

-- name: bench_clear
TRUNCATE jobsup.jobs, jobsup.kind_totals, jobsup.events

-- name: bench_jobs_held
-- Whether a jobsup schema holds jobs (any status): `jobsup bench` refuses to run among them.
SELECT count(*) FROM jobsup.jobs

-- name: bench_drop_schema
DROP SCHEMA jobsup CASCADE

-- name: bench_create_database
-- {name} is filled by psycopg.sql.Identifier, never by text: the scratch database of --database.
CREATE DATABASE {name}

-- name: bench_drop_database
DROP DATABASE IF EXISTS {name} WITH (FORCE)

-- name: bench_database_exists
SELECT count(*) > 0 FROM pg_database WHERE datname = %(name)s

-- name: bench_schema_exists
SELECT count(*) > 0 FROM pg_namespace WHERE nspname = 'jobsup'

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

-- control (issue 9): handler verbs (Snooze, RetryAfter, Discard), `jobsup cancel`, `pause`, `resume`,
-- `retry`, and jobsup.testing. A cancel of a running job sets cancelled_by (the request) and is announced
-- as {"cancel": [ids] or null (too many to list: every supervisor renews its leases now), "by": who};
-- the lease renewal (extend) returns the requests as well, as the backstop. A pause is announced as
-- {"queue": name, "paused": true|false}; the heartbeat returns the paused queues, as the backstop.

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

-- name: retry_now
-- `jobsup retry`: a job waiting for its backoff (queued, run_at in the future, attempted before) is due
-- now; the NOTIFY wakes the supervisors of its queue.
WITH moved AS (
    UPDATE jobsup.jobs j SET run_at = now()
    WHERE j.id = ANY(%(ids)s::bigint[]) AND j.status = 'queued' AND j.attempts > 0 AND j.run_at > now()
    RETURNING j.id, j.queue
)
SELECT id, pg_notify('jobsup', json_build_object('queues', ARRAY[queue])::text) FROM moved

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

-- latency (issue 10): queue latency and run time per kind per minute, jobsup/latency.py

-- name: latency_merge
-- Adds one supervisor's histograms (one element per non-empty bucket of a kind and metric) to the
-- current 1-minute and 10-minute rows. Rows are inserted in key order, so two supervisors merging at
-- once lock them in the same order and never deadlock.
WITH given AS (
    SELECT kind, metric, array_agg(bucket ORDER BY bucket) AS buckets, array_agg(count ORDER BY bucket) AS counts
    FROM unnest(%(kinds)s::text[], %(metrics)s::text[], %(buckets)s::int[], %(counts)s::bigint[])
         AS g(kind, metric, bucket, count)
    GROUP BY kind, metric
)
INSERT INTO jobsup.latency AS t (period, minute, kind, metric, buckets, counts)
SELECT p.period, date_bin(make_interval(mins => p.period), now(), TIMESTAMPTZ '2000-01-01 00:00:00+00'),
       kind, metric, buckets, counts
FROM given CROSS JOIN (VALUES (1::smallint), (10::smallint)) AS p(period)
ORDER BY p.period, kind, metric
ON CONFLICT (period, minute, kind, metric) DO UPDATE
SET (buckets, counts) = (
    SELECT array_agg(b ORDER BY b), array_agg(c ORDER BY b)
    FROM (SELECT b, sum(c)::bigint AS c
          FROM (SELECT * FROM unnest(t.buckets, t.counts)
                UNION ALL SELECT * FROM unnest(excluded.buckets, excluded.counts)) AS u(b, c)
          GROUP BY b) AS m)

-- name: latency_read
-- Counts per kind, metric and bucket in four parts (latency.summarize adds them up into windows):
--   1: the current minute and the one before (the 1-minute window);
--   5: the 4 minutes before those (with part 1, the 5-minute window);
--   6: the minute before those (with part 5, the five minutes before the last: what "rising" compares with);
--   60: the current 10 minutes and the 6 periods of 10 before (the hour's window).
-- 14 rows per kind and metric, whatever the jobs table holds.
SELECT kind, metric, bucket, part, sum(count)::bigint AS count
FROM (SELECT kind, metric, buckets, counts,
             CASE WHEN period = 10 THEN 60
                  WHEN minute >= date_trunc('minute', now()) - interval '1 minute' THEN 1
                  WHEN minute >= date_trunc('minute', now()) - interval '5 minutes' THEN 5
                  ELSE 6 END AS part
      FROM jobsup.latency
      WHERE (period = 1 AND minute >= date_trunc('minute', now()) - interval '6 minutes')
         OR (period = 10 AND minute >= date_bin('10 minutes', now(), TIMESTAMPTZ '2000-01-01 00:00:00+00')
                                       - interval '60 minutes')) AS r,
     unnest(buckets, counts) AS u(bucket, count)
GROUP BY kind, metric, bucket, part

-- name: latency_trim
-- Each period's rows are kept for %(keep_periods)s periods: minutes of 1-minute rows, hours of 10-minute ones.
DELETE FROM jobsup.latency WHERE minute < now() - make_interval(mins => period * %(keep_periods)s::int)

-- alerts (issue 10): jobsup check (jobsup/check.py) and the jobsup metrics exporter (jobsup/exporter.py)

-- name: check_figures
-- The design's three alerts in one row: the oldest ready job's age per queue comes from oldest_ready;
-- these read the partial index of dead jobs and the events index.
SELECT (SELECT count(*) FROM jobsup.jobs
        WHERE status = 'dead' AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)) AS dead,
       (SELECT coalesce(sum(count), 0) FROM jobsup.events
        WHERE action = 'reaped' AND at > now() - interval '1 minute')::bigint AS reaped_last_minute

-- name: exporter_dead
SELECT queue, kind, count(*) AS dead FROM jobsup.jobs WHERE status = 'dead' GROUP BY queue, kind
