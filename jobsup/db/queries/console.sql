-- Statements of `jobsup top` (jobsup/monitor/source.py) beyond the shared figures of snapshot.sql;
-- dead_jobs and dead_groups are `jobsup stats`' too (jobsup/ops/snapshot.py, with no match). Each reads
-- the partial index of dead jobs, the events index, one job by its id or nothing, so a refresh costs the
-- same with a million finished jobs as with none.
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
       started_at, locked_until, locked_by, done_at, last_error, errors, unique_key
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
