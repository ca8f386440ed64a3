-- Alerts: `jobsup check` (jobsup/ops/check.py) and the queue-wide exporter of `jobsup metrics`
-- (jobsup/ops/metrics.py). Both read oldest_ready and limited_kinds of snapshot.sql too, and the exporter
-- live_counts.

-- name: check_figures
-- The design's three alerts in one row: the oldest ready job's age per queue comes from oldest_ready;
-- these read the partial index of dead jobs and the events index.
SELECT (SELECT count(*) FROM jobsup.jobs
        WHERE status = 'dead' AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)) AS dead,
       (SELECT coalesce(sum(count), 0) FROM jobsup.events
        WHERE action = 'reaped' AND at > now() - interval '1 minute')::bigint AS reaped_last_minute

-- name: exporter_dead
SELECT queue, kind, count(*) AS dead FROM jobsup.jobs WHERE status = 'dead' GROUP BY queue, kind
