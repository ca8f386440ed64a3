-- The supervisors' rows and their channel. A supervisor (the package jobsup/supervisor/) beats its
-- heartbeat, listens on the jobsup channel and deletes its row when it stops; its roster duty
-- (jobsup/supervisor/roster.py) forgets the rows of supervisors that are gone. `supervisors` lists the
-- rows for `jobsup stats` (jobsup/ops/snapshot.py), the console (jobsup/monitor/source.py) and
-- `jobsup doctor` (jobsup/ops/doctor.py).

-- name: heartbeat
-- kinds: what the app handles (NULL: any kind), known once the first worker has imported the app.
INSERT INTO jobsup.supervisors AS s (id, host, pid, version, queues, kinds, procs, state, workers, jobs_done)
VALUES (%(id)s, %(host)s, %(pid)s, %(version)s, %(queues)s, %(kinds)s, %(procs)s, %(state)s, %(workers)s,
        %(jobs_done)s)
ON CONFLICT (id) DO UPDATE
SET heartbeat_at = now(), state = excluded.state, workers = excluded.workers, jobs_done = excluded.jobs_done,
    kinds = excluded.kinds
-- The paused queues (control) and the kinds with a limit in force: the heartbeat is the backstop of
-- their NOTIFYs, at no extra statement. And the oldest claim protocol the schema lets claim: a
-- supervisor whose own is older stops claiming.
RETURNING (SELECT coalesce(array_agg(queue), '{}') FROM jobsup.queue_pauses),
          (SELECT coalesce(array_agg(kind), '{}') FROM jobsup.limits WHERE limited),
          (SELECT coalesce(array_agg(kind), '{}') FROM jobsup.limits
           WHERE limited AND (key_concurrency IS NOT NULL OR key_rate IS NOT NULL)),
          (SELECT oldest FROM jobsup.compat WHERE name = 'claim'),
          (SELECT why FROM jobsup.compat WHERE name = 'claim')

-- name: supervisor_gone
DELETE FROM jobsup.supervisors WHERE id = %(id)s

-- name: supervisors
SELECT id, host, pid, version, queues, procs, started_at, heartbeat_at, state, workers, jobs_done,
       extract(epoch FROM now() - heartbeat_at)::float8 AS heartbeat_age, kinds
FROM jobsup.supervisors ORDER BY host, pid

-- The jobsup channel's messages, what sends each and its payload: jobsup/db/notify.py, the one place
-- that reads them.

-- name: listen
LISTEN jobsup

-- The roster: rows of supervisors that are certainly gone (this host's, whose process has ended), then
-- the rows of any host long after their heartbeat stopped.

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

-- name: forget_stale_supervisors
-- Rows of supervisors that died without cleaning up, long after their heartbeat stopped.
DELETE FROM jobsup.supervisors WHERE heartbeat_at < now() - make_interval(secs => %(older_than)s::float8)
RETURNING id

-- name: unserved
-- Ready jobs, by queue and kind, that no live supervisor can run: none that is running (not stopping),
-- beat within %(stale_after)s seconds and serves their queue with their kind (kinds NULL: any kind, as
-- every supervisor of an earlier release). Paused queues count as served: their pause is deliberate.
-- Groups the ready jobs once, then looks at the few supervisor rows per group.
WITH ready AS (
    SELECT queue, kind, count(*) AS ready, min(run_at) AS oldest
    FROM (SELECT queue, kind, run_at FROM jobsup.jobs WHERE status = 'queued' AND NOT limited AND run_at <= now()
          UNION ALL
          SELECT queue, kind, run_at FROM jobsup.jobs WHERE status = 'queued' AND limited AND run_at <= now()) r
    GROUP BY queue, kind
)
SELECT r.queue, r.kind, r.ready, extract(epoch FROM now() - r.oldest)::float8 AS age
FROM ready r
WHERE NOT EXISTS (
    SELECT 1 FROM jobsup.supervisors s
    WHERE s.state = 'running' AND s.heartbeat_at > now() - make_interval(secs => %(stale_after)s::float8)
      AND r.queue = ANY(s.queues) AND (s.kinds IS NULL OR r.kind = ANY(s.kinds))
)
ORDER BY r.queue, r.kind
