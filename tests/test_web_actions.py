"""The web console's actions by plain HTTP: each changes what jobsup.ops.control changes, says so,
and is recorded in the audit with the user's name."""

from __future__ import annotations

import re

import psycopg

from jobsup import client
from jobsup.web.board import Boards
from jobsup.web.database import Database

from .console_helpers import fake_supervisor
from .helpers import wait_for
from .web_helpers import TOKEN, csrf_of, login_client, main_of, make_dead, sign_in, token_client


def _status(conn, job_id: int) -> str:
    return conn.execute("SELECT status FROM jobsup.jobs WHERE id = %s", (job_id,)).fetchone()[0]


def _audit(conn) -> list[tuple]:
    return conn.execute("SELECT who, action, target, job_ids FROM jobsup.audit ORDER BY id").fetchall()


def test_requeue_one_and_all_of_a_kind_with_the_exact_count(dsn, conn):
    one = make_dead(conn, "email", "smtp down", 1)
    many = make_dead(conn, "sms", "no credit", 3) + make_dead(conn, "sms", "bad number", 2)
    web = login_client(dsn)
    sign_in(web, "olga")
    page = web.get("/dead")
    answer = web.post(
        "/actions/requeue",
        data={"ids": str(one[0]), "csrf": csrf_of(page.text), "back": "/dead"},
    )
    assert answer.status_code == 303 and answer.headers["location"].startswith("/dead?notice=requeued+1")
    assert _status(conn, one[0]) == "queued"

    confirm = web.get("/dead/confirm", params={"kind": "sms"})
    assert "Requeue 5 dead jobs of kind sms?" in confirm.text
    # One more dies after the confirmation: the confirmed five are requeued, not six.
    late = make_dead(conn, "sms", "no credit", 1, queue="later")
    web.post(
        "/actions/requeue",
        data={
            "ids": re.search(r'name="ids" value="([^"]+)"', confirm.text).group(1),
            "kind": "sms",
            "csrf": csrf_of(confirm.text),
        },
    )
    assert [_status(conn, i) for i in many] == ["queued"] * 5 and _status(conn, late[0]) == "dead"
    by_error = web.get("/dead/confirm", params={"kind": "sms", "error": "no credit"})
    assert "Requeue 1 dead job of kind sms whose last error is &#x27;no credit&#x27;?" in by_error.text

    audit = _audit(conn)
    assert audit[0] == ("olga", "requeue", f"job {one[0]}", one)
    assert audit[1][:3] == ("olga", "requeue", "kind sms") and sorted(audit[1][3]) == sorted(many)
    page = main_of(web.get("/audit").text)
    assert "olga" in page and "requeued 5 of 5 dead jobs of kind sms" in page


def test_cancel_retry_pause_resume_and_limits(dsn, conn):
    queued = client.enqueue(conn, "report", {})
    web = login_client(dsn)
    sign_in(web, "olga")
    csrf = csrf_of(web.get("/").text)
    assert web.post("/actions/cancel", data={"id": str(queued), "csrf": csrf}).status_code == 303
    assert _status(conn, queued) == "cancelled"
    assert web.post("/actions/retry", data={"id": str(queued), "csrf": csrf}).status_code == 303
    assert web.post("/actions/pause", data={"queue": "mail", "csrf": csrf}).status_code == 303
    assert conn.execute("SELECT queue, paused_by FROM jobsup.queue_pauses").fetchall() == [("mail", "olga")]
    assert "paused by olga" in web.get("/queues").text
    assert web.post("/actions/resume", data={"queue": "mail", "csrf": csrf}).status_code == 303
    assert conn.execute("SELECT count(*) FROM jobsup.queue_pauses").fetchone()[0] == 0
    answer = web.post("/actions/limit", data={"kind": "report", "concurrency": "3", "rate": "10/s", "csrf": csrf})
    assert answer.status_code == 303
    assert conn.execute("SELECT concurrency, set_by FROM jobsup.limits WHERE kind = 'report'").fetchone() == (3, "olga")
    assert "report" in main_of(web.get("/limits").text)
    bad = web.post("/actions/limit", data={"kind": "report", "concurrency": "lots", "csrf": csrf})
    assert bad.status_code == 400 and "concurrency" in bad.text
    assert [row[1] for row in _audit(conn)] == ["cancel", "retry", "pause", "resume", "limit"]
    assert {row[0] for row in _audit(conn)} == {"olga"}


def test_one_read_serves_every_page(dsn, conn):
    """However many pages ask within the interval, the board is read once."""
    import asyncio

    client.enqueue(conn, "email", {})
    boards = Boards(Database(dsn), refresh=60)

    async def many() -> None:
        await asyncio.gather(*(boards.current() for _ in range(20)))
        await asyncio.gather(*(boards.current() for _ in range(20)))
        await boards.db.close()

    asyncio.run(many())
    assert boards.reads == 1
    assert boards.board is not None and boards.board.snapshot.total.ready == 1


def test_a_database_that_goes_away_shows_a_banner_and_recovers(dsn, conn, server_dsn):
    client.enqueue(conn, "email", {})
    web = token_client(dsn)
    web.get(f"/?token={TOKEN}")
    assert 'id="banner"' in web.get("/").text and "cannot be reached" not in web.get("/").text
    dbname = conn.info.dbname
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE {dbname} ALLOW_CONNECTIONS false")
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND application_name = 'jobsup web'",
            (dbname,),
        )
        try:
            page = wait_for(
                lambda: (p := web.get("/")).status_code == 200 and "cannot be reached" in p.text and p,
                message="the banner",
            )
            assert "Traceback" not in page.text and "password" not in page.text
            assert web.get("/live.json").json()["error"].startswith("The database cannot be reached")
            assert web.get("/healthz").status_code == 503
            assert web.get("/jobs/1").status_code == 503
        finally:
            admin.execute(f"ALTER DATABASE {dbname} ALLOW_CONNECTIONS true")
    wait_for(lambda: "cannot be reached" not in web.get("/").text, message="the page without the banner")
    assert web.get("/healthz").status_code == 200


def test_through_pgbouncer_in_transaction_mode(pooled_dsn, conn, monkeypatch):
    """The figures and an action through a transaction-mode PgBouncer, as the supervisor works there."""
    monkeypatch.setenv("JOBSUP_POOLER", "transaction")
    [dead] = make_dead(conn, "email", "smtp down")
    web = token_client(pooled_dsn)
    web.get(f"/?token={TOKEN}")
    for _ in range(3):  # statements prepared once and then gone would fail a later read
        page = web.get("/dead")
        assert page.status_code == 200 and "smtp down" in page.text
    answer = web.post("/actions/requeue", data={"ids": str(dead), "csrf": csrf_of(page.text)})
    assert answer.status_code == 303
    assert _status(conn, dead) == "queued"
    assert web.get(f"/jobs/{dead}").status_code == 200


def test_pause_and_resume_a_schedule(dsn, conn):
    from jobsup.db.sql import STATEMENTS as SQL

    conn.execute(
        SQL["schedule_declare"],
        {
            "name": "nightly",
            "kind": "report",
            "expression": "0 3 * * *",
            "tz": "UTC",
            "payload": "{}",
            "queue": "default",
            "priority": 0,
            "max_attempts": 3,
            "missed": "latest",
        },
    )
    web = login_client(dsn)
    sign_in(web, "olga")
    page = web.get("/schedules")
    assert "nightly" in main_of(page.text) and "Pause" in main_of(page.text)
    assert (
        web.post("/actions/schedule-pause", data={"schedule": "nightly", "csrf": csrf_of(page.text)}).status_code == 303
    )
    assert conn.execute("SELECT paused FROM jobsup.schedules WHERE name = 'nightly'").fetchone()[0] is True
    assert "Resume" in main_of(web.get("/schedules").text)
    assert (
        web.post("/actions/schedule-resume", data={"schedule": "nightly", "csrf": csrf_of(page.text)}).status_code
        == 303
    )
    assert conn.execute("SELECT paused FROM jobsup.schedules WHERE name = 'nightly'").fetchone()[0] is False
    assert [row[1:3] for row in _audit(conn)] == [
        ("schedule pause", "schedule nightly"),
        ("schedule resume", "schedule nightly"),
    ]


def test_audit_rows_are_pruned_with_the_events(dsn, conn):
    import asyncio

    from jobsup.ops.prune import Retention, aprunable, aprune

    conn.execute(
        "INSERT INTO jobsup.audit (at, who, role, action, target) VALUES"
        " (now() - interval '2 hours', 'old', 'operator', 'pause', 'queue q'),"
        " (now(), 'new', 'operator', 'pause', 'queue q')"
    )
    retention = Retention(keep_events=3600)

    async def prune() -> tuple[int, int]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            before = (await aprunable(aconn, retention)).events
            return before, (await aprune(aconn, retention)).events

    assert asyncio.run(prune()) == (1, 1)
    assert [row[0] for row in conn.execute("SELECT who FROM jobsup.audit")] == ["new"]


def test_the_control_commands_write_the_audit_too(dsn, conn):
    from .helpers import jobsup

    [dead] = make_dead(conn, "email", "smtp down")
    queued = client.enqueue(conn, "report", {})
    for args in (
        ["requeue-dead", "--kind", "email"],
        ["pause", "mail"],
        ["resume", "mail"],
        ["cancel", "--id", str(queued)],
        ["retry", "--id", str(queued)],
        ["limit", "report", "--concurrency", "2"],
    ):
        done = jobsup(*args, "--dsn", dsn)
        assert done.returncode == 0, (args, done.stderr)
    rows = conn.execute("SELECT role, action, target, job_ids FROM jobsup.audit ORDER BY id").fetchall()
    assert [row[:3] for row in rows] == [
        ("command", "requeue", "kind email"),
        ("command", "pause", "queue mail"),
        ("command", "resume", "queue mail"),
        ("command", "cancel", f"job {queued}"),
        ("command", "retry", f"job {queued}"),
        ("command", "limit", "kind report"),
    ]
    assert rows[0][3] == [dead] and rows[3][3] == [queued]
    assert "@" in conn.execute("SELECT who FROM jobsup.audit LIMIT 1").fetchone()[0]  # user@host


def test_the_terminal_console_writes_the_audit_too(dsn, conn):
    import asyncio

    from jobsup.monitor.source import Source

    [dead] = make_dead(conn, "email", "smtp down")
    queued = client.enqueue(conn, "report", {})

    async def act() -> None:
        source = Source(dsn)
        await source.requeue([dead])
        await source.cancel(queued)
        await source.queue_action("pause", "mail")
        await source.set_limits("report", {"concurrency": 2})
        await source.close()

    asyncio.run(act())
    rows = conn.execute("SELECT role, action, target, job_ids FROM jobsup.audit ORDER BY id").fetchall()
    assert rows == [
        ("console", "requeue", f"job {dead}", [dead]),
        ("console", "cancel", f"job {queued}", [queued]),
        ("console", "pause", "queue mail", []),
        ("console", "limit", "kind report", []),
    ]


def test_the_overview_says_what_each_worker_runs_as_the_console_does(dsn, conn):
    """A process of shared jobs: how many of its capacity and its loop's lag, or the job blocking its
    loop; an alone worker: its job, and how many are handed to it behind that one."""
    workers = [
        {"pid": 11, "state": "busy", "shared": 12, "capacity": 100, "lag": 0.004},
        {"pid": 12, "state": "busy", "shared": 3, "capacity": 100, "lag": 1.2, "blocked_by": 77},
        {"pid": 13, "state": "busy", "job_id": 5, "kind": "email", "behind": [6, 7]},
    ]
    fake_supervisor(conn, "sup-a", 4242, workers)
    web = token_client(dsn)
    web.get(f"/?token={TOKEN}")
    text = main_of(web.get("/").text)
    assert "12 of 100 shared, loop lag 4 ms" in text
    assert "loop blocked by" in text and "/jobs/77" in text
    assert "(+2 behind it, not started)" in text
