-- jobsup schema, version 7: the kinds each supervisor can run, written by its heartbeat.
-- A supervisor claims only the kinds its app handles and leaves the others queued, attempts untouched,
-- for a supervisor that can run them; doctor, check and the console name ready jobs that no live
-- supervisor can run. NULL is "any kind": an app that finds its handlers by name (Django's tasks), and
-- every supervisor of an earlier release, which claims any kind of its queues.
ALTER TABLE jobsup.supervisors ADD COLUMN IF NOT EXISTS kinds text[];
