-- `jobsup explain ID` and the console's job screen: why a job is where it is (jobsup/ops/explain.py).
-- Each statement reads one job's row and what bears on it by primary key or a small table, never a
-- backlog: a kind may have a million jobs queued, and the answer must cost the same.

-- name: explain_job
-- The job, its queue's pause, the supervisor that holds it, and whether any live supervisor serves its
-- queue and its kind. "Live" is unserved's (supervisors.sql): running, not stopping, and beat within
-- %(stale_after)s seconds. The supervisors' table holds a row per supervisor: reading it all is cheap.
WITH live AS (
    SELECT s.queues, s.kinds, s.workers FROM jobsup.supervisors s
    WHERE s.state = 'running' AND s.heartbeat_at > now() - make_interval(secs => %(stale_after)s::float8)
)
SELECT j.id, j.kind, j.queue, j.status, j.attempts, j.max_attempts, j.snoozes, j.run_at, j.started_at,
       j.done_at, j.locked_by, j.locked_until, j.last_error, j.cancelled_by, j.key, j.limited, now() AS now,
       j.meta, j.workflow_id,
       -- A handler's Snooze is the last entry of the history: its run_at is no retry after a failure.
       coalesce(j.errors -> -1 ? 'snooze', false) AS snoozed, j.errors -> -1 ->> 'error' AS snooze_reason,
       p.paused_at, p.paused_by,
       s.host AS holder_host, s.pid AS holder_pid,
       (s.state = 'running' AND s.heartbeat_at > now() - make_interval(secs => %(stale_after)s::float8))
           AS holder_live,
       (SELECT count(*) FROM live) AS live_supervisors,
       EXISTS (SELECT 1 FROM live WHERE j.queue = ANY(live.queues)) AS queue_served,
       EXISTS (SELECT 1 FROM live WHERE j.queue = ANY(live.queues) AND (live.kinds IS NULL OR j.kind = ANY(live.kinds)))
           AS kind_served,
       -- The workers of the live supervisors that can run it, and how many were busy with a job at
       -- their last heartbeat: a ready job that all of them are busy for waits for a worker, not for a
       -- limit (one that is starting or idle takes it soon).
       (SELECT count(*) FROM live, jsonb_array_elements(live.workers) w
        WHERE j.queue = ANY(live.queues) AND (live.kinds IS NULL OR j.kind = ANY(live.kinds))) AS workers,
       (SELECT count(*) FROM live, jsonb_array_elements(live.workers) w
        WHERE j.queue = ANY(live.queues) AND (live.kinds IS NULL OR j.kind = ANY(live.kinds))
          AND w ->> 'state' = 'busy') AS busy_workers,
       -- What the supervisors of its queue run instead, for the answer's text.
       (SELECT array_agg(DISTINCT k ORDER BY k) FROM live, unnest(live.kinds) AS k WHERE j.queue = ANY(live.queues))
           AS queue_kinds,
       -- A running job handed to a worker behind another, not started yet: that worker, at the
       -- holder's last heartbeat (its pid and the job it runs).
       (SELECT jsonb_build_object('pid', w -> 'pid', 'job_id', w -> 'job_id')
        FROM jsonb_array_elements(s.workers) w WHERE w -> 'behind' @> to_jsonb(j.id) LIMIT 1) AS handed_to
FROM jobsup.jobs j
LEFT JOIN jobsup.queue_pauses p ON p.queue = j.queue
LEFT JOIN jobsup.supervisors s ON s.id = j.locked_by
WHERE j.id = %(id)s

-- name: explain_limits
-- The limits of a queued job's kind and where each stands now, as claim_limited (migration 0008) would
-- find them: what the kind and the job's key hold (running limited rows, from jobs_limited_held_idx: a
-- slot is a running row, so this is at most the jobs running, never the backlog) with the first
-- %(shown)s holders, and each rate's room and next start at now(). No row: the kind has no limit in force.
SELECT l.concurrency, l.rate, l.period, l.burst, l.key_concurrency, l.key_rate, l.key_period, l.key_burst,
       held.n AS held, held.ids AS holders, key_held.n AS key_held, key_held.ids AS key_holders,
       CASE WHEN l.rate IS NOT NULL THEN jobsup.rate_room(l.tat, now(), l.rate, l.period, l.burst) END AS room,
       CASE WHEN l.rate IS NOT NULL THEN jobsup.rate_next(l.tat, now(), l.rate, l.period, l.burst) END AS next_start,
       CASE WHEN l.key_rate IS NOT NULL AND %(key)s::text IS NOT NULL
            THEN jobsup.rate_room(k.tat, now(), l.key_rate, l.key_period, l.key_burst) END AS key_room,
       CASE WHEN l.key_rate IS NOT NULL AND %(key)s::text IS NOT NULL
            THEN jobsup.rate_next(k.tat, now(), l.key_rate, l.key_period, l.key_burst) END AS key_next_start
FROM jobsup.limits l
LEFT JOIN jobsup.limit_keys k ON k.kind = l.kind AND k.key = %(key)s::text
CROSS JOIN LATERAL (
    SELECT count(*) AS n, (array_agg(j.id ORDER BY j.id))[1:%(shown)s] AS ids
    FROM jobsup.jobs j
    WHERE l.concurrency IS NOT NULL AND j.kind = l.kind AND j.status = 'running' AND j.limited
) held
CROSS JOIN LATERAL (
    SELECT count(*) AS n, (array_agg(j.id ORDER BY j.id))[1:%(shown)s] AS ids
    FROM jobsup.jobs j
    WHERE l.key_concurrency IS NOT NULL AND j.kind = l.kind AND j.key = %(key)s::text AND j.status = 'running'
      AND j.limited
) key_held
WHERE l.kind = %(kind)s AND l.limited

-- name: explain_parents
-- A waiting job's parents (jobsup.dependencies, by dependencies_child_idx): how many it has, how many
-- have not finished (their dependency is not settled yet), and the first %(shown)s of those with their
-- kind and status. A job waits for as many parents as a workflow gave it: this reads that many rows.
SELECT count(*) AS parents,
       count(*) FILTER (WHERE NOT e.settled) AS unfinished,
       (array_agg(e.parent_id ORDER BY e.parent_id) FILTER (WHERE NOT e.settled))[1:%(shown)s] AS ids,
       (array_agg(p.kind ORDER BY e.parent_id) FILTER (WHERE NOT e.settled))[1:%(shown)s] AS kinds,
       (array_agg(p.status ORDER BY e.parent_id) FILTER (WHERE NOT e.settled))[1:%(shown)s] AS statuses
FROM jobsup.dependencies e
LEFT JOIN jobsup.jobs p ON p.id = e.parent_id
WHERE e.child_id = %(id)s
