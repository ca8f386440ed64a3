"""Workflows in the figures, against a real PostgreSQL: `jobsup stats` (--json and its tables) and the
queue-wide exporter of `jobsup metrics` count the jobs waiting for their parents, by kind and queue, and
the workflows open, done and failed, once the pruner's sweep has seen them finish."""

from __future__ import annotations

import asyncio
import json

import psycopg
import pytest

from jobsup import client
from jobsup.ops.prune import Retention, aprune
from jobsup.testing import drain

from .apps.flows import RUNS_TABLE, app
from .helpers import cli_env, jobsup
from .metrics_helpers import exported, samples


@pytest.fixture
def runs(conn, dsn, monkeypatch):
    conn.execute(RUNS_TABLE)
    monkeypatch.setenv("JOBSUP_DSN", dsn)
    return conn


def scenario(conn: psycopg.Connection) -> None:
    """A done workflow, a failed one (drained), an open one (2 of its 3 steps waiting in `default`), and
    a plain `report` job waiting in queue `other` for the open one's first step."""
    done = app.workflow("done")
    done.chain({"kind": "step", "payload": {"n": 1}}, {"kind": "step", "payload": {"n": 2}})
    done.enqueue(conn)
    failed = app.workflow("failed")
    bad = failed.add("step", {"n": 3, "fail": True})
    failed.add("step", {"n": 4}, after=bad)  # cancelled when bad dies
    failed.enqueue(conn)
    drain(app, conn, with_scheduled=True)
    still_open = app.workflow("open")
    first, *_ = still_open.chain(*[{"kind": "step", "payload": {"n": n}} for n in range(5, 8)])
    still_open.enqueue(conn)
    assert first.id is not None
    client.enqueue(conn, "report", queue="other", after=[first.id])


def sweep(conn: psycopg.Connection) -> None:
    """A pruning round that keeps every job: its sweep marks the finished workflows."""

    async def go():
        aconn = await psycopg.AsyncConnection.connect(conn.info.dsn, autocommit=True)
        try:
            await aprune(aconn, Retention(keep_done=0, keep_dead=0))
        finally:
            await aconn.close()

    asyncio.run(go())


def test_the_exporter_counts_waiting_jobs_and_the_workflows_by_status(runs, dsn):
    scenario(runs)
    metrics = exported(dsn)
    assert samples(metrics, "jobsup_database_up") == 1
    assert samples(metrics, "jobsup_queue_jobs", queue="default", kind="step", status="waiting") == 2
    assert samples(metrics, "jobsup_queue_jobs", queue="other", kind="report", status="waiting") == 1
    assert samples(metrics, "jobsup_queue_jobs", queue="default", kind="step", status="ready") == 1
    [(waiting,)] = runs.execute("SELECT count(*) FROM jobsup.jobs WHERE status = 'waiting'").fetchall()
    assert samples(metrics, "jobsup_queue_jobs", status="waiting") == waiting == 3
    # Not swept yet: nothing has said the drained ones finished.
    assert [samples(metrics, "jobsup_workflows", status=s) for s in ("open", "done", "failed")] == [3, 0, 0]

    sweep(runs)

    metrics = exported(dsn)
    assert [samples(metrics, "jobsup_workflows", status=s) for s in ("open", "done", "failed")] == [1, 1, 1]


@pytest.mark.slow  # the CLI in a subprocess
def test_stats_counts_waiting_jobs_by_kind_and_shows_the_workflows(runs, dsn):
    scenario(runs)
    sweep(runs)

    result = jobsup("stats", "--dsn", dsn, "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    by_kind = {k["kind"]: k for k in data["kinds"]}
    assert (by_kind["step"]["waiting"], by_kind["step"]["ready"]) == (2, 1)
    assert (by_kind["report"]["waiting"], by_kind["report"]["ready"]) == (1, 0)
    assert data["total"]["waiting"] == 3
    assert data["workflows"] == {"open": 1, "done": 1, "failed": 1}

    # Wide enough for the boxed table (at 80 columns it has no box: tests/test_cli.py).
    text = jobsup("stats", "--dsn", dsn, env=cli_env(COLUMNS="160")).stdout
    header = next(line for line in text.splitlines() if "kind" in line and "ready" in line)
    assert header.split("┃")[2].strip() == "waiting"  # the column after the kind's
    report = next(line for line in text.splitlines() if line.startswith("│ report"))
    assert report.split("│")[2].strip() == "1"
    assert "workflows" in text and "│    1 │    1 │      1 │" in text  # open, done, failed


@pytest.mark.slow  # the CLI in a subprocess
def test_stats_of_a_queue_without_workflows_shows_no_workflow_table(dsn):
    result = jobsup("stats", "--dsn", dsn, "--json")
    assert json.loads(result.stdout)["workflows"] == {"open": 0, "done": 0, "failed": 0}
    text = jobsup("stats", "--dsn", dsn).stdout
    assert "workflows" not in text
    assert "waiting" not in text.split("oldest ready job")[0]  # no column for it in the table by kind
