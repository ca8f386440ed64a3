-- jobsup schema, version 6: queue latency and run time per kind (jobsup/latency.py).
-- One row per period, kind and metric ('queue_latency' or 'run_time'): a sparse histogram, the indexes
-- of its non-empty buckets in `buckets` and their counts in `counts`, in bucket order. Each figure is
-- added twice, to its 1-minute row and to its 10-minute row: the short windows read a few 1-minute rows
-- and the hour reads seven 10-minute rows, so a read sums 14 rows per kind and metric, not 61. Every
-- supervisor adds to the same rows (latency_merge); old rows are deleted by the pruner (latency_trim).
CREATE TABLE IF NOT EXISTS jobsup.latency (
    period   smallint    NOT NULL CHECK (period IN (1, 10)),  -- minutes the row covers
    minute   timestamptz NOT NULL,  -- the period's first minute
    kind     text        NOT NULL,
    metric   text        NOT NULL CHECK (metric IN ('queue_latency', 'run_time')),
    buckets  integer[]   NOT NULL,
    counts   bigint[]    NOT NULL,
    PRIMARY KEY (period, minute, kind, metric)
) WITH (fillfactor = 50);  -- room on the page: each row is rewritten about once a second, in place (HOT)
