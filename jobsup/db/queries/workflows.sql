-- Workflows: the statements of jobsup/workflow.py, which enqueues jobs with dependencies (a Workflow,
-- or `after=` on an enqueue) and reads a job's parents and children. Settling a dependency when a
-- parent finishes is the schema's (the trigger jobs_finished, migration 0009), not a statement's.

-- name: workflow_known_jobs
-- The jobs an enqueue names by id (its `after=` parents, the waiting jobs it adds parents to, the job
-- whose workflow it extends): each one's status and workflow. An id missing here does not exist.
SELECT id, status, workflow_id FROM jobsup.jobs WHERE id = ANY(%(ids)s::bigint[])

-- name: workflow_insert
-- The jobs of one enqueue, in input order (ids ascend with it), as one statement. A new workflow row
-- is made when `create` is true; otherwise the jobs join `workflow_id` (NULL: none, as for `after=`
-- alone). A job with parents starts `waiting`, its parents_left counting all of them: the ones that
-- have finished already are settled at commit (dependency_added, migration 0009).
WITH w AS (
    INSERT INTO jobsup.workflows (name) SELECT %(name)s::text WHERE %(create)s::boolean RETURNING id
)
INSERT INTO jobsup.jobs (queue, kind, payload, priority, run_at, max_attempts, key, workflow_id, status,
                         parents_left, has_children, meta)
SELECT q, k, p::jsonb, pr, coalesce(r, now()) + make_interval(secs => d), m, ky,
       coalesce((SELECT id FROM w), %(workflow_id)s::bigint),
       CASE WHEN pl > 0 THEN 'waiting' ELSE 'queued' END, pl, hc, mt::jsonb
FROM unnest(%(queues)b::text[], %(kinds)b::text[], %(payloads)b::text[], %(priorities)b::int[],
            %(run_ats)b::timestamptz[], %(delays)b::float8[], %(max_attempts)b::int[], %(keys)b::text[],
            %(parents_left)b::int[], %(has_children)b::boolean[], %(metas)b::text[])
     WITH ORDINALITY AS t(q, k, p, pr, r, d, m, ky, pl, hc, mt, n)
ORDER BY n
RETURNING id, workflow_id

-- name: workflow_wait_for_more
-- Waiting jobs that this enqueue gives more parents (`before=`): each one's count goes up by the
-- number it gains. Only a job still waiting can gain one; the ids it returns are those that were.
UPDATE jobsup.jobs j
SET parents_left = j.parents_left + t.n
FROM unnest(%(ids)s::bigint[], %(counts)s::int[]) AS t(id, n)
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = t.id AND j.status = 'waiting'
RETURNING j.id

-- name: workflow_add_dependencies
WITH added AS (
    INSERT INTO jobsup.dependencies (parent_id, child_id, on_parent_failure, external)
    SELECT * FROM unnest(%(parents)s::bigint[], %(children)s::bigint[], %(policies)s::text[],
                         %(externals)s::boolean[])
    RETURNING 1
)
SELECT count(*) FROM added

-- name: job_parents
-- What a job's parents ended as and returned, for its handler (the fan-in combines them) and for
-- `jobsup workflow`, `jobsup explain` and the console's job screen.
SELECT p.id, p.kind, p.status, p.return_value, p.last_error, p.done_at, e.on_parent_failure
FROM jobsup.dependencies e JOIN jobsup.jobs p ON p.id = e.parent_id
WHERE e.child_id = %(id)s
ORDER BY p.id

-- name: job_children
SELECT c.id, c.kind, c.status, e.on_parent_failure
FROM jobsup.dependencies e JOIN jobsup.jobs c ON c.id = e.child_id
WHERE e.parent_id = %(id)s
ORDER BY c.id

-- name: workflow_row
SELECT id, name, created_at, finished_at, failed FROM jobsup.workflows WHERE id = %(id)s

-- name: workflow_members
-- Every job of a workflow with the ids of its parents: `jobsup workflow`, the console's tree.
SELECT j.id, j.kind, j.status, j.attempts, j.max_attempts, j.created_at, j.started_at, j.done_at, j.last_error,
       j.parents_left,
       coalesce((SELECT array_agg(e.parent_id ORDER BY e.parent_id) FROM jobsup.dependencies e
                 WHERE e.child_id = j.id), '{}')
FROM jobsup.jobs j
WHERE j.workflow_id = %(id)s
ORDER BY j.id

-- name: workflows_recent
-- The newest workflows with their jobs counted by status, from jobs_workflow_idx (an index-only scan
-- per workflow). failed counts jobs that ended dead or cancelled.
SELECT w.id, w.name, w.created_at, w.finished_at, c.total, c.done, c.failed, c.running, c.queued, c.waiting
FROM (SELECT * FROM jobsup.workflows ORDER BY id DESC LIMIT %(limit)s) w
CROSS JOIN LATERAL (
    SELECT count(*) AS total,
           count(*) FILTER (WHERE status = 'done') AS done,
           count(*) FILTER (WHERE status IN ('dead', 'cancelled')) AS failed,
           count(*) FILTER (WHERE status = 'running') AS running,
           count(*) FILTER (WHERE status = 'queued') AS queued,
           count(*) FILTER (WHERE status = 'waiting') AS waiting
    FROM jobsup.jobs WHERE workflow_id = w.id
) c
ORDER BY w.id DESC
