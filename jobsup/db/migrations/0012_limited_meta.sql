-- jobsup schema, version 12: a claim of limited jobs reads their meta in one statement, not one per job.
--
-- claim_limited_with_meta (migration 0010) read each claimed job's meta by a statement of its own, and
-- as it did not fix its plans (the supervisor's sessions force a custom plan per statement) each of
-- them was planned anew: 0.13 to 0.16 ms of a claim of limited jobs that takes about 1 ms. Now the
-- claimed rows are kept in an array and their meta read by one statement after the claim, which, as
-- before, sees the jobs committed while claim_limited waited for its kinds' locks (each statement of a
-- volatile function takes its own snapshot under READ COMMITTED). Same arguments, same columns, same
-- order: a supervisor of the release before calls it as it did.
--
-- Upgrading needs no stop: a type is created and the function replaced under a moment's lock.

-- A claimed row as claim_limited returns it, to keep them in an array between two statements.
CREATE TYPE jobsup.claimed_job AS (
    id bigint, kind text, payload jsonb, queue text, attempts integer, max_attempts integer,
    priority integer, run_at timestamptz, created_at timestamptz, snoozes integer, errors jsonb,
    started_at timestamptz, key text, wake_at timestamptz
);

CREATE OR REPLACE FUNCTION jobsup.claim_limited_with_meta(p_kinds text[], p_queues text[], p_want integer,
                                                          p_locked_by text, p_lease float8)
RETURNS TABLE (id bigint, kind text, payload jsonb, queue text, attempts integer, max_attempts integer,
               priority integer, run_at timestamptz, created_at timestamptz, snoozes integer,
               errors jsonb, started_at timestamptz, key text, meta jsonb, wake_at timestamptz)
SET plan_cache_mode = auto
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    claimed jobsup.claimed_job[];
BEGIN
    SELECT array_agg(c::jobsup.claimed_job) INTO claimed
    FROM jobsup.claim_limited(p_kinds, p_queues, p_want, p_locked_by, p_lease) AS c;
    RETURN QUERY
        SELECT r.id, r.kind, r.payload, r.queue, r.attempts, r.max_attempts, r.priority, r.run_at,
               r.created_at, r.snoozes, r.errors, r.started_at, r.key, j.meta, r.wake_at
        FROM unnest(claimed) WITH ORDINALITY AS r
        LEFT JOIN jobsup.jobs j ON j.id = r.id
        ORDER BY r.ordinality;
END
$$;
