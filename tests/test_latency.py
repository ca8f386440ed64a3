"""Queue latency and run time per kind (jobsup/ops/latency.py), written by real supervisors."""

from __future__ import annotations

from itertools import pairwise

import psycopg
import pytest

from jobsup.db.sql import STATEMENTS as SQL
from jobsup.ops import latency

from .helpers import wait_for
from .supervisor_helpers import enqueue_kinds, status_counts

APP = "tests.apps.latency:app"


def counted(conn: psycopg.Connection, kind: str, metric: str) -> int:
    """Jobs of `kind` in the histograms of the last hour."""
    for row in latency.read(conn):
        if row.kind == kind:
            return row.get(metric, 60).count
    return 0


def figures(conn: psycopg.Connection, kind: str, metric: str, window: int = 60) -> latency.Figures:
    [row] = [r for r in latency.read(conn) if r.kind == kind]
    return row.get(metric, window)


def exact(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def test_known_sleeps_give_run_times_within_a_few_ms(conn, start):
    sup = start(app=APP, procs=2)
    sup.wait_ready()
    enqueue_kinds(conn, ["sleep10"] * 60 + ["sleep100"] * 16)
    wait_for(lambda: status_counts(conn).get("done") == 76, timeout=60, message="76 done")
    # The figures ride on the outcome writes at most once a second: the last ones land within it.
    wait_for(
        lambda: counted(conn, "sleep10", "run_time") == 60 and counted(conn, "sleep100", "run_time") == 16,
        timeout=10,
        message="every job in the histograms",
    )
    ten, hundred = figures(conn, "sleep10", "run_time"), figures(conn, "sleep100", "run_time")
    # The supervisor's clock sees the sleep plus a pipe message each way: a fraction of a ms, more on
    # a loaded machine, never less than the sleep.
    assert 0.010 <= ten.p50 < 0.014, ten
    assert 0.100 <= hundred.p50 < 0.105, hundred
    assert ten.p50 <= ten.p95 <= ten.p99 and hundred.p50 <= hundred.p95 <= hundred.p99
    assert [ten.count, hundred.count] == [60, 16]
    assert figures(conn, "sleep10", "run_time", window=1).count == 60  # the same minute in every window
    assert sup.stop() == 0


def test_a_backlog_gives_a_queue_latency_that_grows_with_it(conn, start):
    enqueue_kinds(conn, ["sleep100"] * 25)  # one worker: the n-th job waits about n x 100 ms
    sup = start("--prefetch", "0", app=APP, procs=1)
    wait_for(lambda: status_counts(conn).get("done") == 25, timeout=60, message="25 done")
    wait_for(lambda: counted(conn, "sleep100", "queue_latency") == 25, timeout=10, message="25 latencies")
    truth = [
        row[0]
        for row in conn.execute("SELECT extract(epoch FROM started_at - run_at)::float8 FROM jobsup.jobs ORDER BY id")
    ]
    # It grows as the backlog is worked: each job waited longer than the one before it...
    assert all(later > earlier for earlier, later in pairwise(truth))
    assert truth[-1] > 2.0  # ...the last about 24 runs of 100 ms plus the start of the worker
    got = figures(conn, "sleep100", "queue_latency")
    for q, value in ((0.5, got.p50), (0.95, got.p95)):
        # Within its bucket (2.5% wide at most) of the value at that rank, read from the table itself.
        assert abs(value - exact(truth, q)) <= 0.05 * exact(truth, q) + 0.1, (q, value, exact(truth, q))
    assert got.p50 < got.p95
    assert sup.stop() == 0


def test_two_supervisors_histograms_merge(conn, start):
    sups = [start(app=APP, procs=1), start(app=APP, procs=1)]
    for sup in sups:
        sup.wait_ready()
    enqueue_kinds(conn, ["sleep10"] * 80)
    wait_for(lambda: status_counts(conn).get("done") == 80, timeout=60, message="80 done")
    by = dict(conn.execute("SELECT locked_by, count(*) FROM jobsup.jobs GROUP BY locked_by").fetchall())
    assert len(by) == 2, by  # both supervisors did some of them
    wait_for(lambda: counted(conn, "sleep10", "run_time") == 80, timeout=10, message="80 run times")
    rows = conn.execute(
        "SELECT count(*) FROM jobsup.latency WHERE kind = 'sleep10' AND metric = 'run_time' GROUP BY period, minute"
    ).fetchall()
    assert rows and all(n == 1 for (n,) in rows)  # one row per period holds both supervisors' figures
    assert 0.010 <= figures(conn, "sleep10", "run_time").p50 < 0.014
    for sup in sups:
        assert sup.stop() == 0


def test_merge_adds_bucket_by_bucket_and_trim_keeps_the_last_periods(conn):
    def merge(pairs: dict[int, int]) -> None:
        conn.execute(
            SQL["latency_merge"],
            {
                "kinds": ["k"] * len(pairs),
                "metrics": ["run_time"] * len(pairs),
                "buckets": list(pairs),
                "counts": list(pairs.values()),
            },
        )

    merge({210: 3, 250: 1})
    merge({250: 2, 200: 5})
    rows = conn.execute("SELECT period, buckets, counts FROM jobsup.latency ORDER BY period").fetchall()
    assert rows == [(1, [200, 210, 250], [5, 3, 3]), (10, [200, 210, 250], [5, 3, 3])]
    conn.execute("UPDATE jobsup.latency SET minute = minute - interval '30 minutes'")
    merge({210: 1})
    conn.execute(SQL["latency_trim"], {"keep_periods": latency.KEEP_PERIODS})
    # The 1-minute row of 30 minutes ago is gone; its 10-minute row stays for two hours.
    assert conn.execute("SELECT period, buckets, counts FROM jobsup.latency ORDER BY period, minute").fetchall() == [
        (1, [210], [1]),
        (10, [200, 210, 250], [5, 3, 3]),
        (10, [210], [1]),
    ]
    conn.execute("UPDATE jobsup.latency SET minute = minute - interval '3 hours'")
    conn.execute(SQL["latency_trim"], {"keep_periods": latency.KEEP_PERIODS})
    assert conn.execute("SELECT count(*) FROM jobsup.latency").fetchone()[0] == 0


def test_rising_latency_is_marked(conn):
    """A kind whose last minute waited far longer than the five before it is marked rising."""

    def put(minutes_ago: int, seconds: float, count: int) -> None:
        """`count` waits of `seconds` in the 1-minute row of `minutes_ago`."""
        conn.execute(
            "INSERT INTO jobsup.latency (period, minute, kind, metric, buckets, counts) "
            "VALUES (1, date_trunc('minute', now()) - make_interval(mins => %s), 'k', 'queue_latency', "
            "ARRAY[%s], ARRAY[%s::bigint])",
            (minutes_ago, latency.bucket(seconds), count),
        )

    def hour(waits: dict[float, int]) -> None:
        """The same waits in the current 10-minute row, which the hour's window reads."""
        conn.execute(
            "INSERT INTO jobsup.latency (period, minute, kind, metric, buckets, counts) "
            "VALUES (10, date_bin('10 minutes', now(), TIMESTAMPTZ '2000-01-01 00:00:00+00'), 'k', "
            "'queue_latency', %s, %s)",
            ([latency.bucket(w) for w in waits], list(waits.values())),
        )

    put(4, 0.005, 100)
    put(3, 0.005, 100)
    put(0, 2.0, 50)
    hour({0.005: 200, 2.0: 50})
    [row] = latency.read(conn)
    assert row.rising
    assert row.get("queue_latency", 1).count == 50 and row.get("queue_latency", 5).count == 250
    assert row.get("queue_latency", 60).count == 250
    assert abs(row.get("queue_latency", 60).p50 - 0.005) < 0.0003
    conn.execute("DELETE FROM jobsup.latency")
    put(3, 2.0, 100)
    put(0, 2.0, 50)
    assert not latency.read(conn)[0].rising
    conn.execute("DELETE FROM jobsup.latency")
    put(7, 0.005, 100)  # before the five minutes compared with: nothing to rise from
    put(0, 2.0, 50)
    [row] = latency.read(conn)
    assert not row.rising and row.get("queue_latency", 5).count == 50


@pytest.mark.slow  # the CLI in a subprocess, many times
def test_stats_shows_latency_expiring_leases_and_attempts(dsn, conn):
    import json

    from jobsup import client
    from jobsup.db import lifecycle
    from jobsup.db.lifecycle import Failure

    from .helpers import jobsup

    conn.execute(
        SQL["latency_merge"],
        {
            "kinds": ["email", "email"],
            "metrics": ["queue_latency", "run_time"],
            "buckets": [latency.bucket(0.02), latency.bucket(0.5)],
            "counts": [4, 4],
        },
    )
    client.enqueue_many(conn, [{"kind": "email"}] * 3 + [{"kind": "sms", "max_attempts": 1}])
    claimed = lifecycle.claim(conn, ["default"], 4, "sup-a", 30)
    sms = [j for j in claimed if j.kind == "sms"]
    lifecycle.fail(conn, [Failure(sms[0].id, 1, "no credit")], "sup-a")  # dead after its one attempt
    lifecycle.extend(conn, [(claimed[0].id, 1)], "sup-a", 5)  # the soonest to expire

    result = jobsup("stats", "--json", "--dsn", dsn)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    [email] = data["latency"]
    assert email["kind"] == "email" and email["rising"] is False
    assert email["queue_latency"]["1m"]["count"] == 4 and email["run_time"]["60m"]["count"] == 4
    assert abs(email["queue_latency"]["5m"]["p50"] - 0.02) < 0.001
    assert abs(email["run_time"]["5m"]["p95"] - 0.5) < 0.0125
    assert [row["id"] for row in data["expiring_leases"]][0] == claimed[0].id
    assert len(data["expiring_leases"]) == 3 and 0 < data["expiring_leases"][0]["remaining"] <= 5
    assert {(r["status"], r["attempts"], r["count"]) for r in data["attempts"]} == {("running", 1, 3), ("dead", 1, 1)}

    text = jobsup("stats", "--dsn", dsn).stdout
    assert "latency and run time, last 1m" in text and "leases expiring soonest" in text
    assert "attempts, live and dead jobs" in text
    email_line = next(line for line in text.splitlines() if "email" in line and "ms" in line)
    assert "20.0ms" in email_line and "500ms" in email_line, email_line


def test_the_console_shows_latency_leases_and_attempts_from_the_database(dsn, conn):
    import asyncio

    from jobsup import client
    from jobsup.db import lifecycle
    from jobsup.monitor.source import Source

    conn.execute(
        SQL["latency_merge"],
        {
            "kinds": ["email"] * 2,
            "metrics": ["queue_latency", "run_time"],
            "buckets": [latency.bucket(0.3), latency.bucket(0.05)],
            "counts": [9, 9],
        },
    )
    client.enqueue_many(conn, [{"kind": "email"}] * 2)
    [job, _] = lifecycle.claim(conn, ["default"], 2, "sup-a", 30)

    async def refresh():
        source = Source(dsn)
        try:
            return await source.refresh()
        finally:
            await source.close()

    figures = asyncio.run(refresh())
    [email] = figures.latency
    assert email.get("queue_latency", 1).count == 9 and abs(email.get("run_time", 5).p50 - 0.05) < 0.0015
    assert [lease.id for lease in figures.leases][:1] == [job.id] and len(figures.leases) == 2
    assert 25 < figures.leases[0].remaining <= 30
    assert figures.attempts == (("running", 1, 2),)
