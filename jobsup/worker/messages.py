"""What crosses the pipes between the supervisor and a worker, apart from their framing (wire.py): a
job's wire form, job_fields() on the supervisor's side and job_of() on the worker's."""

from __future__ import annotations

from typing import Any

from jobsup.db.json_text import loads
from jobsup.job import Job


def job_fields(job: Job) -> tuple[Any, ...]:
    """What the supervisor sends a worker of each job: the fields of Job a handler sees, its payload and
    errors as the JSON text the claims connection returns them as (the worker parses them)."""
    return (
        job.id,
        job.kind,
        job.payload,
        job.queue,
        job.attempts,
        job.max_attempts,
        job.priority,
        job.snoozes,
        job.errors,
        job.key,
        job.meta,
    )


# Payloads, errors and meta come as the JSON text of jsonb columns, read by the C scanner alone.
column_json = loads
_make_job = Job._make


def job_of(fields: tuple) -> Job:
    """The Job a handler sees, from what job_fields() sent of it: its JSON texts read, in Job's order
    (built from a tuple, in a third of the time keywords take)."""
    job_id, kind, payload, queue, attempts, max_attempts, priority, snoozes, errors, key, meta = fields
    return _make_job(
        (
            job_id,
            kind,
            None if payload is None else column_json(payload),
            queue,
            attempts,
            max_attempts,
            priority,
            None,  # run_at, created_at: not sent
            None,
            snoozes,
            column_json(errors) if errors else [],
            None,  # started_at
            key,
            # JSON text from the claims link; a dict from a claim on the writes link (dispatcher.py)
            column_json(meta) if type(meta) is str else meta,
        )
    )
