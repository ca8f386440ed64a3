"""A test app of workflows: handlers that record their start and end, fail on demand (always, or for
their first attempts), fan out at run time and combine what their parents returned."""

from __future__ import annotations

import os
import time

import psycopg

from jobsup import App, Job, Workflow, children, parents

app = App()

RUNS_TABLE = (
    "CREATE TABLE IF NOT EXISTS flow_runs (job_id bigint, kind text, attempt int, event text, pid int,"
    " at timestamptz DEFAULT clock_timestamp())"
)


def _record(job: Job, event: str) -> None:
    """A row of flow_runs (made by the test, see RUNS_TABLE) per start and end of a handler: what the
    tests count order and overlaps from."""
    with psycopg.connect(os.environ["JOBSUP_DSN"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO flow_runs (job_id, kind, attempt, event, pid) VALUES (%s, %s, %s, %s, %s)",
            (job.id, job.kind, job.attempts, event, os.getpid()),
        )


@app.handler("step", max_attempts=2)
def step(job: Job) -> int:
    _record(job, "start")
    time.sleep(job.payload.get("sleep", 0))
    if job.payload.get("fail"):
        _record(job, "end")
        raise RuntimeError(f"step {job.payload.get('n')} failed on purpose")
    _record(job, "end")
    return job.payload.get("n", 0)


@app.handler("scan")
def scan(job: Job) -> int:
    """Finds `files` files, adds a parse job for each, and makes the report (its child) wait for them."""
    dsn = os.environ["JOBSUP_DSN"]
    with psycopg.connect(dsn) as conn:
        [report] = [c.id for c in children(conn, job) if c.kind == "report"]
        more = Workflow.extending(job, app=app)
        for n in range(job.payload["files"]):
            more.add("parse", {"n": n}, before=report)
        more.enqueue(conn)
    return job.payload["files"]


@app.handler("parse")
def parse(job: Job) -> int:
    return job.payload["n"] * 2


@app.handler("report")
def report(job: Job) -> dict:
    dsn = os.environ["JOBSUP_DSN"]
    with psycopg.connect(dsn) as conn:
        found = parents(conn, job)
    values = [p.return_value for p in found if p.kind == "parse"]
    return {"parents": len(found), "parsed": len(values), "sum": sum(values)}


@app.handler("flaky", max_attempts=3)
def flaky(job: Job) -> int:
    """Fails its first `fails` attempts (default 1), then returns its n: a retry that ends done."""
    _record(job, "start")
    failing = job.attempts <= job.payload.get("fails", 1)
    _record(job, "end")
    if failing:
        raise RuntimeError(f"flaky {job.payload.get('n')} fails attempt {job.attempts}")
    return job.payload.get("n", 0)


@app.handler("gather")
def gather(job: Job) -> dict:
    """A fan-in that records its runs as `step` does (and sleeps as long): how many parents it found, how
    many of them ended done, and the sum of the numbers those returned."""
    _record(job, "start")
    time.sleep(job.payload.get("sleep", 0))
    with psycopg.connect(os.environ["JOBSUP_DSN"]) as conn:
        found = parents(conn, job)
    done = [p.return_value for p in found if p.status == "done"]
    _record(job, "end")
    return {"parents": len(found), "done": len(done), "sum": sum(v for v in done if isinstance(v, int))}
