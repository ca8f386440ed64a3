-- Statements of `jobsup doctor` (jobsup/ops/doctor.py) and of the console's health line (health, run by
-- jobsup/ops/health.py). They read the server's views and statistics, the supervisors' rows and the
-- partial index of running jobs; none reads the finished jobs. Sessions count only in this database (and
-- walsenders, which belong to none): vacuum of a table here ignores the snapshots of other databases'
-- sessions. Without pg_read_all_stats (or pg_monitor) the server hides the state, times and query of
-- other roles' sessions, but not their backend_xmin, so a holder is still found, its age then only in
-- transactions. The doctor reads the supervisors' rows with `supervisors` (supervisors.sql).

-- name: doctor_limits
-- For the doctor's own transaction: a jobsup table locked by a long ALTER or VACUUM FULL makes the
-- size lookup wait; the doctor would rather say so than hang a cron job or a probe.
SELECT set_config('lock_timeout', %(lock_timeout)s, true), set_config('statement_timeout', %(statement_timeout)s, true)

-- name: doctor_server
SELECT current_setting('server_version') AS server_version,
       current_setting('server_version_num')::int AS server_version_num,
       current_database() AS database, current_user AS role,
       pg_has_role('pg_read_all_stats', 'USAGE') AS sees_all_sessions,
       current_setting('autovacuum')::bool AS autovacuum,
       current_setting('autovacuum_vacuum_threshold')::float8 AS vacuum_threshold,
       current_setting('autovacuum_vacuum_scale_factor')::float8 AS vacuum_scale_factor,
       current_setting('max_connections')::int AS max_connections,
       -- reserved_connections is PostgreSQL 16's; NULL before
       current_setting('superuser_reserved_connections')::int
           + coalesce(current_setting('reserved_connections', true)::int, 0) AS reserved_connections,
       pg_notification_queue_usage()::float8 AS notify_usage

-- name: doctor_sessions
-- Sessions that hold back vacuum with a snapshot (backend_xmin) or a transaction id (backend_xid), or
-- that sit idle in a transaction; the oldest horizon first. xmin_xids is how many transactions old the
-- horizon is; xact_age and state_age (seconds) are NULL where the server hides them.
SELECT pid, usename AS role, application_name, state, backend_type, query_start,
       backend_xmin IS NOT NULL OR backend_xid IS NOT NULL AS holds_xmin,
       greatest(age(backend_xmin), age(backend_xid)) AS xmin_xids,
       extract(epoch FROM now() - xact_start)::float8 AS xact_age,
       extract(epoch FROM now() - state_change)::float8 AS state_age,
       left(regexp_replace(query, '\s+', ' ', 'g'), 120) AS query
FROM pg_stat_activity
WHERE pid <> pg_backend_pid()
  AND (datid IS NULL OR datname = current_database())
  AND backend_type IS DISTINCT FROM 'autovacuum worker'  -- its snapshot does not hold vacuum back
  AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL OR state LIKE 'idle in transaction%%')
ORDER BY greatest(age(backend_xmin), age(backend_xid)) DESC NULLS LAST, xact_start
LIMIT %(limit)s

-- name: doctor_prepared
SELECT gid, owner, age(transaction) AS xmin_xids, extract(epoch FROM now() - prepared)::float8 AS age
FROM pg_prepared_xacts WHERE database = current_database()
ORDER BY prepared

-- name: doctor_slots
-- A slot's xmin (a standby's hot_standby_feedback) holds back vacuum of every table; a logical slot's
-- catalog_xmin only the catalogs', but an inactive slot of either kind also keeps all WAL since it.
SELECT slot_name, slot_type, database, active, age(xmin) AS xmin_xids, age(catalog_xmin) AS catalog_xmin_xids
FROM pg_replication_slots
WHERE xmin IS NOT NULL OR catalog_xmin IS NOT NULL
ORDER BY greatest(age(xmin), age(catalog_xmin)) DESC

-- name: doctor_connections
-- Client connections by application name. Without pg_read_all_stats other roles' backend_type is
-- hidden; a process connected to a database is then taken for a client.
SELECT coalesce(application_name, '') AS application_name, count(*)::int AS count
FROM pg_stat_activity
WHERE coalesce(backend_type = 'client backend', datid IS NOT NULL)
GROUP BY 1

-- name: doctor_tables
-- Every table of the schema jobsup, a partition counted under its partitioned table: tuples from the
-- statistics, sizes from the files; nothing reads the tables themselves. vacuum_at is the dead-tuple
-- count at which autovacuum starts, with the table's own settings where it has them.
WITH t AS (
    SELECT coalesce(pg_partition_root(s.relid), s.relid) AS root, s.*, c.reloptions, c.reltuples
    FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
    WHERE s.schemaname = 'jobsup'
), o AS (
    SELECT t.relid,
           coalesce((SELECT option_value FROM pg_options_to_table(t.reloptions)
                     WHERE option_name = 'autovacuum_enabled'), 'on')::bool AS autovacuum_enabled,
           coalesce((SELECT option_value FROM pg_options_to_table(t.reloptions)
                     WHERE option_name = 'autovacuum_vacuum_threshold')::float8,
                    current_setting('autovacuum_vacuum_threshold')::float8)
           + coalesce((SELECT option_value FROM pg_options_to_table(t.reloptions)
                       WHERE option_name = 'autovacuum_vacuum_scale_factor')::float8,
                      current_setting('autovacuum_vacuum_scale_factor')::float8)
             * greatest(t.reltuples, 0) AS vacuum_at
    FROM t
)
SELECT n.nspname || '.' || c.relname AS name, count(*)::int AS tables,
       sum(t.n_live_tup)::bigint AS live_tuples, sum(t.n_dead_tup)::bigint AS dead_tuples,
       sum(o.vacuum_at)::bigint AS vacuum_at,
       bool_and(o.autovacuum_enabled) AS autovacuum_enabled,
       extract(epoch FROM now() - max(greatest(t.last_vacuum, t.last_autovacuum)))::float8 AS vacuum_age,
       sum(t.autovacuum_count + t.vacuum_count)::bigint AS vacuums,
       sum(pg_table_size(t.relid))::bigint AS table_bytes, sum(pg_indexes_size(t.relid))::bigint AS index_bytes
FROM t JOIN o ON o.relid = t.relid
JOIN pg_class c ON c.oid = t.root JOIN pg_namespace n ON n.oid = c.relnamespace
GROUP BY n.nspname, c.relname
ORDER BY n.nspname, c.relname

-- name: doctor_orphaned_jobs
-- Running jobs whose supervisor has no row, or a row whose heartbeat stopped: only a live supervisor's
-- reaper returns them, once their lease (lease_left seconds, negative when expired) runs out.
SELECT j.locked_by, count(*)::int AS jobs, min(j.id) AS first_id,
       extract(epoch FROM min(j.locked_until) - now())::float8 AS lease_left
FROM jobsup.jobs j
LEFT JOIN jobsup.supervisors s
       ON s.id = j.locked_by
      AND (%(stale_after)s::float8 = 0  -- 0: no row counts as stale
           OR s.heartbeat_at > now() - make_interval(secs => %(stale_after)s::float8))
WHERE j.status = 'running' AND s.id IS NULL
GROUP BY j.locked_by
ORDER BY count(*) DESC

-- name: health
-- The console's health line, every refresh: the oldest snapshot or transaction id holding back vacuum
-- here (a session or a prepared transaction), the oldest inactive replication slot holding xmin (it has
-- no age in time), and the tuples of jobsup.jobs from the statistics. It reads the server's state
-- through functions only, never a table.
WITH holder AS (
    SELECT 'session' AS holder, pid::text AS name, state,
           extract(epoch FROM now() - xact_start)::float8 AS age,
           greatest(age(backend_xmin), age(backend_xid)) AS xmin_xids
    FROM pg_stat_activity
    WHERE pid <> pg_backend_pid() AND (datid IS NULL OR datname = current_database())
      AND backend_type IS DISTINCT FROM 'autovacuum worker'
      AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
    UNION ALL
    SELECT 'prepared', gid, NULL, extract(epoch FROM now() - prepared)::float8, age(transaction)
    FROM pg_prepared_xacts WHERE database = current_database()
)
SELECT h.holder, h.name, h.state, h.age, h.xmin_xids, s.slot_name AS slot, s.xmin_xids AS slot_xmin_xids,
       pg_stat_get_live_tuples(to_regclass('jobsup.jobs'))::bigint AS live_tuples,
       pg_stat_get_dead_tuples(to_regclass('jobsup.jobs'))::bigint AS dead_tuples
FROM (SELECT 1) one
LEFT JOIN LATERAL (SELECT * FROM holder ORDER BY age DESC NULLS LAST, xmin_xids DESC LIMIT 1) h ON true
LEFT JOIN LATERAL (SELECT slot_name, age(xmin) AS xmin_xids FROM pg_replication_slots
                   WHERE xmin IS NOT NULL AND NOT active ORDER BY age(xmin) DESC LIMIT 1) s ON true
