-- Retention, run by jobsup/ops/prune.py for the supervisors' pruner (jobsup/supervisor/pruner.py) and
-- `jobsup prune`: finished jobs and events past their window go in bounded batches, each its own short
-- transaction that first takes the pruning turn. Finding them reads jobs_finished_idx, so a batch costs
-- the same with a billion finished rows as with a thousand; SKIP LOCKED steps over a dead job being
-- requeued rather than waiting for it. %(keep)s is the window in seconds. A workflow's jobs go together,
-- with the workflow, once the sweep (finish_workflows) has found them all finished and the window has
-- passed since the last one finished. The pruner also trims the latency histograms (latency_trim,
-- latency.sql).

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
-- planner hashes the batch and reads the whole table to find them. Two kinds of finished job are left,
-- both tested on the rows the range scan of jobs_finished_idx reads (the index holds neither column):
-- a workflow's jobs, which go together with their workflow (prune_workflow_jobs), and a parent whose
-- child has not finished (the child may still read what it returned). The schema's trigger
-- jobs_keep_needed_parent would skip deleting that parent anyway; picked, it would come back at the head
-- of every batch, and enough of them would fill each batch and hold back the rows after them. That test
-- is a scalar subquery with LIMIT 1, not an EXISTS: the planner may hash an EXISTS, reading every
-- unfinished job (a sequential scan of the table) once per batch; this runs for a parent only, through
-- the primary keys of the dependencies and of the jobs. The count is of the rows the DELETE returns: a
-- row the trigger skips (a child requeued since the batch began) is not one. The dependencies of every
-- job deleted go with it, whether it was their parent or their child.
WITH picked AS (
    SELECT j.id FROM jobsup.jobs j
    WHERE j.status = 'done' AND j.done_at < now() - make_interval(secs => %(keep)s::float8)
      AND j.workflow_id IS NULL
      AND (NOT j.has_children OR (
          SELECT 1 FROM jobsup.dependencies e JOIN jobsup.jobs c ON c.id = e.child_id
          WHERE e.parent_id = j.id AND c.status IN ('waiting', 'queued', 'running') LIMIT 1) IS NULL)
    ORDER BY j.done_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM jobsup.jobs WHERE id = ANY(ARRAY(SELECT id FROM picked)) RETURNING id
), edges AS (
    DELETE FROM jobsup.dependencies
    WHERE parent_id = ANY(ARRAY(SELECT id FROM gone)) OR child_id = ANY(ARRAY(SELECT id FROM gone))
)
SELECT count(*) FROM gone

-- name: prune_dead
-- Dead and cancelled jobs, each status its own ordered range of jobs_finished_idx (one `status IN`
-- scan in no order is what the planner swaps for a sequential scan when many rows are dead). A batch
-- takes up to `limit` of each, leaving what prune_done leaves, for the same reasons. `dead` of the
-- per-kind totals is "dead now", the jobs one can still requeue, so deleting a dead job lowers it as
-- requeueing does; `done` and `failed` count every job ever and are left alone.
WITH dead AS (
    SELECT j.id FROM jobsup.jobs j
    WHERE j.status = 'dead' AND j.done_at < now() - make_interval(secs => %(keep)s::float8)
      AND j.workflow_id IS NULL
      AND (NOT j.has_children OR (
          SELECT 1 FROM jobsup.dependencies e JOIN jobsup.jobs c ON c.id = e.child_id
          WHERE e.parent_id = j.id AND c.status IN ('waiting', 'queued', 'running') LIMIT 1) IS NULL)
    ORDER BY j.done_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED
), cancelled AS (
    SELECT j.id FROM jobsup.jobs j
    WHERE j.status = 'cancelled' AND j.done_at < now() - make_interval(secs => %(keep)s::float8)
      AND j.workflow_id IS NULL
      AND (NOT j.has_children OR (
          SELECT 1 FROM jobsup.dependencies e JOIN jobsup.jobs c ON c.id = e.child_id
          WHERE e.parent_id = j.id AND c.status IN ('waiting', 'queued', 'running') LIMIT 1) IS NULL)
    ORDER BY j.done_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM jobsup.jobs
    WHERE id = ANY(ARRAY(SELECT id FROM dead UNION ALL SELECT id FROM cancelled))
    RETURNING id, kind, status
), edges AS (
    DELETE FROM jobsup.dependencies
    WHERE parent_id = ANY(ARRAY(SELECT id FROM gone)) OR child_id = ANY(ARRAY(SELECT id FROM gone))
), totals AS (
    INSERT INTO jobsup.kind_totals AS t (kind, slot, dead)
    SELECT kind, mod(pg_backend_pid(), 16)::smallint, -count(*) FROM gone WHERE status = 'dead' GROUP BY kind
    ON CONFLICT (kind, slot) DO UPDATE SET dead = t.dead + excluded.dead
)
SELECT count(*) FROM gone

-- name: finish_workflows
-- The sweep that says a workflow has finished: open workflows (workflows_open_idx) after the id
-- `after`, `limit` of them, each tested for a job waiting, queued or running (jobs_workflow_idx); one
-- with none gets finished_at, when its last job finished, and failed, whether one ended dead or
-- cancelled. A sweep rather than the outcome write: a workflow's last jobs can finish in two
-- transactions at once, each unable to see the other's. It reopens nothing: a finished workflow whose
-- dead job is requeued stays finished, and is not pruned while that job has not finished again
-- (prune_workflow_jobs). A workflow with no job left (deleted by hand, or by the pruner of a release
-- before workflows) finishes now. `last` is where the next batch starts; `seen` below `limit` ends the
-- sweep. "Has a job not finished" is a scalar subquery with LIMIT 1 here and below, for the reason
-- prune_done gives: as a NOT EXISTS, the planner may hash it, reading every unfinished job.
WITH open AS (
    SELECT w.id FROM jobsup.workflows w
    WHERE w.finished_at IS NULL AND w.id > %(after)s
    ORDER BY w.id
    LIMIT %(limit)s
), finished AS (
    UPDATE jobsup.workflows w
    SET finished_at = coalesce((SELECT max(j.done_at) FROM jobsup.jobs j WHERE j.workflow_id = w.id), now()),
        failed = EXISTS (SELECT 1 FROM jobsup.jobs j
                         WHERE j.workflow_id = w.id AND j.status IN ('dead', 'cancelled'))
    WHERE w.id = ANY(ARRAY(SELECT id FROM open)) AND w.finished_at IS NULL
      AND (SELECT 1 FROM jobsup.jobs j
           WHERE j.workflow_id = w.id AND j.status IN ('waiting', 'queued', 'running') LIMIT 1) IS NULL
    RETURNING w.id
)
SELECT (SELECT max(id) FROM open) AS last, (SELECT count(*) FROM open) AS seen,
       (SELECT count(*) FROM finished) AS finished

-- name: prune_workflow_jobs
-- The jobs of finished workflows past their window, together: the done workflows' (failed false) by
-- --keep-done, the failed ones' by --keep-dead, `failed` saying which. Up to `limit` workflows, oldest
-- finished first, none with a job that has not finished (a dead job requeued since the sweep), and up
-- to `limit` of their jobs (a parent whose child outside the workflow has not finished stays, as in
-- prune_done); their dependencies go with them, and dead ones lower the per-kind dead as in prune_dead.
-- `due` is the workflows considered: prune_workflow_rows, next in the same transaction, deletes those
-- left without a job.
WITH due AS (
    SELECT w.id FROM jobsup.workflows w
    WHERE w.failed = %(failed)s AND w.finished_at < now() - make_interval(secs => %(keep)s::float8)
      AND (SELECT 1 FROM jobsup.jobs j
           WHERE j.workflow_id = w.id AND j.status IN ('waiting', 'queued', 'running') LIMIT 1) IS NULL
    ORDER BY w.finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), picked AS (
    SELECT j.id FROM jobsup.jobs j
    WHERE j.workflow_id = ANY(ARRAY(SELECT id FROM due)) AND j.status IN ('done', 'dead', 'cancelled')
      AND (NOT j.has_children OR (
          SELECT 1 FROM jobsup.dependencies e JOIN jobsup.jobs c ON c.id = e.child_id
          WHERE e.parent_id = j.id AND c.status IN ('waiting', 'queued', 'running') LIMIT 1) IS NULL)
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM jobsup.jobs WHERE id = ANY(ARRAY(SELECT id FROM picked)) RETURNING id, kind, status
), edges AS (
    DELETE FROM jobsup.dependencies
    WHERE parent_id = ANY(ARRAY(SELECT id FROM gone)) OR child_id = ANY(ARRAY(SELECT id FROM gone))
), totals AS (
    INSERT INTO jobsup.kind_totals AS t (kind, slot, dead)
    SELECT kind, mod(pg_backend_pid(), 16)::smallint, -count(*) FROM gone WHERE status = 'dead' GROUP BY kind
    ON CONFLICT (kind, slot) DO UPDATE SET dead = t.dead + excluded.dead
)
SELECT (SELECT count(*) FROM gone WHERE status = 'done') AS done,
       (SELECT count(*) FROM gone WHERE status <> 'done') AS dead,
       ARRAY(SELECT id FROM due) AS due

-- name: prune_workflow_rows
-- After prune_workflow_jobs, in its transaction (whose deletes this statement sees; a statement of its
-- own for that): the workflows it considered that have no job left.
DELETE FROM jobsup.workflows w
WHERE w.id = ANY(%(ids)s::bigint[])
  AND (SELECT 1 FROM jobsup.jobs j WHERE j.workflow_id = w.id LIMIT 1) IS NULL

-- name: prune_events
DELETE FROM jobsup.events
WHERE id = ANY(ARRAY(
    SELECT id FROM jobsup.events
    WHERE at < now() - make_interval(secs => %(keep)s::float8)
    ORDER BY at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED))

-- name: prunable
-- What a prune would remove now, for `jobsup prune --dry-run`, by the tests of the statements above.
-- NULL windows (keep forever) count 0. A workflow whose jobs have all finished counts as the sweep
-- (finish_workflows) will make it: finished when its last job did. Its jobs count among the done and
-- dead jobs, as a prune counts them.
WITH flows AS (
    SELECT w.id,
           coalesce(w.finished_at, (SELECT max(j.done_at) FROM jobsup.jobs j WHERE j.workflow_id = w.id)) AS finished_at,
           coalesce(w.failed, EXISTS (SELECT 1 FROM jobsup.jobs j
                                      WHERE j.workflow_id = w.id AND j.status IN ('dead', 'cancelled'))) AS failed
    FROM jobsup.workflows w
    WHERE (SELECT 1 FROM jobsup.jobs j
           WHERE j.workflow_id = w.id AND j.status IN ('waiting', 'queued', 'running') LIMIT 1) IS NULL
), due AS (
    SELECT id FROM flows
    WHERE finished_at < now() - make_interval(
        secs => CASE WHEN failed THEN %(keep_dead)s::float8 ELSE %(keep_done)s::float8 END)
), prunable AS (
    -- Three parts, each found as its statement finds it: the ranges of jobs_finished_idx, the index of
    -- the workflows' jobs.
    SELECT j.id, j.status, j.has_children FROM jobsup.jobs j
    WHERE j.status = 'done' AND j.done_at < now() - make_interval(secs => %(keep_done)s::float8)
      AND j.workflow_id IS NULL
    UNION ALL
    SELECT j.id, j.status, j.has_children FROM jobsup.jobs j
    WHERE j.status IN ('dead', 'cancelled') AND j.done_at < now() - make_interval(secs => %(keep_dead)s::float8)
      AND j.workflow_id IS NULL
    UNION ALL
    SELECT j.id, j.status, j.has_children FROM jobsup.jobs j
    WHERE j.workflow_id = ANY(ARRAY(SELECT id FROM due)) AND j.status IN ('done', 'dead', 'cancelled')
), going AS (
    SELECT p.status FROM prunable p
    WHERE (NOT p.has_children OR (
        SELECT 1 FROM jobsup.dependencies e JOIN jobsup.jobs c ON c.id = e.child_id
        WHERE e.parent_id = p.id AND c.status IN ('waiting', 'queued', 'running') LIMIT 1) IS NULL)
)
SELECT (SELECT count(*) FROM going WHERE status = 'done'),
       (SELECT count(*) FROM going WHERE status <> 'done'),
       (SELECT count(*) FROM jobsup.events
        WHERE at < now() - make_interval(secs => %(keep_events)s::float8))
       + (SELECT count(*) FROM jobsup.audit
          WHERE at < now() - make_interval(secs => %(keep_events)s::float8)),
       (SELECT count(*) FROM due)

-- name: prune_audit
-- The web console's audit rows past the events' window, as prune_events deletes events.
DELETE FROM jobsup.audit
WHERE id = ANY(ARRAY(
    SELECT id FROM jobsup.audit
    WHERE at < now() - make_interval(secs => %(keep)s::float8)
    ORDER BY at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED))
