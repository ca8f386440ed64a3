"""Short and slow jobs mixed, for the tests of the hand-out: each run writes its job and start (the
database's clock) to the table `handout_runs` of JOBSUP_RECORD_DSN, through a connection of its worker."""

from __future__ import annotations

import os
import time

import psycopg

from jobsup import App, Job

app = App()
_conn: psycopg.Connection | None = None

SCHEMA = """
CREATE TABLE IF NOT EXISTS handout_runs (
    job_id  bigint      NOT NULL,
    kind    text        NOT NULL,
    pid     integer     NOT NULL,
    started timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


def _record(job: Job) -> None:
    global _conn
    if _conn is None or _conn.closed:
        _conn = psycopg.connect(os.environ["JOBSUP_RECORD_DSN"], autocommit=True)
    _conn.execute("INSERT INTO handout_runs (job_id, kind, pid) VALUES (%s, %s, %s)", (job.id, job.kind, os.getpid()))


@app.handler("email")
def email(job: Job) -> None:
    if job.payload.get("record"):  # the others do nothing: jobs short enough to hand out several at once
        _record(job)
    time.sleep(float(job.payload.get("seconds", 0)))  # an email that turns out slow


@app.handler("fetch")
def fetch(job: Job) -> None:
    _record(job)
    time.sleep(float(job.payload.get("seconds", 3)))


# The same kinds in an app that also has a shared one: their jobs go through the hand-out of an app of
# both classes (supervisor/handout.py, _hand_out_shared).
mixed_app = App()
mixed_app.handler("email")(email)
mixed_app.handler("fetch")(fetch)


@mixed_app.handler("ping", shared=True)
async def ping(job: Job) -> None:
    pass
