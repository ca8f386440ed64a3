-- jobsup schema, version 2: retention of finished jobs, and the churning tables' vacuum settings.

-- Finished jobs by when they finished, one range per status, as River keeps (state, finalized_at): the
-- pruner's "oldest finished rows past their window" is one bounded range scan whatever the table holds,
-- and `status IN ('dead', 'cancelled')` is two. 'cancelled' is named already so the status that adds it
-- needs no new index. The hot path never reads it: claims read jobs_ready_idx, leases jobs_running_idx.
-- A completion adds one entry at the index's right edge (done_at grows with time).
CREATE INDEX jobs_finished_idx ON jobsup.jobs (status, done_at)
    WHERE status IN ('done', 'dead', 'cancelled');

-- Every job is inserted, claimed, completed and (after its window) deleted: three dead tuples per job,
-- none of them HOT (status is in the partial indexes' predicates). With the defaults (vacuum after 20%
-- of the table has died, throttled to 200 cost units per 2 ms) a table holding a 24 h window vacuums
-- rarely and slowly, and its ready and running indexes fill with dead entries that every claim steps
-- over. Vacuum it after 1% (plus 10,000 rows) has died, unthrottled: the table's live part is the
-- backlog and the retention window, so each pass is short, and the README shows the soak's figures.
-- Inserts alone (a backlog being loaded) also trigger it, so the visibility map stays current.
-- fillfactor 90 leaves room on each page for the claim's and the completion's new versions of a row,
-- so they mostly land on the page the row is on: fewer pages dirtied per job.
ALTER TABLE jobsup.jobs SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_vacuum_insert_threshold = 10000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_analyze_scale_factor = 0.02,
    fillfactor = 90
);

-- A handful of rows per kind, updated by every outcome write: each update leaves a dead version.
-- Vacuum them often so the rows stay on a page or two.
ALTER TABLE jobsup.kind_totals SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0,
    fillfactor = 50
);

-- Upserted by every supervisor's heartbeat, once a second each.
ALTER TABLE jobsup.supervisors SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 500,
    autovacuum_vacuum_cost_delay = 0,
    fillfactor = 50
);
