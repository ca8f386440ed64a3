-- jobsup schema, version 6: queue latency and run time per kind per minute (jobsup/latency.py).
-- One row per minute, kind and metric ('queue_latency' or 'run_time'): a sparse histogram, the indexes
-- of its non-empty buckets in `buckets` and their counts in `counts`, in bucket order. Every supervisor
-- adds its figures to the same rows (latency_merge), so a row holds them all; rows older than
-- latency.KEEP_MINUTES are deleted by the pruner duty (latency_trim).
CREATE TABLE IF NOT EXISTS jobsup.latency (
    minute   timestamptz NOT NULL,
    kind     text        NOT NULL,
    metric   text        NOT NULL CHECK (metric IN ('queue_latency', 'run_time')),
    buckets  integer[]   NOT NULL,
    counts   bigint[]    NOT NULL,
    PRIMARY KEY (minute, kind, metric)
) WITH (fillfactor = 50);  -- room on the page: each row is rewritten about once a second, in place (HOT)
