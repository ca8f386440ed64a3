-- jobsup schema, version 8: limits. At most N jobs of a kind (or of one key of a kind) held at once, at
-- most R started per period, across every supervisor; docs/design/architecture.md, "Limits".
--
-- Upgrading: a supervisor of an earlier release claims with a statement that knows no limits. From this
-- version on every claim says which claim protocol it speaks (the setting jobsup.claim_protocol, set by
-- the claim itself), and a trigger refuses one that speaks an older protocol than
-- jobsup.compat's: an earlier supervisor's claim fails with that error, its claim loop ends, and it stops
-- (the reaper returns what it held if it does not hand it back itself). Its outcome writes, renewals and
-- releases still work: a slot is the row's status, so they free it as they always did. Stop the earlier
-- supervisors before or while you migrate; docs/operations/upgrading.md.

-- key: the per-key dimension of a kind's limits (an account, a customer), given at enqueue or computed
-- from the payload by the handler's key function. limited: the job's kind has a limit, so it is claimed
-- by claim_limited below and not by the claim's one scan per queue; set by the insert trigger from
-- jobsup.limits, and on every job of a kind whose limit is set or removed (jobsup/ops/limits.py).
ALTER TABLE jobsup.jobs ADD COLUMN IF NOT EXISTS key text,
                        ADD COLUMN IF NOT EXISTS limited boolean NOT NULL DEFAULT false;

-- One row per kind with limits. The values in force are the columns; `declared` is what the app of the
-- last supervisor to start declared, `set_by` (non-NULL) says an operator's `jobsup limit` set them,
-- which wins over any app's until `jobsup limit KIND --reset`. A row whose values are all NULL limits
-- nothing (an operator removed the app's limits).
CREATE TABLE jobsup.limits (
    kind             text PRIMARY KEY,
    concurrency      integer CHECK (concurrency >= 1),
    -- At most `rate` starts per `period` seconds, spaced evenly (GCRA), `burst` of them at once.
    rate             integer CHECK (rate >= 1),
    period           float8  CHECK (period > 0),
    burst            integer CHECK (burst >= 1),
    key_concurrency  integer CHECK (key_concurrency >= 1),
    key_rate         integer CHECK (key_rate >= 1),
    key_period       float8  CHECK (key_period > 0),
    key_burst        integer CHECK (key_burst >= 1),
    CHECK ((rate IS NULL) = (period IS NULL) AND (rate IS NULL) = (burst IS NULL)),
    CHECK ((key_rate IS NULL) = (key_period IS NULL) AND (key_rate IS NULL) = (key_burst IS NULL)),
    limited          boolean GENERATED ALWAYS AS (
                         coalesce(concurrency, rate, key_concurrency, key_rate) IS NOT NULL) STORED,
    declared         jsonb,
    declared_by      text,
    declared_at      timestamptz,
    set_by           text,
    set_at           timestamptz,
    -- The kind's rate, GCRA's "theoretical arrival time": the next start is on time at tat, and
    -- `burst - 1` intervals early at most. NULL: no start yet.
    tat              timestamptz,
    -- Keys take turns: the last key a claim served; the next claim starts after it.
    key_cursor       text
);

-- The per-key rate's tat, for each key started within its rate's memory; the reaper deletes rows whose
-- tat has passed (such a key may start a full burst, as a key without a row).
CREATE TABLE jobsup.limit_keys (
    kind  text        NOT NULL,
    key   text        NOT NULL,
    tat   timestamptz NOT NULL,
    PRIMARY KEY (kind, key)
);

-- Which claim protocol the schema requires, for supervisors that read it (this release on: each
-- heartbeat reads it and stops claiming when its own is older) and, through the trigger below, for
-- those that do not.
CREATE TABLE jobsup.compat (
    name    text    PRIMARY KEY,
    oldest  integer NOT NULL,
    why     text    NOT NULL
);
INSERT INTO jobsup.compat VALUES
    ('claim', 8, 'limits (schema version 8): its claim would not leave the jobs of limited kinds to claim_limited; run a jobsup whose schema is version 8 or later');

-- The ready index leaves limited jobs out: a kind held at its limit with a deep backlog costs the claim
-- of every other kind nothing. It is rebuilt here, under this transaction's lock on the table: on a table
-- of millions of rows that stops enqueues and claims for as long as the build reads the table. To avoid
-- that, build it beforehand without blocking, and this migration keeps it:
--   CREATE INDEX CONCURRENTLY jobs_ready_v8_idx ON jobsup.jobs (queue, priority DESC, run_at, id)
--       WHERE status = 'queued' AND NOT limited;
-- (after `ALTER TABLE jobsup.jobs ADD COLUMN IF NOT EXISTS limited boolean NOT NULL DEFAULT false`).
CREATE INDEX IF NOT EXISTS jobs_ready_v8_idx ON jobsup.jobs (queue, priority DESC, run_at, id)
    WHERE status = 'queued' AND NOT limited;
DROP INDEX jobsup.jobs_ready_idx;
ALTER INDEX jobsup.jobs_ready_v8_idx RENAME TO jobs_ready_idx;

-- claim_limited's: the ready jobs of a limited kind by priority, then key (keys take turns), then
-- run_at; and its held jobs by key, to count what a kind or a key holds. The jobs without a key are
-- the group '' (a key is never empty): an equality on the key column, so within a group the index
-- gives run_at order (an `IS NULL` does not, and the jobs without a key were sorted whole each claim).
CREATE INDEX jobs_limited_ready_idx ON jobsup.jobs (kind, priority DESC, (coalesce(key, '')), run_at, id)
    WHERE status = 'queued' AND limited;
CREATE INDEX jobs_limited_held_idx ON jobsup.jobs (kind, key) WHERE status = 'running' AND limited;

-- The insert trigger marks the jobs of limited kinds. Without any limit it costs one probe of an empty
-- table per INSERT statement; a limited job is written twice (inserted, then marked), an unlimited one
-- once.
CREATE OR REPLACE FUNCTION jobsup.notify_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    queues text[];
    earliest timestamptz;
BEGIN
    SELECT array_agg(DISTINCT queue), min(run_at) INTO queues, earliest FROM inserted;
    IF queues IS NULL THEN
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM jobsup.limits WHERE limited) THEN
        UPDATE jobsup.jobs j SET limited = true
        FROM inserted i JOIN jobsup.limits l ON l.kind = i.kind AND l.limited
        WHERE j.id = i.id AND NOT j.limited;
    END IF;
    IF cardinality(queues) > 20 OR octet_length(array_to_string(queues, ',')) > 2000 THEN
        queues := '{}';
    END IF;
    PERFORM pg_notify('jobsup', json_build_object('queues', queues,
                                                  'run_at', extract(epoch FROM earliest))::text);
    RETURN NULL;
END
$$;

-- Refuses a claim (a queued job becoming running) that does not say it speaks claim protocol 8 or later.
-- The WHEN is evaluated without calling the function, and only for rows whose status changes: what an
-- outcome write pays for it is one comparison per row.
CREATE FUNCTION jobsup.refuse_old_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'jobsup: this supervisor''s release may not claim from this schema: %',
        (SELECT why FROM jobsup.compat WHERE name = 'claim')
        USING ERRCODE = 'JS001',
              HINT = 'upgrade the supervisor (pip install -U jobsup) and start it again; '
                     'what it holds is finished or handed back as usual';
END
$$;

CREATE TRIGGER jobs_claim_protocol BEFORE UPDATE OF status ON jobsup.jobs FOR EACH ROW
    WHEN (NEW.status = 'running' AND OLD.status = 'queued'
          AND coalesce(nullif(current_setting('jobsup.claim_protocol', true), ''), '0')::int < 8)
    EXECUTE FUNCTION jobsup.refuse_old_claim();

-- GCRA, for claim_limited and for jobsup explain: how many starts a rate allows at `at` given its tat;
-- when the next one is allowed; and the tat after `n` starts at `at`. An interval is period / rate.
--
-- With one change: a claim that comes less than an interval late keeps the schedule (the next start is
-- due an interval after the last one was due, not after the late claim), where plain GCRA restarts it
-- from the claim and loses the lateness for good. Claims are late by a timer and a round trip, a few
-- milliseconds each time: at 100/s with a burst of 1, plain GCRA delivered 55 to 79 starts a second.
-- This one delivers the rate, and no window of a period holds more than rate + burst starts (a claim
-- that comes an interval late or more restarts the schedule from itself, as after a quiet spell, with
-- `burst` starts at once at most).
CREATE FUNCTION jobsup.rate_room(tat timestamptz, at timestamptz, rate integer, period float8, burst integer)
RETURNS integer LANGUAGE sql IMMUTABLE AS $$
    SELECT least(burst, greatest(0, floor(extract(epoch FROM at - coalesce(tat, at))::float8 * rate / period
                                          + 1e-6)::integer + burst))
$$;

CREATE FUNCTION jobsup.rate_next(tat timestamptz, at timestamptz, rate integer, period float8, burst integer)
RETURNS timestamptz LANGUAGE sql IMMUTABLE AS $$
    SELECT greatest(at, coalesce(tat, at) - make_interval(secs => (burst - 1) * period / rate))
$$;

CREATE FUNCTION jobsup.rate_after(tat timestamptz, at timestamptz, n integer, rate integer, period float8)
RETURNS timestamptz LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN tat IS NULL OR tat < at - make_interval(secs => period / rate) THEN at ELSE tat END
           + make_interval(secs => n * period / rate)
$$;

-- The claim of limited kinds (jobsup/db/lifecycle.py claim_limited). For each kind in turn it locks the
-- kind's limits row, so claims of one kind run one at a time across every supervisor; then counts, in
-- statements that each see what the claim before it committed (a volatile function's statements take
-- their own snapshots under READ COMMITTED), what the kind and its keys hold. So a limit holds exactly,
-- with no counter to keep: a held job is a running row, and every write that ends a hold (an outcome,
-- a release, the reaper's return) frees its slot by changing the row's status, whatever its release.
--
-- It takes jobs by priority; within a priority, one job per key in turn from after the key the last
-- claim served (jobs without a key are one more turn, as many as there is room for), so a key with
-- 100,000 jobs waiting does not starve one with 10. A kind at its limit is left at once: no claim reads
-- its backlog. Rows of kind NULL say when a rate lets the next start of a kind (or a key) happen:
-- `wake_at`, for the supervisor's timer, as a future run_at.
CREATE FUNCTION jobsup.claim_limited(p_kinds text[], p_queues text[], p_want integer, p_locked_by text,
                                     p_lease float8)
RETURNS TABLE (id bigint, kind text, payload jsonb, queue text, attempts integer, max_attempts integer,
               priority integer, run_at timestamptz, created_at timestamptz, snoozes integer,
               errors jsonb, started_at timestamptz, key text, wake_at timestamptz)
-- Its statements keep the plans they are given once, whatever the session asks (the supervisor's
-- sessions force a custom plan per statement, which made each claim 5 to 10 times slower: each of its
-- several statements was planned anew at every claim).
SET plan_cache_mode = auto
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_kind text;
    lim jobsup.limits%ROWTYPE;
    v_now timestamptz;
    v_left integer := p_want;
    v_room integer;
    v_held integer;
    v_taken integer;
    v_level integer;
    v_key text;
    v_next text;
    v_job bigint;
    v_key_tat timestamptz;
    v_visits integer;
    v_cycle_taken integer;
    v_passes integer;
    v_start text;
    v_wake timestamptz;
    v_due timestamptz;
BEGIN
    PERFORM set_config('jobsup.claim_protocol', '8', true);
    FOREACH v_kind IN ARRAY p_kinds LOOP
        EXIT WHEN v_left <= 0;
        SELECT * INTO lim FROM jobsup.limits l WHERE l.kind = v_kind AND l.limited FOR UPDATE;
        CONTINUE WHEN NOT FOUND;
        v_now := clock_timestamp();
        v_room := v_left;
        IF lim.concurrency IS NOT NULL THEN
            SELECT count(*) INTO v_held FROM jobsup.jobs j
            WHERE j.kind = v_kind AND j.status = 'running' AND j.limited;
            v_room := least(v_room, lim.concurrency - v_held);
        END IF;
        CONTINUE WHEN v_room <= 0;
        IF lim.rate IS NOT NULL AND jobsup.rate_room(lim.tat, v_now, lim.rate, lim.period, lim.burst) <= 0 THEN
            CONTINUE WHEN NOT EXISTS (SELECT 1 FROM jobsup.jobs j WHERE j.kind = v_kind AND j.status = 'queued'
                                      AND j.limited AND j.run_at <= v_now AND j.queue = ANY(p_queues));
            v_due := jobsup.rate_next(lim.tat, v_now, lim.rate, lim.period, lim.burst);
            -- A start due within moments (an interval, 20 ms at most) is waited for here, holding the
            -- kind's row: a claim that came a little early (the supervisor wakes ahead of the time it
            -- was told) starts it on time, where a wake-up and a round trip later would start it late.
            IF v_due - v_now > least(interval '20 milliseconds', make_interval(secs => lim.period / lim.rate)) THEN
                v_wake := least(v_wake, v_due);
                CONTINUE;
            END IF;
            PERFORM pg_sleep(greatest(0, extract(epoch FROM v_due - clock_timestamp())::float8));
            v_now := clock_timestamp();
        END IF;
        IF lim.rate IS NOT NULL THEN
            v_room := least(v_room, jobsup.rate_room(lim.tat, v_now, lim.rate, lim.period, lim.burst));
        END IF;
        v_taken := 0;
        v_level := NULL;
        <<levels>>
        LOOP
            -- The highest priority below the last level with a ready job of our queues.
            SELECT j.priority INTO v_level FROM jobsup.jobs j
            WHERE j.kind = v_kind AND j.status = 'queued' AND j.limited
              AND (v_level IS NULL OR j.priority < v_level) AND j.run_at <= v_now AND j.queue = ANY(p_queues)
            ORDER BY j.priority DESC LIMIT 1;
            EXIT levels WHEN NOT FOUND;
            -- Keys in turn: each visit looks at the next group of the level (in key order, wrapping;
            -- the jobs without a key are the group '', first) and takes its first ready job if the
            -- key's limits allow, or, for the jobs without a key, as many as there is room for. A
            -- whole cycle that took nothing ends the level; visits are bounded, so keys all at their
            -- limit cost a bounded claim.
            v_start := lim.key_cursor;
            v_key := v_start;
            v_cycle_taken := 0;
            v_passes := 0;
            v_visits := 0;
            <<turns>>
            LOOP
                EXIT levels WHEN v_room - v_taken <= 0;
                v_visits := v_visits + 1;
                EXIT turns WHEN v_visits > 4 * p_want + 64;
                -- Two forms, each a bound of the index scan (an OR of them would be a filter, and the
                -- scan would read every job of the groups before the cursor).
                IF v_key IS NULL THEN
                    SELECT coalesce(j.key, '') INTO v_next FROM jobsup.jobs j
                    WHERE j.kind = v_kind AND j.status = 'queued' AND j.limited AND j.priority = v_level
                    ORDER BY coalesce(j.key, '') LIMIT 1;
                ELSE
                    SELECT coalesce(j.key, '') INTO v_next FROM jobsup.jobs j
                    WHERE j.kind = v_kind AND j.status = 'queued' AND j.limited AND j.priority = v_level
                      AND coalesce(j.key, '') > v_key
                    ORDER BY coalesce(j.key, '') LIMIT 1;
                END IF;
                IF NOT FOUND THEN
                    -- Past the last group: wrap. The first pass, begun after the cursor, is a whole
                    -- cycle only when the cursor was at the head.
                    v_passes := v_passes + 1;
                    EXIT turns WHEN v_cycle_taken = 0 AND (v_passes >= 2 OR v_start IS NULL);
                    v_cycle_taken := 0;
                    v_key := NULL;
                    CONTINUE turns;
                END IF;
                v_key := v_next;
                lim.key_cursor := v_key;
                IF v_key = '' THEN
                    -- The ids are picked into an array first: as `j.id IN (SELECT ... LIMIT n FOR UPDATE
                    -- SKIP LOCKED)` a plan may run the subquery more than once, taking more each time.
                    RETURN QUERY
                    UPDATE jobsup.jobs j
                    SET status = 'running', attempts = j.attempts + 1, locked_by = p_locked_by,
                        locked_until = v_now + make_interval(secs => p_lease), started_at = v_now
                    WHERE j.id = ANY(ARRAY(SELECT c.id FROM jobsup.jobs c
                                           WHERE c.kind = v_kind AND c.status = 'queued' AND c.limited
                                             AND c.priority = v_level AND coalesce(c.key, '') = ''
                                             AND c.run_at <= v_now AND c.queue = ANY(p_queues)
                                           ORDER BY c.run_at, c.id LIMIT v_room - v_taken FOR UPDATE SKIP LOCKED))
                    RETURNING j.id, j.kind, j.payload, j.queue, j.attempts, j.max_attempts, j.priority,
                              j.run_at, j.created_at, j.snoozes, nullif(j.errors, '[]'::jsonb), j.started_at,
                              j.key, NULL::timestamptz;
                    GET DIAGNOSTICS v_held = ROW_COUNT;
                    v_taken := v_taken + v_held;
                    v_cycle_taken := v_cycle_taken + v_held;
                    CONTINUE turns;
                END IF;
                IF lim.key_concurrency IS NOT NULL THEN
                    SELECT count(*) INTO v_held FROM jobsup.jobs j
                    WHERE j.kind = v_kind AND j.key = v_key AND j.status = 'running' AND j.limited;
                    CONTINUE turns WHEN v_held >= lim.key_concurrency;
                END IF;
                v_key_tat := NULL;
                IF lim.key_rate IS NOT NULL THEN
                    SELECT k.tat INTO v_key_tat FROM jobsup.limit_keys k WHERE k.kind = v_kind AND k.key = v_key;
                    IF jobsup.rate_room(v_key_tat, v_now, lim.key_rate, lim.key_period, lim.key_burst) <= 0 THEN
                        v_wake := least(v_wake, jobsup.rate_next(v_key_tat, v_now, lim.key_rate, lim.key_period,
                                                                 lim.key_burst));
                        CONTINUE turns;
                    END IF;
                END IF;
                SELECT c.id INTO v_job FROM jobsup.jobs c
                WHERE c.kind = v_kind AND c.status = 'queued' AND c.limited AND c.priority = v_level
                  AND coalesce(c.key, '') = v_key AND c.run_at <= v_now AND c.queue = ANY(p_queues)
                ORDER BY c.run_at, c.id LIMIT 1 FOR UPDATE SKIP LOCKED;
                CONTINUE turns WHEN NOT FOUND;
                RETURN QUERY
                UPDATE jobsup.jobs j
                SET status = 'running', attempts = j.attempts + 1, locked_by = p_locked_by,
                    locked_until = v_now + make_interval(secs => p_lease), started_at = v_now
                WHERE j.id = v_job
                RETURNING j.id, j.kind, j.payload, j.queue, j.attempts, j.max_attempts, j.priority,
                          j.run_at, j.created_at, j.snoozes, nullif(j.errors, '[]'::jsonb), j.started_at,
                          j.key, NULL::timestamptz;
                v_taken := v_taken + 1;
                v_cycle_taken := v_cycle_taken + 1;
                IF lim.key_rate IS NOT NULL THEN
                    INSERT INTO jobsup.limit_keys AS k (kind, key, tat)
                    VALUES (v_kind, v_key, jobsup.rate_after(v_key_tat, v_now, 1, lim.key_rate, lim.key_period))
                    ON CONFLICT ON CONSTRAINT limit_keys_pkey DO UPDATE SET tat = excluded.tat;
                END IF;
            END LOOP turns;
        END LOOP levels;
        IF lim.rate IS NOT NULL AND v_taken > 0 THEN
            lim.tat := jobsup.rate_after(lim.tat, v_now, v_taken, lim.rate, lim.period);
        END IF;
        UPDATE jobsup.limits l SET tat = lim.tat, key_cursor = lim.key_cursor WHERE l.kind = v_kind;
        v_left := v_left - v_taken;
    END LOOP;
    IF v_wake IS NOT NULL THEN
        RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::jsonb, NULL::text, NULL::integer, NULL::integer,
                            NULL::integer, NULL::timestamptz, NULL::timestamptz, NULL::integer, NULL::jsonb,
                            NULL::timestamptz, NULL::text, v_wake;
    END IF;
END
$$;
