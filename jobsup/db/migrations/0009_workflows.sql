-- jobsup schema, version 9: workflows. Jobs that wait for other jobs; docs/design/architecture.md,
-- "Workflows".
--
-- A job with unfinished parents is `waiting`: outside every claim's index. The outcome write that
-- finishes a parent (done, dead or cancelled, whoever writes it) settles the parent's dependencies in
-- the same transaction, through the trigger jobs_finished below: each child's count of unfinished
-- parents goes down by one, and the child whose count reaches zero becomes `queued`. That is O(1) per
-- dependency, and it holds for every writer of a status: this release's supervisors, jobsup.testing.drain,
-- `jobsup cancel`, the reaper, and the statements of a supervisor of the release before this one, which
-- knows nothing of workflows (its claim takes `queued` jobs only, so it never starts a waiting one).
-- Upgrading needs no stop for this reason; docs/operations/upgrading.md.

-- `waiting` joins the statuses (NOT VALID: a superset of the old check, so no scan under the table's
-- lock; see migration 0005).
ALTER TABLE jobsup.jobs
    DROP CONSTRAINT jobs_status_check,
    ADD CONSTRAINT jobs_status_check
        CHECK (status IN ('waiting', 'queued', 'running', 'done', 'dead', 'cancelled')) NOT VALID;

-- workflow_id: the workflow the job belongs to (NULL: none; a job enqueued with `after=` alone belongs
-- to none). parents_left: how many of its parents have not finished; it is `waiting` while that is
-- above zero. has_children: some job depends on it, so its finishing runs the trigger below; for every
-- other job the trigger's WHEN is false and costs one comparison.
ALTER TABLE jobsup.jobs ADD COLUMN IF NOT EXISTS workflow_id bigint,
                        ADD COLUMN IF NOT EXISTS parents_left integer NOT NULL DEFAULT 0,
                        ADD COLUMN IF NOT EXISTS has_children boolean NOT NULL DEFAULT false;

CREATE TABLE jobsup.workflows (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name         text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    -- Set by the pruner once no job of the workflow is waiting, queued or running (a workflow's last
    -- jobs can finish in two transactions at once, each unable to see the other's: a sweep cannot miss
    -- what a trigger would). failed: some job ended dead or cancelled.
    finished_at  timestamptz,
    failed       boolean
);
CREATE INDEX workflows_open_idx ON jobsup.workflows (id) WHERE finished_at IS NULL;
-- Retention's: the finished workflows past their window (done and failed ones have windows of their own).
CREATE INDEX workflows_finished_idx ON jobsup.workflows (failed, finished_at) WHERE finished_at IS NOT NULL;

-- One row per dependency: `child_id` waits for `parent_id`. on_parent_failure: what a parent that
-- ends dead or cancelled does to the child: 'cancel' it (and, through it, its own dependents of that
-- policy), or let it 'run' as if the parent were done. settled: the parent has finished and the child
-- has been told; a dependency is settled once, which makes settling idempotent (a cancelled child's
-- own trigger finds nothing left to do). external: the parent existed before the transaction that
-- added the dependency (an `after=` id); see dependency_added.
CREATE TABLE jobsup.dependencies (
    parent_id          bigint  NOT NULL,
    child_id           bigint  NOT NULL,
    on_parent_failure  text    NOT NULL DEFAULT 'cancel' CHECK (on_parent_failure IN ('cancel', 'run')),
    external           boolean NOT NULL DEFAULT false,
    settled            boolean NOT NULL DEFAULT false,
    PRIMARY KEY (parent_id, child_id)
);
CREATE INDEX dependencies_child_idx ON jobsup.dependencies (child_id);

-- A workflow's jobs by status (its progress, its cancel, its pruning), and the waiting jobs (counted
-- by stats, the console and the metrics). Both are partial: a job outside any workflow, and one not
-- waiting, is not in them. Built under this transaction's lock on the table, as 0008's index was; to
-- build them beforehand without blocking, run the same statements with CONCURRENTLY (after the
-- ALTER TABLE above): this migration keeps them.
CREATE INDEX IF NOT EXISTS jobs_workflow_idx ON jobsup.jobs (workflow_id, status) WHERE workflow_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_waiting_idx ON jobsup.jobs (queue, kind) WHERE status = 'waiting';

-- Settles the unsettled dependencies of `parent`, which has just ended `parent_status` (done, dead or
-- cancelled); `only_child` (non-NULL) settles that one dependency alone. A child whose last unfinished
-- parent this was becomes queued (at its run_at, or now), announced on the channel as an enqueue is. A
-- failed parent cancels the children that wait on it under the 'cancel' policy, and theirs
-- transitively, in this one call: their own triggers then find their dependencies settled, so the
-- cascade never nests deeper than one trigger, whatever the length of the chain.
--
-- Children are locked in id order before they change: two outcome writes settling parents of the same
-- children lock them in one order, never crosswise.
CREATE FUNCTION jobsup.settle_children(parent bigint, parent_status text, only_child bigint DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    doomed bigint[] := '{}';
    reason text := format('cancelled: job %s, which it waits for, ended %s', parent, parent_status);
    told integer;
BEGIN
    IF parent_status <> 'done' THEN
        WITH RECURSIVE d(id) AS (
            SELECT e.child_id FROM jobsup.dependencies e
            WHERE e.parent_id = parent AND NOT e.settled AND e.on_parent_failure = 'cancel'
              AND (only_child IS NULL OR e.child_id = only_child)
            UNION
            SELECT e.child_id FROM d JOIN jobsup.dependencies e ON e.parent_id = d.id
            WHERE NOT e.settled AND e.on_parent_failure = 'cancel'
        )
        SELECT coalesce(array_agg(j.id ORDER BY j.id), '{}') INTO doomed
        FROM d JOIN jobsup.jobs j ON j.id = d.id
        WHERE j.status = 'waiting';
    END IF;

    PERFORM 1 FROM jobsup.jobs j
    WHERE j.id = ANY(ARRAY(
        SELECT e.child_id FROM jobsup.dependencies e
        WHERE NOT e.settled AND ((e.parent_id = parent AND (only_child IS NULL OR e.child_id = only_child))
                                 OR e.parent_id = ANY(doomed))))
      AND j.status = 'waiting'
    ORDER BY j.id
    FOR NO KEY UPDATE;

    WITH settled AS (
        UPDATE jobsup.dependencies e SET settled = true
        WHERE NOT e.settled AND ((e.parent_id = parent AND (only_child IS NULL OR e.child_id = only_child))
                                 OR e.parent_id = ANY(doomed))
        RETURNING e.child_id
    ), counts AS (
        SELECT child_id, count(*)::int AS n FROM settled
        WHERE NOT (child_id = ANY(doomed))
        GROUP BY child_id
    ), released AS (
        UPDATE jobsup.jobs j
        SET parents_left = j.parents_left - c.n,
            status = CASE WHEN j.parents_left <= c.n THEN 'queued' ELSE 'waiting' END,
            run_at = CASE WHEN j.parents_left <= c.n THEN greatest(j.run_at, now()) ELSE j.run_at END
        FROM counts c
        WHERE j.id = c.child_id AND j.status = 'waiting'
        RETURNING j.queue, j.status, j.run_at
    )
    -- As the insert trigger's: the queue and when the job is due (a supervisor whose claim keys are
    -- before it need not rescan its queue). PostgreSQL folds identical notifications of one transaction
    -- into one: one per queue, as the released jobs of one write share now().
    SELECT count(pg_notify('jobsup', json_build_object('queues', ARRAY[queue],
                                                       'run_at', extract(epoch FROM run_at))::text)) INTO told
    FROM released WHERE status = 'queued';

    IF cardinality(doomed) > 0 THEN
        WITH cancelled AS (
            UPDATE jobsup.jobs j
            SET status = 'cancelled', done_at = now(), cancelled_by = 'workflow', last_error = reason,
                errors = j.errors || jsonb_build_array(jsonb_build_object(
                    'attempt', j.attempts, 'at', now(), 'error', reason, 'by', 'workflow'))
            WHERE j.id = ANY(doomed) AND j.status = 'waiting'
            RETURNING j.kind
        )
        INSERT INTO jobsup.kind_totals AS t (kind, slot, cancelled)
        SELECT kind, mod(pg_backend_pid(), 16)::smallint, count(*) FROM cancelled GROUP BY kind
        ON CONFLICT (kind, slot) DO UPDATE SET cancelled = t.cancelled + excluded.cancelled;
    END IF;
END
$$;

CREATE FUNCTION jobsup.job_finished() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM jobsup.settle_children(NEW.id, NEW.status);
    RETURN NULL;
END
$$;

-- A parent's retries (queued again), snoozes and releases are not its end: only done, dead and
-- cancelled settle its children.
CREATE TRIGGER jobs_finished AFTER UPDATE OF status ON jobsup.jobs FOR EACH ROW
    WHEN (NEW.has_children AND NEW.status IN ('done', 'dead', 'cancelled') AND OLD.status <> NEW.status)
    EXECUTE FUNCTION jobsup.job_finished();

-- A dependency on a job that existed before (an `after=` id) is checked at the commit of the
-- transaction that added it: the parent's row is locked, and either it has finished (the dependency
-- is settled at once, by the rule its status calls for) or it is marked as having children, and its
-- outcome write, which waits for the lock, settles it. Checked any earlier, a parent finishing between
-- the check and the commit would not see the uncommitted dependency, and the child would wait forever;
-- locked any earlier, the parent's outcome write would wait for the whole of the caller's transaction.
CREATE FUNCTION jobsup.dependency_added() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    parent_status text;
BEGIN
    SELECT status INTO parent_status FROM jobsup.jobs WHERE id = NEW.parent_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        -- Deleted since the enqueue checked it: only a finished job is deleted.
        parent_status := 'done';
    END IF;
    -- Marked whether or not it has finished: a finished parent is kept for its child to read too
    -- (jobs_keep_needed_parent).
    UPDATE jobsup.jobs SET has_children = true WHERE id = NEW.parent_id AND NOT has_children;
    IF parent_status IN ('done', 'dead', 'cancelled') THEN
        PERFORM jobsup.settle_children(NEW.parent_id, parent_status, NEW.child_id);
    END IF;
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER dependencies_external AFTER INSERT ON jobsup.dependencies
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.external)
    EXECUTE FUNCTION jobsup.dependency_added();

-- A parent stays while a child that has not finished may still read what it returned: a delete of
-- it (retention, `jobsup prune`, the pruner of an earlier release, a hand-written DELETE) skips it.
CREATE FUNCTION jobsup.keep_needed_parent() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM jobsup.dependencies e JOIN jobsup.jobs c ON c.id = e.child_id
               WHERE e.parent_id = OLD.id AND c.status IN ('waiting', 'queued', 'running')) THEN
        RETURN NULL;
    END IF;
    RETURN OLD;
END
$$;

CREATE TRIGGER jobs_keep_needed_parent BEFORE DELETE ON jobsup.jobs FOR EACH ROW
    WHEN (OLD.has_children)
    EXECUTE FUNCTION jobsup.keep_needed_parent();
