-- The audit of the web console's actions (migration 0013): written in the action's transaction by
-- jobsup/ops/audit.py, read by the audit page, pruned with the events (retention.sql, prune_audit).

-- name: audit_record
INSERT INTO jobsup.audit (who, role, action, target, job_ids, detail)
VALUES (%(who)s, %(role)s, %(action)s, %(target)s, %(job_ids)s, %(detail)s)
RETURNING id

-- name: audit_recent
-- The newest rows first, through audit_at_idx: a page of them whatever the table holds.
SELECT id, at, who, role, action, target, job_ids, detail
FROM jobsup.audit ORDER BY at DESC, id DESC LIMIT %(limit)s
