-- Statements of `jobsup top` (jobsup/monitor/source.py) beyond the shared figures of snapshot.sql;
-- dead_jobs and dead_groups are `jobsup stats`' too (jobsup/ops/snapshot.py, with no match). Each reads
-- the partial index of dead jobs, the events index, one job by its id or nothing, so a refresh costs the
-- same with a million finished jobs as with none; those of the last minute are read for done/min and the
-- starts of limited kinds.
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

-- name: console_dead_matching
-- How many dead jobs %(match)s matches, for the Dead tab's title ("Dead 0 of 8"): dead_groups lists at
-- most its limit of groups, so their counts may not add up to it. With no filter it reads nothing (the
-- per-kind totals give the count) and says 0.
SELECT count(*) AS count
FROM jobsup.jobs
WHERE %(match)s::text IS NOT NULL AND status = 'dead'
  AND (strpos(lower(kind), lower(%(match)s::text)) > 0 OR strpos(lower(queue), lower(%(match)s::text)) > 0)

-- name: console_done_last_minute
-- Jobs done in the last 60 s by the database's clock, the header's done/min: a range of the index of
-- finished jobs (status, done_at), so it reads the last minute's done jobs and none older. Done jobs
-- deleted sooner than that (a --keep-done under a minute) are not counted.
SELECT count(*) AS count
FROM jobsup.jobs WHERE status = 'done' AND done_at > now() - interval '60 seconds'

-- name: console_dead_ids
-- The ids a bulk requeue will touch, taken when the console asks for confirmation, so it requeues
-- exactly the jobs whose number it stated. by_error matches a NULL last error too.
SELECT id FROM jobsup.jobs
WHERE status = 'dead'
  AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
  AND (NOT %(by_error)s::bool OR last_error IS NOT DISTINCT FROM %(error)s::text)
ORDER BY id

-- name: job
SELECT id, kind, queue, payload, status, priority, attempts, max_attempts, run_at, created_at,
       started_at, locked_until, locked_by, done_at, last_error, errors, unique_key, key, limited,
       workflow_id, parents_left, meta
FROM jobsup.jobs WHERE id = %(id)s

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

-- name: console_limit_keys
-- The Limits tab's figures beyond limited_kinds (snapshot.sql): the starts of each limited kind within
-- its rate's period, and its busiest keys. Rows with `whole_kind` carry a kind's starts; the others are
-- its %(keys)s busiest keys (by held, then throttled, then starts), ranked by `n`.
--
-- A start is a job's started_at within the period, capped at a minute: among the held jobs (the index of
-- held jobs) and the jobs finished since (a minute's range of the index of finished jobs, what the
-- header's done/min reads). A period longer than a minute is counted over its last minute; a failed
-- attempt waiting for its retry is not counted, since only a read of the kind's whole backlog finds it.
-- A key's starts are counted within its key_rate's period, alike.
--
-- A key's held jobs come from the index of held jobs; its throttled jobs (and the oldest of them) from
-- the first %(counted)s entries of the kind's limited ready jobs, as limited_kinds counts them, so a key
-- whose jobs come later in that index (a lower priority, a later name) may show fewer throttled than it
-- has.
-- `keys_seen` counts the keys these reads found.
WITH l AS (
    SELECT kind, least(coalesce(period, 60), 60) AS span, least(coalesce(key_period, 60), 60) AS key_span,
           concurrency, rate, period, burst, tat, key_concurrency, key_rate, key_period, key_burst
    FROM jobsup.limits WHERE limited
), started AS (
    SELECT j.kind, j.key, extract(epoch FROM now() - j.started_at) AS ago
    FROM jobsup.jobs j JOIN l ON l.kind = j.kind
    WHERE j.status = 'running' AND j.limited AND j.started_at > now() - interval '60 seconds'
    UNION ALL
    SELECT j.kind, j.key, extract(epoch FROM now() - j.started_at)
    FROM jobsup.jobs j JOIN l ON l.kind = j.kind
    WHERE j.status IN ('done', 'dead', 'cancelled') AND j.done_at > now() - interval '60 seconds'
      AND j.started_at > now() - interval '60 seconds'
), starts AS (
    SELECT s.kind, s.key, GROUPING(s.key) = 1 AS whole_kind,
           count(*) FILTER (WHERE s.ago < l.span) AS kind_starts,
           count(*) FILTER (WHERE s.ago < l.key_span) AS key_starts
    FROM started s JOIN l ON l.kind = s.kind
    GROUP BY GROUPING SETS ((s.kind), (s.kind, s.key))
), held AS (
    SELECT j.kind, j.key, count(*) AS held
    FROM jobsup.jobs j JOIN l ON l.kind = j.kind
    WHERE j.status = 'running' AND j.limited AND j.key IS NOT NULL
    GROUP BY j.kind, j.key
), kind_held AS (
    SELECT j.kind, count(*) AS held
    FROM jobsup.jobs j JOIN l ON l.kind = j.kind
    WHERE j.status = 'running' AND j.limited
    GROUP BY j.kind
), ready AS (
    SELECT l.kind, w.key, count(*) AS n, min(w.run_at) AS oldest
    FROM l CROSS JOIN LATERAL (
        SELECT j.key, j.run_at FROM jobsup.jobs j
        WHERE j.kind = l.kind AND j.status = 'queued' AND j.limited AND j.run_at <= now()
        ORDER BY j.priority DESC, coalesce(j.key, ''), j.run_at, j.id
        LIMIT %(counted)s) w
    WHERE w.key IS NOT NULL
    GROUP BY l.kind, w.key
), throttled AS (
    -- Of a key's ready jobs, those that its key's limits or its kind's would not let start now (as
    -- limited_kinds splits a kind's): the rest are startable, waiting for a worker, not for a limit.
    SELECT t.kind, t.key, t.throttled, CASE WHEN t.throttled > 0 THEN t.oldest END AS oldest
    FROM (
        SELECT r.kind, r.key, r.oldest,
               r.n - least(r.n,
                           CASE WHEN l.key_concurrency IS NOT NULL
                                THEN greatest(0, l.key_concurrency - coalesce(h.held, 0)) END,
                           CASE WHEN l.key_rate IS NOT NULL
                                THEN jobsup.rate_room(k.tat, now(), l.key_rate, l.key_period, l.key_burst) END,
                           CASE WHEN l.concurrency IS NOT NULL
                                THEN greatest(0, l.concurrency - coalesce(kh.held, 0)) END,
                           CASE WHEN l.rate IS NOT NULL
                                THEN jobsup.rate_room(l.tat, now(), l.rate, l.period, l.burst) END) AS throttled
        FROM ready r
        JOIN l ON l.kind = r.kind
        LEFT JOIN held h ON h.kind = r.kind AND h.key = r.key
        LEFT JOIN kind_held kh ON kh.kind = r.kind
        LEFT JOIN jobsup.limit_keys k ON k.kind = r.kind AND k.key = r.key
    ) t
), key_jobs AS (
    SELECT coalesce(h.kind, w.kind) AS kind, coalesce(h.key, w.key) AS key, coalesce(h.held, 0) AS held,
           coalesce(w.throttled, 0) AS throttled, w.oldest
    FROM held h FULL JOIN throttled w ON w.kind = h.kind AND w.key = h.key
), ranked AS (
    SELECT coalesce(k.kind, s.kind) AS kind, coalesce(k.key, s.key) AS key, coalesce(k.held, 0) AS held,
           coalesce(k.throttled, 0) AS throttled, k.oldest, coalesce(s.key_starts, 0) AS starts
    FROM key_jobs k
    FULL JOIN (SELECT * FROM starts WHERE NOT whole_kind AND key IS NOT NULL AND key_starts > 0) s
           ON s.kind = k.kind AND s.key = k.key
)
SELECT r.kind, r.key, false AS whole_kind, r.n, r.held, r.throttled,
       extract(epoch FROM now() - r.oldest)::float8 AS throttled_age, r.starts, r.keys_seen
FROM (SELECT ranked.*,
             row_number() OVER (PARTITION BY kind ORDER BY held DESC, throttled DESC, starts DESC, key) AS n,
             count(*) OVER (PARTITION BY kind) AS keys_seen
      FROM ranked) r
WHERE r.n <= %(keys)s
UNION ALL
SELECT s.kind, NULL, true, 0, NULL, NULL, NULL, s.kind_starts, NULL FROM starts s WHERE s.whole_kind
ORDER BY 1, 4

-- name: console_limit_next_throttled
-- The first throttled job of a limited kind (of one key, if given) in the order of the index of limited
-- ready jobs (priority, key, run_at), for Enter on the Limits tab: the job screen says why it waits. Read on
-- a key press, not per refresh: a key far into a deep backlog costs a scan up to its first entry.
SELECT id FROM jobsup.jobs
WHERE kind = %(kind)s AND status = 'queued' AND limited AND run_at <= now()
  AND (%(key)s::text IS NULL OR key = %(key)s::text)
ORDER BY priority DESC, coalesce(key, ''), run_at, id
LIMIT 1

-- name: console_workflows_live
-- Whether the Workflows tab has anything to list, and how many of the newest %(limit)s workflows have a
-- job not yet ended (the tab's badge): at most three probes of jobs_workflow_idx (workflow_id, status)
-- a workflow, so a refresh costs the same whatever their size. workflows_recent (workflows.sql), which
-- counts every job of each, is read only while the tab is in view.
SELECT count(*) AS listed,
       count(*) FILTER (WHERE EXISTS (
           SELECT FROM jobsup.jobs j
           WHERE j.workflow_id = w.id AND j.status IN ('waiting', 'queued', 'running'))) AS unfinished
FROM (SELECT id FROM jobsup.workflows ORDER BY id DESC LIMIT %(limit)s) w
