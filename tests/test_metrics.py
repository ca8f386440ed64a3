"""`jobsup start --metrics-port`: /metrics scraped over real HTTP and read with prometheus_client's own
parser, /healthz through a database outage, and the refusals of a bad port."""

from __future__ import annotations

import socket

import psycopg
import pytest

from .helpers import jobsup, wait_for
from .metrics_helpers import free_port, get, samples, scrape
from .supervisor_helpers import enqueue_kinds, status_counts

APP = "tests.apps.latency:app"


def test_metrics_counters_equal_the_final_statuses(conn, start):
    port = free_port()
    sup = start("--metrics-port", str(port), app=APP, procs=2)
    sup.wait_ready()
    wait_for(lambda: get(port, "/healthz")[0] == 200, timeout=20, message="/healthz 200")
    enqueue_kinds(conn, ["quick"] * 40 + ["sleep10"] * 10)
    enqueue_kinds(conn, ["boom"] * 4, max_attempts=1)
    enqueue_kinds(conn, ["boom"] * 3, max_attempts=2)
    during = scrape(port)  # while the jobs run
    assert samples(during, "jobsup_workers") == 2
    wait_for(lambda: status_counts(conn) == {"done": 50, "dead": 7}, timeout=60, message="all finished")

    def settled() -> dict | None:
        m = scrape(port)
        return m if samples(m, "jobsup_jobs_total") == 50 + 7 + 3 else None  # 3 failed attempts retried

    metrics = wait_for(settled, timeout=20, message="every outcome counted")
    table = conn.execute(
        "SELECT kind, status, count(*), sum(jsonb_array_length(errors)) FROM jobsup.jobs GROUP BY kind, status"
    ).fetchall()
    for kind, status, count, errors in table:
        assert samples(metrics, "jobsup_jobs_total", kind=kind, outcome=status) == count, (kind, status)
        if status == "dead":  # every error of a dead job but its last was a failed attempt, retried
            assert samples(metrics, "jobsup_jobs_total", kind=kind, outcome="failed") == errors - count
    assert samples(metrics, "jobsup_jobs_total", outcome="released") == 0
    # The histograms count every finished attempt: 40 + 10 done, 4 + 3 x 2 of boom.
    assert samples(metrics, "jobsup_run_time_seconds_count", kind="quick") == 40
    assert samples(metrics, "jobsup_run_time_seconds_count", kind="boom") == 10
    assert samples(metrics, "jobsup_queue_latency_seconds_count", kind="sleep10") == 10
    ten_ms = samples(metrics, "jobsup_run_time_seconds_bucket", kind="sleep10", le="0.01")
    everything = samples(metrics, "jobsup_run_time_seconds_bucket", kind="sleep10", le="+Inf")
    assert ten_ms == 0 and everything == 10  # a 10 ms sleep takes 10 ms and a little, never less
    assert 0.1 <= samples(metrics, "jobsup_run_time_seconds_sum", kind="sleep10") < 1.0
    assert samples(metrics, "jobsup_claims_total") >= 1
    assert samples(metrics, "jobsup_claimed_jobs_total") == 50 + 4 + 3 + 3
    assert samples(metrics, "jobsup_outcome_writes_total") >= 2
    assert samples(metrics, "jobsup_outcome_write_duration_seconds_count") == samples(
        metrics, "jobsup_outcome_writes_total"
    )
    assert samples(metrics, "jobsup_notify_wakeups_total") >= 1
    assert samples(metrics, "jobsup_workers", state="idle") + samples(metrics, "jobsup_workers", state="busy") == 2
    assert len([k for k in metrics if k[0] == "jobsup_worker_rss_bytes"]) == 2
    assert samples(metrics, "jobsup_jobs_reaped_total") == 0
    assert samples(metrics, "jobsup_db_reconnects_total") == 0
    assert get(port, "/nothing")[0] == 404
    assert sup.stop() == 0


def test_healthz_turns_503_while_the_database_is_gone_and_200_when_it_returns(conn, start, server_dsn):
    # The test's database refuses connections and loses its sessions: to the supervisor, the server
    # is gone (this works under JOBSUP_TEST_DSN too, with no server to restart).
    port = free_port()
    sup = start("--metrics-port", str(port), procs=1)
    sup.wait_ready()
    wait_for(lambda: get(port, "/healthz")[0] == 200, timeout=20, message="/healthz 200")
    name = conn.info.dbname
    conn.close()
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        try:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
            status, body = wait_for(
                lambda: (r := get(port, "/healthz"))[0] == 503 and r, timeout=30, message="/healthz 503"
            )
            assert "the database has not answered" in body
        finally:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    wait_for(lambda: get(port, "/healthz")[0] == 200, timeout=30, message="/healthz 200 again")
    assert samples(scrape(port), "jobsup_db_reconnects_total") >= 1
    assert sup.stop() == 0


@pytest.mark.slow  # `jobsup start` in a subprocess
def test_a_port_in_use_or_a_bad_port_is_refused_before_any_worker_starts(dsn):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = jobsup("start", "--dsn", dsn, "--app", APP, "--metrics-host", "127.0.0.1", "--metrics-port", str(port))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"jobsup: error: --metrics-port {port}: the port is in use on 127.0.0.1"
    ]
    assert "worker" not in result.stdout + result.stderr
    for bad, says in (
        ("70000", "--metrics-port must be a TCP port"),
        ("http", "not a whole number"),
        ("-1", "must be from 0"),
    ):
        result = jobsup("start", "--dsn", dsn, "--app", APP, "--metrics-port", bad)
        assert result.returncode == 2 and says in result.stderr, (bad, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1
    result = jobsup(
        "start", "--dsn", dsn, "--app", APP, "--metrics-port", "9", "--metrics-host", "no.such.host.invalid"
    )
    assert result.returncode == 2 and "--metrics-host" in result.stderr
