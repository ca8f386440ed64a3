-- `jobsup bench` (jobsup/cli/bench.py, jobsup/ops/bench.py and its app jobsup/ops/bench_app.py) and
-- benchmarks/bench_supervisor.py and benchmarks/bench_many.py. The pickup table lives in the jobsup
-- schema, so dropping the schema (or the scratch database) takes it too.

-- The scratch database or schema (jobsup/cli/bench.py).

-- name: bench_database_exists
SELECT count(*) > 0 FROM pg_database WHERE datname = %(name)s

-- name: bench_create_database
-- {name} is filled by psycopg.sql.Identifier, never by text: the scratch database of --database.
CREATE DATABASE {name}

-- name: bench_drop_database
DROP DATABASE IF EXISTS {name} WITH (FORCE)

-- name: bench_schema_exists
SELECT count(*) > 0 FROM pg_namespace WHERE nspname = 'jobsup'

-- name: bench_jobs_held
-- Whether a jobsup schema holds jobs (any status): `jobsup bench` refuses to run among them.
SELECT count(*) FROM jobsup.jobs

-- name: bench_drop_schema
DROP SCHEMA jobsup CASCADE

-- Pickup times: when each job's handler started (jobsup/ops/bench_app.py), read by jobsup/ops/bench.py.

-- name: bench_pickup_table
CREATE TABLE jobsup.bench_pickup (job_id bigint PRIMARY KEY, started float8 NOT NULL)

-- name: bench_pickup_started
INSERT INTO jobsup.bench_pickup (job_id, started) VALUES (%(job_id)s, %(started)s)

-- name: bench_pickup_clear
TRUNCATE jobsup.bench_pickup

-- name: bench_pickup_count
SELECT count(*) FROM jobsup.bench_pickup

-- name: bench_pickup_times
SELECT job_id, started FROM jobsup.bench_pickup

-- Throughput (jobsup/ops/bench.py).

-- name: bench_done_of_kind
SELECT coalesce(sum(done), 0) FROM jobsup.kind_totals WHERE kind = %(kind)s

-- name: bench_workers
SELECT workers FROM jobsup.supervisors

-- name: bench_clear
TRUNCATE jobsup.jobs, jobsup.kind_totals, jobsup.events
