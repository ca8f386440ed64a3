-- jobsup schema, version 3: a job's return value, written with its outcome (the `complete` statement).
-- NULL when the handler returned None, and for every job that is not done.
ALTER TABLE jobsup.jobs ADD COLUMN return_value jsonb;
