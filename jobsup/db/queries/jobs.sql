-- Enqueueing: the statements of jobsup/client.py (enqueue and enqueue_many, each in a sync and an
-- asyncio form), which `jobsup enqueue` and the supervisor's scheduler run too. An enqueue sends no
-- NOTIFY of its own: the insert trigger of jobsup.jobs does, once per statement, at commit.

-- name: enqueue
-- Also the Django backend's (jobsup/django.py), which reads created_at as the task's enqueued_at.
INSERT INTO jobsup.jobs (queue, kind, payload, priority, run_at, max_attempts, unique_key, key, meta)
VALUES (%(queue)s, %(kind)s, %(payload)s::jsonb, %(priority)s,
        coalesce(%(run_at)s::timestamptz, now()) + make_interval(secs => %(delay)s::float8),
        %(max_attempts)s, %(unique_key)s, %(key)s, %(meta)s::jsonb)
ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND status IN ('queued', 'running') DO NOTHING
RETURNING id, created_at

-- name: enqueue_many
-- One statement for any number of jobs. Rows are inserted in input order, so ids ascend with it;
-- a duplicate unique_key (of a live job, or earlier in the same batch) is skipped. The arrays go as
-- binary parameters: as text, psycopg would escape every element, each '"' of each payload included,
-- which took longer than the insert itself.
INSERT INTO jobsup.jobs (queue, kind, payload, priority, run_at, max_attempts, unique_key, key, meta)
SELECT q, k, p::jsonb, pr, coalesce(r, now()) + make_interval(secs => d), m, u, ky, mt::jsonb
FROM unnest(%(queues)b::text[], %(kinds)b::text[], %(payloads)b::text[], %(priorities)b::int[],
            %(run_ats)b::timestamptz[], %(delays)b::float8[], %(max_attempts)b::int[],
            %(unique_keys)b::text[], %(keys)b::text[], %(metas)b::text[])
     WITH ORDINALITY AS t(q, k, p, pr, r, d, m, u, ky, mt, n)
ORDER BY n
ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND status IN ('queued', 'running') DO NOTHING
RETURNING id, unique_key

-- name: enqueue_many_unkeyed
-- enqueue_many for a batch where no job has a unique_key, so nothing can conflict. Without ON CONFLICT
-- each row is a plain insert instead of a speculative one (a lock taken and released and one more WAL
-- record per row), which makes a large batch about a tenth faster.
INSERT INTO jobsup.jobs (queue, kind, payload, priority, run_at, max_attempts, key, meta)
SELECT q, k, p::jsonb, pr, coalesce(r, now()) + make_interval(secs => d), m, ky, mt::jsonb
FROM unnest(%(queues)b::text[], %(kinds)b::text[], %(payloads)b::text[], %(priorities)b::int[],
            %(run_ats)b::timestamptz[], %(delays)b::float8[], %(max_attempts)b::int[], %(keys)b::text[],
            %(metas)b::text[])
     WITH ORDINALITY AS t(q, k, p, pr, r, d, m, ky, mt, n)
ORDER BY n
RETURNING id
