-- Limits (migration 0008): what apps declare and operators set, run by jobsup/ops/limits.py. The claim's
-- side is claim_limited (lifecycle.sql and the function of migration 0008).

-- name: limit_lock
-- A kind's row, locked for a change: claims of the kind wait for it, so none sees half a change.
SELECT kind, concurrency, rate, period, burst, key_concurrency, key_rate, key_period, key_burst, limited,
       declared, declared_by, declared_at, set_by, set_at
FROM jobsup.limits WHERE kind = %(kind)s FOR UPDATE

-- name: limits_of_kinds
SELECT kind FROM jobsup.limits WHERE kind = ANY(%(kinds)s::text[])

-- name: limit_exists
SELECT 1 FROM jobsup.limits WHERE kind = %(kind)s

-- name: limit_kind_known
-- Whether anything knows `kind`: an app declared it, a live supervisor's app handles it, a job of it
-- finished or is in the table. The cheap reads first: the last reads the jobs table when nothing else
-- knows the kind (a typo), which an operator's command pays once.
SELECT EXISTS (SELECT 1 FROM jobsup.limits WHERE kind = %(kind)s AND declared_by IS NOT NULL)
    OR EXISTS (SELECT 1 FROM jobsup.supervisors WHERE %(kind)s = ANY(kinds))
    OR EXISTS (SELECT 1 FROM jobsup.kind_totals WHERE kind = %(kind)s)
    OR EXISTS (SELECT 1 FROM jobsup.jobs WHERE kind = %(kind)s)

-- name: limit_insert
INSERT INTO jobsup.limits (kind) VALUES (%(kind)s) ON CONFLICT (kind) DO NOTHING

-- name: limit_write
-- The values in force, and who set them: set_by NULL for an app's declaration, an operator otherwise.
UPDATE jobsup.limits
SET concurrency = %(concurrency)s, rate = %(rate)s, period = %(period)s, burst = %(burst)s,
    key_concurrency = %(key_concurrency)s, key_rate = %(key_rate)s, key_period = %(key_period)s,
    key_burst = %(key_burst)s, set_by = %(set_by)s, set_at = CASE WHEN %(set_by)s::text IS NULL THEN NULL ELSE now() END,
    -- A rate's state outlives a change of it (a lower rate slows at once), but its next start is never
    -- further off than one interval of the new rate (a mistaken 1/d, corrected, must not hold the kind
    -- for a day); a rate removed forgets it. The same rate declared again (each supervisor declares its
    -- app's as it starts) keeps its schedule: clamped, a start due later than one interval from now (a
    -- claim that came late keeps the schedule) was brought forward, ahead of the rate.
    tat = CASE WHEN %(rate)s::int IS NULL OR tat IS NULL THEN NULL
               WHEN rate = %(rate)s::int AND period = %(period)s::float8 AND burst = %(burst)s::int THEN tat
               ELSE least(tat, now() + make_interval(secs => %(period)s::float8 / %(rate)s::int)) END
WHERE kind = %(kind)s

-- name: limit_delete
-- A kind whose row says nothing that no row would not: no limit in force, none declared by an app.
DELETE FROM jobsup.limits WHERE kind = %(kind)s

-- name: limit_keys_clamp
-- The per-key rates' next starts, never further off than one interval of a new key rate.
UPDATE jobsup.limit_keys SET tat = now() + make_interval(secs => %(key_period)s::float8 / %(key_rate)s::int)
WHERE kind = %(kind)s AND tat > now() + make_interval(secs => %(key_period)s::float8 / %(key_rate)s::int)

-- name: limit_keys_forget
DELETE FROM jobsup.limit_keys WHERE kind = %(kind)s

-- name: limit_declared
UPDATE jobsup.limits SET declared = %(declared)s, declared_by = %(by)s, declared_at = now() WHERE kind = %(kind)s

-- name: limit_mark_jobs
-- Moves a kind's live jobs between the ready index and claim_limited's, when the kind gains its first
-- limit or loses its last. Without an index on kind this reads the table once: a kind's limits change
-- rarely, and the claims of other kinds go on meanwhile (it locks only the rows it changes).
UPDATE jobsup.jobs SET limited = %(limited)s
WHERE kind = %(kind)s AND status IN ('queued', 'running') AND limited <> %(limited)s

-- name: limit_notify
-- Supervisors hear {"limit": kind, "limited": bool, "keyed": bool} and claim the kind through
-- claim_limited or not; keyed: it has per-key limits.
SELECT pg_notify('jobsup', json_build_object('limit', %(kind)s::text, 'limited', %(limited)s::boolean,
                                             'keyed', %(keyed)s::boolean)::text)

-- name: limit_slots_freed
-- A supervisor that wrote the outcomes of limited jobs: others with idle workers may claim them now.
SELECT pg_notify('jobsup', json_build_object('slots', %(kinds)s::text[])::text)

-- name: limit_older_writers
-- Transactions begun before `since` that have written something: one may be inserting jobs of a kind
-- whose limit was just set, which its insert trigger did not see. (Without pg_read_all_stats, a role
-- sees only its own sessions' transactions; jobs are inserted as that role, as a rule.)
SELECT count(*) FROM pg_stat_activity
WHERE xact_start < %(since)s AND backend_xid IS NOT NULL AND pid <> pg_backend_pid()
  AND datname = current_database()

-- name: limits_list
-- Every kind with a row: its values in force, what the app declared, who set them, and its rate's next
-- start. What a limited kind holds and has ready is limited_kinds' (snapshot.sql).
SELECT l.kind, l.concurrency, l.rate, l.period, l.burst, l.key_concurrency, l.key_rate, l.key_period,
       l.key_burst, l.limited, l.declared, l.declared_by, l.declared_at, l.set_by, l.set_at,
       CASE WHEN l.rate IS NOT NULL THEN jobsup.rate_next(l.tat, now(), l.rate, l.period, l.burst) END AS next_start
FROM jobsup.limits l ORDER BY l.kind

-- name: limits_in_force
-- The kinds supervisors claim through claim_limited, and those of them with per-key limits.
SELECT coalesce(array_agg(kind ORDER BY kind), '{}'),
       coalesce(array_agg(kind ORDER BY kind) FILTER (WHERE coalesce(key_concurrency, key_rate) IS NOT NULL), '{}')
FROM jobsup.limits WHERE limited

-- name: limit_keys_prune
-- Per-key rate states whose tat has passed allow a full burst, as no row does: the reaper drops them.
DELETE FROM jobsup.limit_keys WHERE tat < now() - interval '1 second'
