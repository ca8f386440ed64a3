"""`jobsup check` and the `jobsup metrics` exporter against a real PostgreSQL."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from jobsup import client
from jobsup.db import lifecycle
from jobsup.db.lifecycle import Failure

from .helpers import ROOT, cli_env, jobsup, wait_for
from .metrics_helpers import free_port, get, samples, scrape
from .supervisor_helpers import enqueue_kinds, status_counts

APP = "tests.apps.latency:app"


def test_check_exits_1_with_an_old_backlog_and_0_once_it_is_drained(dsn, conn, start):
    assert jobsup("check", "--dsn", dsn).returncode == 0  # nothing queued
    enqueue_kinds(conn, ["quick"] * 20)
    # A backlog older than the threshold: nobody works the queue.
    result = wait_for(
        lambda: (r := jobsup("check", "--dsn", dsn, "--max-oldest-age", "1s")).returncode == 1 and r,
        timeout=30,
        message="check exits 1",
    )
    [line] = result.stdout.strip().splitlines()
    assert line.startswith("queue default: oldest ready job is ") and line.endswith("over --max-oldest-age 1s")
    sup = start(app=APP, procs=2)
    wait_for(lambda: status_counts(conn).get("done") == 20, timeout=60, message="drained")
    result = jobsup("check", "--dsn", dsn, "--max-oldest-age", "1s")
    assert result.returncode == 0 and result.stdout.startswith("ok: oldest ready job -, 0 dead"), result.stdout
    assert sup.stop() == 0


@pytest.mark.slow  # the CLI in a subprocess, many times
def test_check_dead_reaped_queue_and_json(dsn, conn, monkeypatch):
    # No supervisor runs here, so every ready job is also unserved: that alert has tests of its own.
    monkeypatch.setenv("JOBSUP_CHECK_MAX_UNSERVED_AGE", "0")
    long_ago = datetime.now(UTC) - timedelta(minutes=10)
    client.enqueue(conn, "email", run_at=long_ago)
    client.enqueue(conn, "sms", run_at=long_ago, queue="texts")
    client.enqueue_many(conn, [{"kind": "email", "max_attempts": 1, "queue": "mail"}] * 3)
    claimed = lifecycle.claim(conn, ["mail"], 3, "sup-a", 30)
    lifecycle.fail(conn, [Failure(j.id, 1, "smtp down") for j in claimed], "sup-a")  # 3 dead in queue mail
    conn.execute("INSERT INTO jobsup.events (action, supervisor, count, job_ids) VALUES ('reaped', 's', 7, '{1}')")

    result = jobsup("check", "--dsn", dsn, "--max-dead", "2", "--max-reaped-per-min", "5")
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[2:] == [
        "3 dead jobs, over --max-dead 2",
        "7 jobs reaped in the last minute, over --max-reaped-per-min 5",
    ]
    for line, name in zip(lines[:2], ("default", "texts"), strict=True):
        assert line.startswith(f"queue {name}: oldest ready job is 10m") and line.endswith("over --max-oldest-age 5m")

    data = json.loads(jobsup("check", "--dsn", dsn, "--json", "--queue", "mail", "--max-dead", "3").stdout)
    assert data["ok"] is True and data["dead"] == 3 and data["oldest_ready"] == {}
    data = json.loads(jobsup("check", "--dsn", dsn, "--json", "--queue", "texts", "--max-dead", "0").stdout)
    assert data["ok"] is False and [c["check"] for c in data["crossed"]] == ["oldest_age"]
    assert data["crossed"][0]["queue"] == "texts" and data["crossed"][0]["value"] > 590

    assert jobsup("check", "--dsn", dsn, "--max-oldest-age", "0", "--max-reaped-per-min", "7").returncode == 0
    for bad in (["--max-oldest-age", "soon"], ["--max-dead", "-1"], ["--max-reaped-per-min", "x"]):
        result = jobsup("check", "--dsn", dsn, *bad)
        assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, (bad, result.stderr)
    result = jobsup("check", "--dsn", dsn, env=cli_env(JOBSUP_CHECK_MAX_DEAD="many"))
    assert result.returncode == 2


@pytest.mark.slow  # a `jobsup metrics` exporter in a subprocess
def test_the_exporter_serves_the_queue_wide_gauges(dsn, conn):
    client.enqueue_many(conn, [{"kind": "email"}] * 3 + [{"kind": "sms", "queue": "texts"}])
    client.enqueue(conn, "email", delay=3600)
    client.enqueue_many(conn, [{"kind": "sms", "queue": "texts", "max_attempts": 1}] * 2)
    claimed = lifecycle.claim(conn, ["texts"], 3, "sup-a", 30)
    doomed = next(j for j in claimed if j.max_attempts == 1)
    lifecycle.fail(conn, [Failure(doomed.id, 1, "no credit")], "sup-a")  # 1 dead, 2 running in texts
    port = free_port()
    exporter = subprocess.Popen(
        [sys.executable, "-m", "jobsup", "metrics", "--dsn", dsn, "--port", str(port), "--host", "127.0.0.1"],
        cwd=ROOT,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: get(port, "/metrics")[0] == 200, timeout=30, message="the exporter serving")
        metrics = scrape(port)
        assert samples(metrics, "jobsup_database_up") == 1
        for status, want in (("ready", 3), ("scheduled", 1), ("running", 0), ("dead", 0)):
            assert samples(metrics, "jobsup_queue_jobs", queue="default", kind="email", status=status) == want
        assert samples(metrics, "jobsup_queue_jobs", queue="texts", kind="sms", status="running") == 2
        assert samples(metrics, "jobsup_queue_jobs", queue="texts", kind="sms", status="dead") == 1
        table = dict(conn.execute("SELECT status, count(*) FROM jobsup.jobs GROUP BY status").fetchall())
        assert samples(metrics, "jobsup_queue_jobs") == sum(table.values())
        assert 0 <= samples(metrics, "jobsup_oldest_ready_age_seconds", queue="default") < 60
        with socket.socket() as taken:  # a second exporter on the same port
            taken.bind(("127.0.0.1", 0))
            taken.listen(1)
            result = jobsup("metrics", "--dsn", dsn, "--port", str(taken.getsockname()[1]), "--host", "127.0.0.1")
        assert result.returncode == 2 and "the port is in use" in result.stderr
        assert jobsup("metrics", "--dsn", dsn, "--port", "70000").returncode == 2
    finally:
        exporter.terminate()
        assert exporter.wait(20) == 0


@pytest.mark.slow  # the CLI in a subprocess, several times
def test_check_max_throttled_age_names_the_limited_kind_and_how_long(dsn, conn, monkeypatch):
    from jobsup.ops.limits import set_limits

    # No supervisor runs here: leave the oldest-ready and unserved alerts out, they have tests of their own.
    monkeypatch.setenv("JOBSUP_CHECK_MAX_UNSERVED_AGE", "0")
    monkeypatch.setenv("JOBSUP_CHECK_MAX_OLDEST_AGE", "0")
    set_limits(conn, "charge", "alice@box", concurrency=1)
    long_ago = datetime.now(UTC) - timedelta(minutes=10)
    client.enqueue_many(conn, [{"kind": "charge", "key": "a", "run_at": long_ago}] * 3)
    client.enqueue(conn, "email", run_at=long_ago)  # not limited: never throttled
    lifecycle.claim_limited(conn, ["charge"], ["default"], 5, "sup-a", 60)  # 1 held, 2 throttled

    assert jobsup("check", "--dsn", dsn).returncode == 0  # not checked unless asked
    result = jobsup("check", "--dsn", dsn, "--max-throttled-age", "5m")
    assert result.returncode == 1
    [line] = result.stdout.strip().splitlines()
    assert line.startswith("kind charge: 2 jobs throttled by its limits (concurrency 1, 1 held), the oldest for 10m")
    assert line.endswith(", over --max-throttled-age 5m")
    data = json.loads(jobsup("check", "--dsn", dsn, "--json", "--max-throttled-age", "300").stdout)
    [crossed] = data["crossed"]
    assert (crossed["check"], crossed["kind"], crossed["threshold"]) == ("throttled_age", "charge", 300)
    assert crossed["value"] > 590 and data["limits"][0]["throttled"] == 2

    result = jobsup("check", "--dsn", dsn, "--max-throttled-age", "20m")
    assert result.returncode == 0 and ", oldest throttled job 10m" in result.stdout, result.stdout
    assert jobsup("check", "--dsn", dsn, "--max-throttled-age", "0").returncode == 0  # 0: never
    result = jobsup("check", "--dsn", dsn, "--max-throttled-age", "soon")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
