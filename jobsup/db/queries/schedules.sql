-- Recurring jobs (app.every). The supervisor's scheduler (jobsup/supervisor/scheduler.py) declares the
-- app's schedules, then fires each one: an on-time fire in one statement (schedule_fire_next), the
-- others in a transaction that holds the schedule's row: schedule_lock, the fires enqueued with
-- enqueue_many (jobs.sql), schedule_fired. `jobsup cron` and the console list, run, pause and resume
-- them through jobsup/ops/schedules.py. A pause or resume is announced on the jobsup channel as
-- {"schedule": name, ...}.

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

-- jobsup/ops/schedules.py

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
