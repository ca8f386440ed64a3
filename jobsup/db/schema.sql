-- The jobsup schema as a fresh `jobsup migrate` leaves it: migrations 0001 to 0013, applied in order.
-- Generated from PostgreSQL's catalogs by `make schema` (tests/schema_file.py); never edited by hand.
-- A change to the schema is a new migration in jobsup/db/migrations, then `make schema`: commit both.
-- tests/test_schema_file.py fails while this file and a fresh migrate disagree.
--
-- Each object names the migrations that create or change it. Functions are as PostgreSQL keeps them
-- (their bodies with their comments); the comments on them in the migrations say why they are so.
-- Sorted by name within each section; owners, grants and server settings left out. The claim of limited
-- jobs, in the order a claim calls it: claim_limited_with_meta -> claim_limited -> rate_room, rate_next,
-- rate_after (docs/design/architecture.md, Limits).

-- Types -------------------------------------------------------------------------------------------

-- migration 0012
CREATE TYPE jobsup.claimed_job AS (
    id bigint,
    kind text,
    payload jsonb,
    queue text,
    attempts integer,
    max_attempts integer,
    priority integer,
    run_at timestamp with time zone,
    created_at timestamp with time zone,
    snoozes integer,
    errors jsonb,
    started_at timestamp with time zone,
    key text,
    wake_at timestamp with time zone
);

-- Tables ------------------------------------------------------------------------------------------

-- migration 0013
CREATE TABLE jobsup.audit (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    who text NOT NULL,
    role text NOT NULL,
    action text NOT NULL,
    target text NOT NULL,
    job_ids bigint[] DEFAULT '{}'::bigint[] NOT NULL,
    detail text DEFAULT ''::text NOT NULL,
    CONSTRAINT audit_pkey PRIMARY KEY (id)
);

-- migration 0008
CREATE TABLE jobsup.compat (
    name text NOT NULL,
    oldest integer NOT NULL,
    why text NOT NULL,
    CONSTRAINT compat_pkey PRIMARY KEY (name)
);

-- migration 0009
CREATE TABLE jobsup.dependencies (
    parent_id bigint NOT NULL,
    child_id bigint NOT NULL,
    on_parent_failure text DEFAULT 'cancel'::text NOT NULL,
    external boolean DEFAULT false NOT NULL,
    settled boolean DEFAULT false NOT NULL,
    CONSTRAINT dependencies_on_parent_failure_check CHECK (on_parent_failure = ANY (ARRAY['cancel'::text, 'run'::text])),
    CONSTRAINT dependencies_pkey PRIMARY KEY (parent_id, child_id)
);

-- migration 0001
CREATE TABLE jobsup.events (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    action text NOT NULL,
    supervisor text,
    count integer NOT NULL,
    job_ids bigint[] DEFAULT '{}'::bigint[] NOT NULL,
    detail jsonb DEFAULT '{}'::jsonb NOT NULL,
    CONSTRAINT events_pkey PRIMARY KEY (id)
);

-- migrations 0001, 0002, 0003, 0005, 0008, 0009, 0010
CREATE TABLE jobsup.jobs (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    queue text DEFAULT 'default'::text NOT NULL,
    kind text NOT NULL,
    payload jsonb DEFAULT '{}'::jsonb NOT NULL,
    status text DEFAULT 'queued'::text NOT NULL,
    priority integer DEFAULT 0 NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    max_attempts integer DEFAULT 3 NOT NULL,
    run_at timestamp with time zone DEFAULT now() NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    started_at timestamp with time zone,
    locked_until timestamp with time zone,
    locked_by text,
    done_at timestamp with time zone,
    last_error text,
    errors jsonb DEFAULT '[]'::jsonb NOT NULL,
    unique_key text,
    return_value jsonb,
    snoozes integer DEFAULT 0 NOT NULL,
    cancelled_by text,
    key text,
    limited boolean DEFAULT false NOT NULL,
    workflow_id bigint,
    parents_left integer DEFAULT 0 NOT NULL,
    has_children boolean DEFAULT false NOT NULL,
    meta jsonb,
    CONSTRAINT jobs_max_attempts_check CHECK (max_attempts >= 1),
    CONSTRAINT jobs_pkey PRIMARY KEY (id),
    CONSTRAINT jobs_status_check CHECK (status = ANY (ARRAY['waiting'::text, 'queued'::text, 'running'::text, 'done'::text, 'dead'::text, 'cancelled'::text])) NOT VALID
);

-- migrations 0001, 0002, 0005
CREATE TABLE jobsup.kind_totals (
    kind text NOT NULL,
    slot smallint NOT NULL,
    done bigint DEFAULT 0 NOT NULL,
    failed bigint DEFAULT 0 NOT NULL,
    dead bigint DEFAULT 0 NOT NULL,
    cancelled bigint DEFAULT 0 NOT NULL,
    CONSTRAINT kind_totals_pkey PRIMARY KEY (kind, slot)
);

-- migration 0006
CREATE TABLE jobsup.latency (
    period smallint NOT NULL,
    minute timestamp with time zone NOT NULL,
    kind text NOT NULL,
    metric text NOT NULL,
    buckets integer[] NOT NULL,
    counts bigint[] NOT NULL,
    CONSTRAINT latency_metric_check CHECK (metric = ANY (ARRAY['queue_latency'::text, 'run_time'::text])),
    CONSTRAINT latency_period_check CHECK (period = ANY (ARRAY[1, 10])),
    CONSTRAINT latency_pkey PRIMARY KEY (period, minute, kind, metric)
);

-- migration 0008
CREATE TABLE jobsup.limit_keys (
    kind text NOT NULL,
    key text NOT NULL,
    tat timestamp with time zone NOT NULL,
    CONSTRAINT limit_keys_pkey PRIMARY KEY (kind, key)
);

-- migration 0008
CREATE TABLE jobsup.limits (
    kind text NOT NULL,
    concurrency integer,
    rate integer,
    period double precision,
    burst integer,
    key_concurrency integer,
    key_rate integer,
    key_period double precision,
    key_burst integer,
    limited boolean GENERATED ALWAYS AS ((COALESCE(concurrency, rate, key_concurrency, key_rate) IS NOT NULL)) STORED,
    declared jsonb,
    declared_by text,
    declared_at timestamp with time zone,
    set_by text,
    set_at timestamp with time zone,
    tat timestamp with time zone,
    key_cursor text,
    CONSTRAINT limits_burst_check CHECK (burst >= 1),
    CONSTRAINT limits_check CHECK ((rate IS NULL) = (period IS NULL) AND (rate IS NULL) = (burst IS NULL)),
    CONSTRAINT limits_check1 CHECK ((key_rate IS NULL) = (key_period IS NULL) AND (key_rate IS NULL) = (key_burst IS NULL)),
    CONSTRAINT limits_concurrency_check CHECK (concurrency >= 1),
    CONSTRAINT limits_key_burst_check CHECK (key_burst >= 1),
    CONSTRAINT limits_key_concurrency_check CHECK (key_concurrency >= 1),
    CONSTRAINT limits_key_period_check CHECK (key_period > 0::double precision),
    CONSTRAINT limits_key_rate_check CHECK (key_rate >= 1),
    CONSTRAINT limits_period_check CHECK (period > 0::double precision),
    CONSTRAINT limits_pkey PRIMARY KEY (kind),
    CONSTRAINT limits_rate_check CHECK (rate >= 1)
);

-- made by `jobsup migrate` itself (migrations_table, jobsup/db/queries/migrate.sql)
CREATE TABLE jobsup.migrations (
    version integer NOT NULL,
    name text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT migrations_pkey PRIMARY KEY (version)
);

-- migration 0005
CREATE TABLE jobsup.queue_pauses (
    queue text NOT NULL,
    paused_at timestamp with time zone DEFAULT now() NOT NULL,
    paused_by text,
    CONSTRAINT queue_pauses_pkey PRIMARY KEY (queue)
);

-- migration 0004
CREATE TABLE jobsup.schedules (
    name text NOT NULL,
    kind text NOT NULL,
    expression text NOT NULL,
    tz text DEFAULT 'UTC'::text NOT NULL,
    payload jsonb DEFAULT '{}'::jsonb NOT NULL,
    queue text DEFAULT 'default'::text NOT NULL,
    priority integer DEFAULT 0 NOT NULL,
    max_attempts integer DEFAULT 3 NOT NULL,
    missed text DEFAULT 'latest'::text NOT NULL,
    paused boolean DEFAULT false NOT NULL,
    fired_through timestamp with time zone DEFAULT now() NOT NULL,
    next_fire timestamp with time zone,
    last_fire timestamp with time zone,
    last_job_id bigint,
    declared_at timestamp with time zone DEFAULT now() NOT NULL,
    seen_at timestamp with time zone,
    seen_by text,
    CONSTRAINT schedules_missed_check CHECK (missed = ANY (ARRAY['latest'::text, 'none'::text, 'all'::text])),
    CONSTRAINT schedules_pkey PRIMARY KEY (name)
);

-- migrations 0001, 0002, 0007
CREATE TABLE jobsup.supervisors (
    id text NOT NULL,
    host text NOT NULL,
    pid integer NOT NULL,
    version text NOT NULL,
    queues text[] NOT NULL,
    procs integer NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    heartbeat_at timestamp with time zone DEFAULT now() NOT NULL,
    state text DEFAULT 'running'::text NOT NULL,
    workers jsonb DEFAULT '[]'::jsonb NOT NULL,
    jobs_done bigint DEFAULT 0 NOT NULL,
    kinds text[],
    CONSTRAINT supervisors_pkey PRIMARY KEY (id)
);

-- migration 0009
CREATE TABLE jobsup.workflows (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    name text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    failed boolean,
    CONSTRAINT workflows_pkey PRIMARY KEY (id)
);

-- Indexes -----------------------------------------------------------------------------------------

-- migration 0013
CREATE INDEX audit_at_idx ON jobsup.audit USING btree (at DESC);

-- made by its table's constraint
CREATE UNIQUE INDEX audit_pkey ON jobsup.audit USING btree (id);

-- made by its table's constraint
CREATE UNIQUE INDEX compat_pkey ON jobsup.compat USING btree (name);

-- migration 0009
CREATE INDEX dependencies_child_idx ON jobsup.dependencies USING btree (child_id);

-- made by its table's constraint
CREATE UNIQUE INDEX dependencies_pkey ON jobsup.dependencies USING btree (parent_id, child_id);

-- migration 0001
CREATE INDEX events_at_idx ON jobsup.events USING btree (at DESC);

-- made by its table's constraint
CREATE UNIQUE INDEX events_pkey ON jobsup.events USING btree (id);

-- migration 0001
CREATE INDEX jobs_dead_idx ON jobsup.jobs USING btree (done_at DESC) WHERE (status = 'dead'::text);

-- migration 0002
CREATE INDEX jobs_finished_idx ON jobsup.jobs USING btree (status, done_at) WHERE (status = ANY (ARRAY['done'::text, 'dead'::text, 'cancelled'::text]));

-- migration 0008
CREATE INDEX jobs_limited_held_idx ON jobsup.jobs USING btree (kind, key) WHERE ((status = 'running'::text) AND limited);

-- migration 0008
CREATE INDEX jobs_limited_ready_idx ON jobsup.jobs USING btree (kind, priority DESC, COALESCE(key, ''::text), run_at, id) WHERE ((status = 'queued'::text) AND limited);

-- made by its table's constraint
CREATE UNIQUE INDEX jobs_pkey ON jobsup.jobs USING btree (id);

-- migrations 0001, 0008
CREATE INDEX jobs_ready_idx ON jobsup.jobs USING btree (queue, priority DESC, run_at, id) WHERE ((status = 'queued'::text) AND (NOT limited));

-- migration 0001
CREATE INDEX jobs_running_idx ON jobsup.jobs USING btree (locked_until) WHERE (status = 'running'::text);

-- migration 0001
CREATE UNIQUE INDEX jobs_unique_key_idx ON jobsup.jobs USING btree (unique_key) WHERE ((unique_key IS NOT NULL) AND (status = ANY (ARRAY['queued'::text, 'running'::text])));

-- migration 0009
CREATE INDEX jobs_waiting_idx ON jobsup.jobs USING btree (queue, kind) WHERE (status = 'waiting'::text);

-- migration 0009
CREATE INDEX jobs_workflow_idx ON jobsup.jobs USING btree (workflow_id, status) WHERE (workflow_id IS NOT NULL);

-- made by its table's constraint
CREATE UNIQUE INDEX kind_totals_pkey ON jobsup.kind_totals USING btree (kind, slot);

-- made by its table's constraint
CREATE UNIQUE INDEX latency_pkey ON jobsup.latency USING btree (period, minute, kind, metric);

-- made by its table's constraint
CREATE UNIQUE INDEX limit_keys_pkey ON jobsup.limit_keys USING btree (kind, key);

-- made by its table's constraint
CREATE UNIQUE INDEX limits_pkey ON jobsup.limits USING btree (kind);

-- made by its table's constraint
CREATE UNIQUE INDEX migrations_pkey ON jobsup.migrations USING btree (version);

-- made by its table's constraint
CREATE UNIQUE INDEX queue_pauses_pkey ON jobsup.queue_pauses USING btree (queue);

-- made by its table's constraint
CREATE UNIQUE INDEX schedules_pkey ON jobsup.schedules USING btree (name);

-- made by its table's constraint
CREATE UNIQUE INDEX supervisors_pkey ON jobsup.supervisors USING btree (id);

-- migration 0009
CREATE INDEX workflows_finished_idx ON jobsup.workflows USING btree (failed, finished_at) WHERE (finished_at IS NOT NULL);

-- migration 0009
CREATE INDEX workflows_open_idx ON jobsup.workflows USING btree (id) WHERE (finished_at IS NULL);

-- made by its table's constraint
CREATE UNIQUE INDEX workflows_pkey ON jobsup.workflows USING btree (id);

-- Functions ---------------------------------------------------------------------------------------

-- migration 0008
CREATE OR REPLACE FUNCTION jobsup.claim_limited(p_kinds text[], p_queues text[], p_want integer, p_locked_by text, p_lease double precision)
 RETURNS TABLE(id bigint, kind text, payload jsonb, queue text, attempts integer, max_attempts integer, priority integer, run_at timestamp with time zone, created_at timestamp with time zone, snoozes integer, errors jsonb, started_at timestamp with time zone, key text, wake_at timestamp with time zone)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'auto'
AS $function$
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
$function$;

-- migrations 0010, 0012
CREATE OR REPLACE FUNCTION jobsup.claim_limited_with_meta(p_kinds text[], p_queues text[], p_want integer, p_locked_by text, p_lease double precision)
 RETURNS TABLE(id bigint, kind text, payload jsonb, queue text, attempts integer, max_attempts integer, priority integer, run_at timestamp with time zone, created_at timestamp with time zone, snoozes integer, errors jsonb, started_at timestamp with time zone, key text, meta jsonb, wake_at timestamp with time zone)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'auto'
AS $function$
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
$function$;

-- migration 0009
CREATE OR REPLACE FUNCTION jobsup.dependency_added()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
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
$function$;

-- migration 0009
CREATE OR REPLACE FUNCTION jobsup.job_finished()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM jobsup.settle_children(NEW.id, NEW.status);
    RETURN NULL;
END
$function$;

-- migration 0009
CREATE OR REPLACE FUNCTION jobsup.keep_needed_parent()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF EXISTS (SELECT 1 FROM jobsup.dependencies e JOIN jobsup.jobs c ON c.id = e.child_id
               WHERE e.parent_id = OLD.id AND c.status IN ('waiting', 'queued', 'running')) THEN
        RETURN NULL;
    END IF;
    RETURN OLD;
END
$function$;

-- migrations 0001, 0008
CREATE OR REPLACE FUNCTION jobsup.notify_inserted()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
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
$function$;

-- migration 0008
CREATE OR REPLACE FUNCTION jobsup.rate_after(tat timestamp with time zone, at timestamp with time zone, n integer, rate integer, period double precision)
 RETURNS timestamp with time zone
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT CASE WHEN tat IS NULL OR tat < at - make_interval(secs => period / rate) THEN at ELSE tat END
           + make_interval(secs => n * period / rate)
$function$;

-- migration 0008
CREATE OR REPLACE FUNCTION jobsup.rate_next(tat timestamp with time zone, at timestamp with time zone, rate integer, period double precision, burst integer)
 RETURNS timestamp with time zone
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT greatest(at, coalesce(tat, at) - make_interval(secs => (burst - 1) * period / rate))
$function$;

-- migration 0008
CREATE OR REPLACE FUNCTION jobsup.rate_room(tat timestamp with time zone, at timestamp with time zone, rate integer, period double precision, burst integer)
 RETURNS integer
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT least(burst, greatest(0, floor(extract(epoch FROM at - coalesce(tat, at))::float8 * rate / period
                                          + 1e-6)::integer + burst))
$function$;

-- migrations 0008, 0011
CREATE OR REPLACE FUNCTION jobsup.refuse_old_claim()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    RAISE EXCEPTION 'jobsup: this supervisor''s release may not claim from this schema: %',
        (SELECT why FROM jobsup.compat WHERE name = 'claim')
        USING ERRCODE = 'JS001',
              HINT = 'upgrade the supervisor (pip install -U jobsup) and start it again; '
                     'what it holds is finished or handed back as usual';
END
$function$;

-- migration 0009
CREATE OR REPLACE FUNCTION jobsup.settle_children(parent bigint, parent_status text, only_child bigint DEFAULT NULL::bigint)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
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
$function$;

-- Triggers ----------------------------------------------------------------------------------------

-- migration 0009
CREATE CONSTRAINT TRIGGER dependencies_external AFTER INSERT ON jobsup.dependencies DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (new.external) EXECUTE FUNCTION jobsup.dependency_added();

-- migrations 0008, 0011
CREATE TRIGGER jobs_claim_protocol AFTER UPDATE OF status ON jobsup.jobs FOR EACH ROW WHEN (new.limited AND new.status = 'running'::text AND old.status = 'queued'::text AND COALESCE(NULLIF(current_setting('jobsup.claim_protocol'::text, true), ''::text), '0'::text)::integer < 8) EXECUTE FUNCTION jobsup.refuse_old_claim();

-- migration 0009
CREATE TRIGGER jobs_finished AFTER UPDATE OF status ON jobsup.jobs FOR EACH ROW WHEN (new.has_children AND (new.status = ANY (ARRAY['done'::text, 'dead'::text, 'cancelled'::text])) AND old.status <> new.status) EXECUTE FUNCTION jobsup.job_finished();

-- migration 0009
CREATE TRIGGER jobs_keep_needed_parent BEFORE DELETE ON jobsup.jobs FOR EACH ROW WHEN (old.has_children) EXECUTE FUNCTION jobsup.keep_needed_parent();

-- migration 0001
CREATE TRIGGER jobs_notify_inserted AFTER INSERT ON jobsup.jobs REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION jobsup.notify_inserted();

-- Rows --------------------------------------------------------------------------------------------

-- migration 0008
INSERT INTO jobsup.compat (name, oldest, why) VALUES ('claim', '8', 'limits (schema version 8): its claim would not leave the jobs of limited kinds to claim_limited; run a jobsup whose schema is version 8 or later');
