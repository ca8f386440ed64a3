-- The queue's figures shared by `jobsup stats` (jobsup/ops/snapshot.py) and the console
-- (jobsup/monitor/source.py). Each reads a partial index of live jobs, the small per-kind totals or the
-- events index, so its cost follows the backlog, never the number of finished jobs; workflow_counts
-- reads the workflows table, a row per workflow that retention keeps. live_counts, oldest_ready and
-- workflow_counts are also read by `jobsup metrics` (jobsup/ops/metrics.py), oldest_ready by `jobsup
-- check` (jobsup/ops/check.py). Their other figures: console.sql (dead jobs), supervisors.sql
-- (supervisors), control.sql (queue_pauses), latency.sql (latency_read). limited_kinds is read by
-- stats, the console, metrics and check alike.

-- name: live_counts
-- Queued, running and waiting jobs by kind and queue; each part reads only its partial index (the
-- waiting jobs, those whose parents have not all finished, jobs_waiting_idx). `oldest` is the age in
-- seconds of the kind's oldest ready job in the queue (NULL with none, and in the other parts): the
-- console takes the queues' oldest ready job and the jobs no supervisor serves from it, in the same
-- pass over the queued jobs. The queued jobs are read as two parts, those of kinds without a limit
-- (jobs_ready_idx) and those with one (jobs_limited_ready_idx): no partial index holds them all, and a
-- plain `status = 'queued'` made the planner read the whole table (a million rows: 170 ms against 11).
SELECT kind, queue,
       count(*) FILTER (WHERE run_at <= now()) AS ready,
       count(*) FILTER (WHERE run_at > now()) AS scheduled,
       0::bigint AS running,
       extract(epoch FROM now() - min(run_at) FILTER (WHERE run_at <= now()))::float8 AS oldest,
       0::bigint AS waiting
FROM (SELECT kind, queue, run_at FROM jobsup.jobs WHERE status = 'queued' AND NOT limited
      UNION ALL
      SELECT kind, queue, run_at FROM jobsup.jobs WHERE status = 'queued' AND limited) queued
GROUP BY kind, queue
UNION ALL
SELECT kind, queue, 0, 0, count(*), NULL, 0 FROM jobsup.jobs WHERE status = 'running' GROUP BY kind, queue
UNION ALL
SELECT kind, queue, 0, 0, 0, NULL, count(*) FROM jobsup.jobs WHERE status = 'waiting' GROUP BY kind, queue

-- name: workflow_counts
-- Workflows open (a job of theirs has not finished, or the pruner has not yet seen that all have),
-- done (all their jobs done) and failed (one ended dead or cancelled). Finished ones are counted for as
-- long as retention keeps them: done ones --keep-done after their last job finished, failed ones
-- --keep-dead. One pass over the workflows table, a row per workflow (never over their jobs).
SELECT count(*) FILTER (WHERE finished_at IS NULL) AS open,
       count(*) FILTER (WHERE NOT failed) AS done,
       count(*) FILTER (WHERE failed) AS failed
FROM jobsup.workflows

-- name: kind_totals
SELECT kind, sum(done)::bigint AS done, sum(failed)::bigint AS failed, sum(dead)::bigint AS dead,
       sum(cancelled)::bigint AS cancelled
FROM jobsup.kind_totals GROUP BY kind ORDER BY kind

-- name: oldest_ready
-- In two parts, each on its partial index, as live_counts.
SELECT queue, extract(epoch FROM now() - min(run_at))::float8 AS age
FROM (SELECT queue, run_at FROM jobsup.jobs WHERE status = 'queued' AND NOT limited AND run_at <= now()
      UNION ALL
      SELECT queue, run_at FROM jobsup.jobs WHERE status = 'queued' AND limited AND run_at <= now()) ready
GROUP BY queue ORDER BY queue

-- name: expiring_leases
SELECT id, kind, locked_by, attempts, extract(epoch FROM locked_until - now())::float8 AS remaining
FROM jobsup.jobs WHERE status = 'running'
ORDER BY locked_until
LIMIT %(limit)s

-- name: attempts_histogram
SELECT status, attempts, count(*) AS count FROM (
    SELECT status, attempts FROM jobsup.jobs WHERE status = 'queued' AND NOT limited
    UNION ALL SELECT status, attempts FROM jobsup.jobs WHERE status = 'queued' AND limited
    UNION ALL SELECT status, attempts FROM jobsup.jobs WHERE status = 'running'
    UNION ALL SELECT status, attempts FROM jobsup.jobs WHERE status = 'dead'
) live
GROUP BY status, attempts ORDER BY status, attempts

-- name: recent_events
SELECT id, at, action, supervisor, count, job_ids, detail
FROM jobsup.events ORDER BY at DESC LIMIT %(limit)s

-- name: limited_kinds
-- Each kind with a limit in force (migration 0008): its limits, who set them, the jobs held against
-- them, and its ready jobs (queued, due, not yet claimed) split in two: those its limits hold back
-- (`throttled`) and those they would let start now (`startable`: they wait for a free worker, not for
-- a limit). Read by `jobsup stats`, `jobsup limit`, the console, `jobsup metrics` and `jobsup check`.
-- `held` reads the index of held jobs (running and limited: a worker's job each). The ready jobs are
-- the first %(counted)s entries of the index of limited ready jobs, in its order (priority, key,
-- run_at), so a kind with a million ready costs what one with ten thousand does: the counts stop
-- there. Of those, a key's limits let start as many as its room (key_concurrency less the key's held
-- jobs, and its key_rate's room now), and the kind's limits as many as theirs (concurrency less held,
-- and its rate's room now): `startable` is the least of these, `throttled` the rest, and
-- `throttled_age` (how long the oldest ready job has waited; none when nothing is throttled) the
-- oldest of the entries read. Exact for a kind of one priority without keys; otherwise, past that many
-- ready, an older job of a lower priority or a later key may be left unread: a lower bound.
SELECT l.kind, l.concurrency, l.rate, l.period, l.burst, l.key_concurrency, l.key_rate, l.key_period,
       l.key_burst, l.declared, l.set_by, l.set_at, h.held, w.ready,
       w.ready - a.startable AS throttled, a.startable,
       CASE WHEN w.ready > a.startable THEN extract(epoch FROM now() - w.oldest)::float8 END AS throttled_age
FROM jobsup.limits l
CROSS JOIN LATERAL (
    SELECT count(*) AS held FROM jobsup.jobs j WHERE j.kind = l.kind AND j.status = 'running' AND j.limited
) h
CROSS JOIN LATERAL (
    SELECT coalesce(sum(b.n), 0)::bigint AS ready, min(b.oldest) AS oldest,
           coalesce(sum(CASE WHEN b.key IS NULL THEN b.n  -- no key: bound by no per-key limit
                             ELSE least(b.n,
                                        CASE WHEN l.key_concurrency IS NOT NULL
                                             THEN greatest(0, l.key_concurrency - coalesce(kh.n, 0)) END,
                                        CASE WHEN l.key_rate IS NOT NULL
                                             THEN jobsup.rate_room(k.tat, now(), l.key_rate, l.key_period, l.key_burst)
                                        END)
                        END), 0)::bigint AS keys_allow
    FROM (SELECT r.key, count(*) AS n, min(r.run_at) AS oldest
          FROM (SELECT j.key, j.run_at FROM jobsup.jobs j
                WHERE j.kind = l.kind AND j.status = 'queued' AND j.limited AND j.run_at <= now()
                ORDER BY j.priority DESC, coalesce(j.key, ''), j.run_at, j.id
                LIMIT %(counted)s) r
          GROUP BY r.key) b
    -- What each key holds: one read of the kind's held jobs (a worker's job each), not one per key.
    LEFT JOIN (
        SELECT j.key, count(*) AS n FROM jobsup.jobs j
        WHERE l.key_concurrency IS NOT NULL AND j.kind = l.kind AND j.status = 'running' AND j.limited
        GROUP BY j.key
    ) kh ON kh.key = b.key
    LEFT JOIN jobsup.limit_keys k ON l.key_rate IS NOT NULL AND k.kind = l.kind AND k.key = b.key
) w
CROSS JOIN LATERAL (
    SELECT least(w.ready, w.keys_allow,
                 CASE WHEN l.concurrency IS NOT NULL THEN greatest(0, l.concurrency - h.held) END,
                 CASE WHEN l.rate IS NOT NULL THEN jobsup.rate_room(l.tat, now(), l.rate, l.period, l.burst) END
           ) AS startable
) a
WHERE l.limited
ORDER BY l.kind
