-- jobsup schema, version 11: the claim protocol's trigger costs the jobs of no limited kind nothing but
-- a comparison.
--
-- jobs_claim_protocol (migration 0008) refuses a claim by a release that predates limits, which would
-- take the jobs of a limited kind past their limits. As a BEFORE row trigger it made PostgreSQL lock
-- and read the old row of every update that changes a status (a claim, an outcome write, a retry),
-- before its WHEN could say there was nothing to do: 4 to 5% of the server's CPU per no-op job. As an
-- AFTER trigger it shares the read of the old row with jobs_finished (migration 0009) and locks
-- nothing; its WHEN asks first whether the job is of a limited kind, which is all such a claim would
-- break. A claim by a release before limits that takes a limited job is refused as before (SQLSTATE
-- JS001, the whole statement undone); one that takes none goes through, as it harms no limit.
--
-- Upgrading needs no stop: dropping and creating a trigger change the catalog under a moment's lock.
DROP TRIGGER jobs_claim_protocol ON jobsup.jobs;
CREATE TRIGGER jobs_claim_protocol AFTER UPDATE OF status ON jobsup.jobs FOR EACH ROW
    WHEN (NEW.limited AND NEW.status = 'running' AND OLD.status = 'queued'
          AND coalesce(nullif(current_setting('jobsup.claim_protocol', true), ''), '0')::int < 8)
    EXECUTE FUNCTION jobsup.refuse_old_claim();
