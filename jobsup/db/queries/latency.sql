-- Queue latency and run time per kind per minute (jobsup/ops/latency.py). Each supervisor's outcome writer
-- (jobsup/supervisor/writer.py) merges its histograms into jobsup.latency; jobsup/ops/latency.py
-- reads them for `jobsup stats` (jobsup/ops/snapshot.py) and the console (jobsup/monitor/source.py);
-- the pruner (jobsup/supervisor/pruner.py) trims them.

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
