"""The app of the schedule tests: a `tick` interval schedule and a minutely cron, set by environment.

    CRON_APP_INTERVAL   the tick schedule's interval (default 1s)
    CRON_APP_MISSED     its missed-fire policy (default latest)
    CRON_APP_BAD        declare a bad schedule instead: cron, tz, interval or duplicate

Each run is written to the table `cron_calls` (which the test creates) of JOBSUP_RECORD_DSN: the job, its
fire time and when the handler started, by this machine's clock.
"""

from __future__ import annotations

import os
import time

import psycopg

from jobsup import App, Job

app = App()
_conn: psycopg.Connection | None = None


@app.handler("tick")
def tick(job: Job) -> None:
    started = time.time()
    global _conn
    if not os.environ.get("JOBSUP_RECORD_DSN"):
        return
    if _conn is None or _conn.closed:
        _conn = psycopg.connect(os.environ["JOBSUP_RECORD_DSN"], autocommit=True)
    _conn.execute(
        "INSERT INTO cron_calls (job_id, fire_at, started) VALUES (%s, %s, to_timestamp(%s))",
        (job.id, job.payload["fire_at"], started),
    )


app.every("tick", os.environ.get("CRON_APP_INTERVAL", "1s"), missed=os.environ.get("CRON_APP_MISSED", "latest"))
app.every("tick", "* * * * *", name="minutely", missed="all")

_bad = os.environ.get("CRON_APP_BAD")
if _bad == "cron":
    app.every("tick", "61 * * * *", name="broken")
elif _bad == "tz":
    app.every("tick", "@daily", name="broken", tz="Europe/Atlantis")
elif _bad == "interval":
    app.every("tick", "-5s", name="broken")
elif _bad == "duplicate":
    app.every("tick", "@hourly", name="minutely")
