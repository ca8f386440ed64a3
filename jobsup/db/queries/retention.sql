-- Retention, run by jobsup/ops/prune.py for the supervisors' pruner (jobsup/supervisor/pruner.py) and
-- `jobsup prune`: finished jobs and events past their window go in bounded batches, each its own short
-- transaction that first takes the pruning turn. Finding them reads jobs_finished_idx, so a batch costs
-- the same with a billion finished rows as with a thousand; SKIP LOCKED steps over a dead job being
-- requeued rather than waiting for it. %(keep)s is the window in seconds. The pruner also trims the
-- latency histograms (latency_trim, latency.sql).

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
