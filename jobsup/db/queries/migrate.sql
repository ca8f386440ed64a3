-- Migration bookkeeping (jobsup/db/migrate.py): the migrations of jobsup/db/migrations are applied in
-- order under an advisory lock, each in the transaction that records it in jobsup.migrations.

-- name: migration_isolation
-- The first statement of a migration's transaction. Under REPEATABLE READ (some servers' default) the
-- snapshot would be taken while waiting for the lock, and would miss the migrations applied meanwhile.
SET TRANSACTION ISOLATION LEVEL READ COMMITTED

-- name: migration_lock
SELECT pg_advisory_xact_lock(%(key)s)

-- name: migrations_table
CREATE TABLE IF NOT EXISTS jobsup.migrations (
    version     integer     PRIMARY KEY,
    name        text        NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
)

-- name: migrations_applied
SELECT version FROM jobsup.migrations

-- name: migration_done
INSERT INTO jobsup.migrations (version, name) VALUES (%(version)s, %(name)s)

-- name: schema_exists
SELECT to_regclass('jobsup.migrations') IS NOT NULL

-- name: schema_version
SELECT coalesce(max(version), 0) FROM jobsup.migrations
