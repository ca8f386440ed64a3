-- jobsup schema, version 10: a job's meta. What enqueue middleware store with a job (a tenant, a
-- request id, the trace context of jobsup.otel), read by its run middleware and handler as job.meta;
-- docs/guides/middleware.md.
--
-- Upgrading needs no stop: a nullable column without a default is an entry in the catalog, added under
-- a moment's lock without rewriting or scanning the table, and no statement of an earlier release names
-- it (each names the columns it inserts and returns), so its supervisors claim, complete and enqueue
-- as before; their jobs have no meta, as jobs enqueued without middleware have none.

-- NULL for none (most jobs): a JSON object of what enqueue middleware added, at most
-- jobsup.job.MAX_META_BYTES of compact JSON, checked where it is encoded. Kept out of `payload` so the
-- handler's arguments stay its own and a middleware cannot collide with them.
ALTER TABLE jobsup.jobs ADD COLUMN IF NOT EXISTS meta jsonb;

-- The meta of a job that claim_limited (migration 0008) has just claimed, for the claim_limited
-- statement, which returns it beside that function's columns. A join in that statement would read
-- jobsup.jobs with the statement's snapshot, taken before the function waits for its kinds' locks: a
-- job committed during that wait is claimed by the function, whose statements each take a snapshot of
-- their own, but is not in the statement's, and its meta would come back NULL. A volatile function
-- reads with a snapshot of its own, taken when it is called, after the claim. STRICT: the row that
-- carries only wake_at has no id, and costs no call.
CREATE FUNCTION jobsup.job_meta(p_id bigint) RETURNS jsonb LANGUAGE sql VOLATILE STRICT AS $$
    SELECT meta FROM jobsup.jobs WHERE id = p_id
$$;
