"""`jobsup top` driven by Textual's Pilot against a real PostgreSQL.

A running supervisor is faked by writing its heartbeat row (and a reaper's event) directly; jobs are
made with the queue functions, so every figure on screen can be checked against the database. The
snapshot test uses a stand-in source with fixed figures and a fixed clock, so its picture is stable.

The app runs in this test's event loop, so waiting uses `until` (tests/console_helpers.py), which polls
with the Pilot (a blocking wait would freeze the app it waits for); like tests/helpers.wait_for it fails
at a deadline.
"""

from __future__ import annotations

import asyncio
import io
import os
import re
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import conninfo
from textual.widgets import DataTable

from jobsup import client
from jobsup.db import lifecycle
from jobsup.errors import JobsupError
from jobsup.monitor import figures as fig
from jobsup.monitor import panels
from jobsup.monitor.app import TopApp
from jobsup.monitor.screens import Confirm, HelpScreen, JobScreen
from jobsup.monitor.source import APPLICATION_NAME, ReadOnly, Source
from jobsup.monitor.tabs import Pane
from jobsup.ops import latency
from jobsup.ops.doctor import Thresholds

from .console_helpers import app_for, fake_supervisor, rows, run, screen_text, select, until
from .helpers import ROOT, jobsup

pytestmark = pytest.mark.slow  # the console driven by the Pilot takes seconds a test

SNAPSHOTS = Path(__file__).parent / "snapshots"
UPDATE_SNAPSHOTS = os.environ.get("JOBSUP_UPDATE_SNAPSHOTS") == "1"


def make_dead(conn: psycopg.Connection, kind: str, n: int, error: str, queue_name: str = "default") -> list[int]:
    ids = [client.enqueue(conn, kind, {"n": i}, queue=queue_name, max_attempts=1) for i in range(n)]
    jobs = lifecycle.claim(conn, [queue_name], n, "sup-test", 30)
    assert sorted(j.id for j in jobs) == sorted(ids)
    lifecycle.fail(
        conn,
        [lifecycle.Failure(j.id, j.attempts, error, f"Traceback (most recent call last):\n  {error}") for j in jobs],
        "sup-test",
    )
    return ids


def status(conn: psycopg.Connection, job_id: int) -> str:
    return conn.execute("SELECT status FROM jobsup.jobs WHERE id = %s", (job_id,)).fetchone()[0]


# --- figures, live ---------------------------------------------------------------------------------


def test_a_snapshot_holding_back_vacuum_shows_as_the_health_line(conn, dsn):
    holder = psycopg.connect(dsn)
    try:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT 1")
        pid = holder.info.backend_pid

        async def scenario() -> None:
            app = TopApp(Source(dsn, thresholds=Thresholds(max_xmin_age=0.05)), refresh=0.2, tz=UTC)
            async with app.run_test(size=(80, 24)) as pilot:
                await until(pilot, lambda: app.figures is not None and app.figures.health, message="a health warning")
                assert "vacuum held back" in app.figures.health and f"pid {pid}" in app.figures.health
                assert f"pid {pid}" in await screen_text(pilot)
                holder.rollback()
                await until(pilot, lambda: app.figures.health is None, message="the warning to clear")
                assert "vacuum held back" not in await screen_text(pilot)

        run(scenario)
    finally:
        holder.close()


def test_figures_match_the_database(conn, dsn):
    for i in range(3):
        client.enqueue(conn, "email", {"i": i})
    client.enqueue(conn, "sms", {}, queue="texts", delay=3600)
    running = [client.enqueue(conn, "report", {}, queue="reports") for _ in range(2)]
    lifecycle.claim(conn, ["reports"], 2, "sup-a", 30)
    done = client.enqueue(conn, "sms", {}, queue="texts")
    [job] = lifecycle.claim(conn, ["texts"], 1, "sup-a", 30)
    assert job.id == done
    lifecycle.complete(conn, [(done, 1)], "sup-a")
    dead = make_dead(conn, "email", 2, "SMTP timeout", queue_name="mail")
    fake_supervisor(
        conn,
        "sup-a",
        4242,
        [
            {
                "pid": 501,
                "state": "busy",
                "job_id": running[0],
                "kind": "report",
                "job_started_at": datetime.now(UTC).isoformat(),
                "rss": 50 << 20,
                "cpu": 12.0,
                "jobs_done": 9,
                "restarts": 1,
                "last_exit": "killed by SIGKILL",
            },
            {"pid": 502, "state": "idle", "rss": 40 << 20, "cpu": 0.0, "jobs_done": 8, "restarts": 0},
        ],
    )
    fake_supervisor(conn, "sup-gone", 999, [{"pid": 7, "state": "idle"}], heartbeat_ago=60)
    conn.execute(
        "INSERT INTO jobsup.events (action, supervisor, count, job_ids, detail) VALUES "
        "('reaped', 'sup-a', 2, '{11,12}', '{\"from\": [\"sup-gone\"], \"dead\": 1}')"
    )

    async def scenario() -> None:
        # The live supervisor's heartbeat is written once: it must not turn stale on a slow machine.
        app = app_for(dsn, stale_after=30)
        async with app.run_test(size=(160, 48)) as pilot:
            await until(pilot, lambda: app.refreshes >= 1, message="first refresh")
            counts = {
                r[0]: r[1]
                for r in conn.execute(
                    "SELECT status || CASE WHEN status = 'queued' AND run_at > now() THEN '+' ELSE '' END, "
                    "count(*) FROM jobsup.jobs GROUP BY 1"
                )
            }
            total = app.figures.total
            assert (total.ready, total.scheduled, total.running, total.done, total.dead) == (
                counts["queued"],
                counts["queued+"],
                counts["running"],
                counts["done"],
                counts["dead"],
            )
            assert total.failed == 2
            kinds = rows(app, "kinds")
            assert kinds["email"] == ["email", "3", "0", "0", "0", "2", "2", "0"]
            assert kinds["report"] == ["report", "0", "0", "2", "0", "0", "0", "0"]
            assert kinds["sms"] == ["sms", "0", "1", "0", "1", "0", "0", "0"]
            assert kinds[next(k for k in kinds if k.startswith("\x00"))][1:] == ["3", "1", "2", "1", "2", "2", "0"]
            assert set(rows(app, "queues")) == {"default", "reports", "texts"}  # queues of live jobs
            assert set(rows(app, "dead")) == {str(i) for i in dead}
            assert [[g[0], g[1], g[3]] for g in rows(app, "groups").values()] == [["2", "email", "SMTP timeout"]]
            workers = rows(app, "workers")
            busy = next(w for w in workers.values() if w[1] == "501")
            assert busy[2:5] == ["busy", str(running[0]), "report"] and busy[6] == "50M"
            assert next(iter(rows(app, "reaper").values()))[2:5] == ["2", "1", "sup-gone"]
            text = await screen_text(pilot)
            assert "ready 3  scheduled 1  running 2  dead 2" in text
            # Stale since its last heartbeat, 60 s before the test began (and however long it has run).
            assert re.search(r"supervisors 1 \+1 stale since \dm\d\ds", text) and "workers 1/2 busy" in text
            await pilot.press("3")  # the Workers tab
            await until(
                pilot,
                lambda: "✖ STALE box:999" in app.screen.query_one("#supervisors").render().plain,
                message="the Workers tab",
            )
            text = await screen_text(pilot)
            assert "✖ STALE box:999" in text and "● box:4242" in text

            # A job enqueued now shows up on a later refresh, and its cell stands out as changed.
            client.enqueue(conn, "email", {})
            await until(pilot, lambda: rows(app, "kinds")["email"][1] == "4", message="the new job")
            assert ("email", "ready") in fig.changed(app.previous, app.figures)

    run(scenario)


# --- requeue ---------------------------------------------------------------------------------------


def test_dead_job_shows_and_r_requeues_it(conn, dsn):
    [job_id] = make_dead(conn, "email", 1, "SMTP timeout")
    [other] = make_dead(conn, "sms", 1, "no route")

    async def scenario() -> None:
        app = app_for(dsn)
        async with app.run_test(size=(160, 48)) as pilot:
            await until(pilot, lambda: str(job_id) in rows(app, "dead"), message="the dead job")
            assert rows(app, "dead")[str(job_id)][1:3] == ["email", "1/1"]

            # Enter opens it: its error history with the traceback.
            await select(pilot, "dead", str(job_id))
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, JobScreen), message="the job screen")
            assert "Traceback (most recent call last):" in await screen_text(pilot)
            await pilot.press("escape")
            await until(pilot, lambda: not isinstance(app.screen, JobScreen), message="the job screen to close")

            await select(pilot, "dead", str(job_id))
            await pilot.press("r")
            await until(pilot, lambda: status(conn, job_id) == "queued", message="the requeue")
            await until(pilot, lambda: str(job_id) not in rows(app, "dead"), message="the table to update")
            assert status(conn, other) == "dead"
            assert app.figures.total.dead == 1

    run(scenario)


def test_bulk_requeue_asks_first_and_takes_exactly_the_stated_scope(conn, dsn):
    smtp = make_dead(conn, "email", 3, "SMTP timeout")
    bounce = make_dead(conn, "email", 2, "mailbox full")
    sms = make_dead(conn, "sms", 2, "no route")

    async def scenario() -> None:
        app = app_for(dsn)
        async with app.run_test(size=(160, 48)) as pilot:
            await until(pilot, lambda: len(rows(app, "groups")) == 3, message="three groups")
            group = next(k for k, v in rows(app, "groups").items() if v[3] == "SMTP timeout")

            # No is the default: Enter right away changes nothing.
            await select(pilot, "groups", group)
            await pilot.press("R")
            confirm = await until(
                pilot, lambda: app.screen if isinstance(app.screen, Confirm) else None, message="the confirmation"
            )
            assert confirm.question == "Requeue 3 dead email jobs whose last error is 'SMTP timeout'?"
            assert "Requeue 3 dead email jobs" in await screen_text(pilot)
            await pilot.press("enter")
            await until(pilot, lambda: not isinstance(app.screen, Confirm), message="the dialog to close")
            assert all(status(conn, i) == "dead" for i in smtp + bounce + sms)

            # Asked again; a job that dies in the same group meanwhile is not part of what was stated.
            await select(pilot, "groups", group)
            await pilot.press("R")
            await until(pilot, lambda: isinstance(app.screen, Confirm), message="the confirmation")
            [late] = make_dead(conn, "email", 1, "SMTP timeout")
            await pilot.press("y")
            await until(pilot, lambda: all(status(conn, i) == "queued" for i in smtp), message="the requeue")
            assert status(conn, late) == "dead"
            assert all(status(conn, i) == "dead" for i in bounce + sms)

            # R on the kinds table's total row states every dead job; n declines.
            await until(pilot, lambda: app.figures.total.dead == 5, message="the new totals")
            kinds = rows(app, "kinds")
            await select(pilot, "kinds", next(k for k in kinds if k.startswith("\x00")))
            await pilot.press("R")
            confirm = await until(
                pilot, lambda: app.screen if isinstance(app.screen, Confirm) else None, message="the confirmation"
            )
            assert confirm.question == "Requeue 5 dead jobs (all of them, every kind)?"
            await pilot.press("n")
            await until(pilot, lambda: not isinstance(app.screen, Confirm), message="the dialog to close")

            # R on the sms row of the kinds table: that kind only.
            await select(pilot, "kinds", "sms")
            await pilot.press("R")
            confirm = await until(
                pilot, lambda: app.screen if isinstance(app.screen, Confirm) else None, message="the confirmation"
            )
            assert confirm.question == "Requeue 2 dead sms jobs?"
            await pilot.press("tab", "enter")  # to Yes, and press it
            await until(pilot, lambda: all(status(conn, i) == "queued" for i in sms), message="the requeue")
            assert status(conn, late) == "dead" and all(status(conn, i) == "dead" for i in bounce)

    run(scenario)


def test_read_only_refuses_to_requeue(conn, dsn):
    [job_id] = make_dead(conn, "email", 1, "SMTP timeout")

    async def scenario() -> None:
        app = app_for(dsn, read_only=True)
        async with app.run_test(size=(160, 48)) as pilot:
            await until(pilot, lambda: str(job_id) in rows(app, "dead"), message="the dead job")
            shown = {b.binding.action for b in app.screen.active_bindings.values() if b.binding.show}
            assert "requeue" not in shown and "requeue_scope" not in shown
            assert "Requeue" not in await screen_text(pilot)
            await select(pilot, "dead", str(job_id))
            await pilot.press("r", "R")
            await pilot.pause(0.1)
            assert not isinstance(app.screen, Confirm)
            assert any("read-only" in n.message for n in app._notifications)
            with pytest.raises(ReadOnly):
                await app.source.requeue([job_id])
            # Even the connection itself cannot write.
            with pytest.raises(JobsupError, match="read-only transaction"):
                await app.source._run(lambda c: c.execute("UPDATE jobsup.jobs SET status = 'queued'"))
            assert status(conn, job_id) == "dead"

            await pilot.press("question_mark")
            await until(pilot, lambda: isinstance(app.screen, HelpScreen), message="the help screen")
            assert "requeue" not in (await screen_text(pilot)).lower()

    run(scenario)


def test_the_source_holds_one_conversation_at_a_time(conn, dsn):
    """Refreshes and requeues issued at once (timer and keys do that) all succeed, each with its own result."""
    ids = make_dead(conn, "email", 20, "SMTP timeout")

    async def scenario() -> None:
        source = Source(dsn)
        try:
            results = await asyncio.gather(
                *(source.refresh() for _ in range(5)),
                *(source.requeue([i]) for i in ids),
                *(source.refresh() for _ in range(5)),
            )
        finally:
            await source.close()
        assert sorted(i for done in results[5:25] for i in done) == sorted(ids)

    asyncio.run(scenario())


# --- filter ----------------------------------------------------------------------------------------


def test_filter_narrows_the_tables(conn, dsn):
    emails = make_dead(conn, "email", 2, "SMTP timeout")
    texts = make_dead(conn, "sms", 1, "no route", queue_name="texts")
    client.enqueue(conn, "sms", {}, queue="texts")  # a kind matches by the queues of its live jobs
    client.enqueue(conn, "report", {})

    async def scenario() -> None:
        app = app_for(dsn)
        async with app.run_test(size=(160, 48)) as pilot:
            await until(pilot, lambda: len(rows(app, "dead")) == 3, message="all dead jobs")
            await pilot.press("slash", *"TEXT")  # a part of the queue's name, any case
            await until(pilot, lambda: set(rows(app, "dead")) == {str(i) for i in texts}, message="the filter")
            assert [k for k in rows(app, "kinds") if not k.startswith("\x00")] == ["sms"]
            assert list(rows(app, "queues")) == ["texts"]
            assert [v[1] for v in rows(app, "groups").values()] == ["sms"]
            assert "filter: TEXT" in await screen_text(pilot)

            await pilot.press("escape")
            await until(pilot, lambda: len(rows(app, "dead")) == 3, message="the filter to clear")
            assert {k for k in rows(app, "kinds") if not k.startswith("\x00")} == {"email", "report", "sms"}

            await pilot.press("slash", *"mail", "enter")
            await until(pilot, lambda: set(rows(app, "dead")) == {str(i) for i in emails}, message="the filter")
            assert app.focused is app.query_one("#dead", DataTable)  # Enter keeps the filter, back to the table

    run(scenario)


# --- dead jobs arriving, and the job screen's clock ------------------------------------------------


def dead_line(text: str, job_id: int) -> int:
    """The screen line that shows a dead job's row."""
    return next(n for n, line in enumerate(text.splitlines()) if line.startswith(f"│ {job_id} "))


def test_dead_jobs_follow_the_newest_until_the_cursor_moves(conn, dsn):
    make_dead(conn, "email", 20, "SMTP timeout")

    async def scenario() -> None:
        app = app_for(dsn)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: len(rows(app, "dead")) == 20, message="the dead jobs")
            await pilot.press("2")
            table = app.query_one("#dead", DataTable)
            await until(pilot, lambda: app.focused is table, message="the Dead tab")

            # The cursor on the first row: new dead jobs come in at the top, and the cursor with them.
            new = make_dead(conn, "email", 2, "SMTP timeout")
            await until(pilot, lambda: panels.selected_key(table) == str(max(new)), message="the newest")
            assert table.cursor_row == 0 and table.scroll_y == 0

            # Moved down: that job stays selected on its line of the screen; the newer rows wait above, counted.
            await pilot.press("down", "down", "down")
            held = int(panels.selected_key(table))
            line = dead_line(await screen_text(pilot), held)
            newer = make_dead(conn, "email", 3, "SMTP timeout")
            await until(
                pilot,
                lambda: str(max(newer)) in rows(app, "dead") and table.scroll_y == 3,
                message="the newer rows above the view",
            )
            text = await screen_text(pilot)
            assert panels.selected_key(table) == str(held) and dead_line(text, held) == line
            assert "↑ 3 newer" in text and f"│ {max(newer)} " not in text
            await pilot.press("r")  # r still takes the held job, not one that arrived
            await until(pilot, lambda: status(conn, held) == "queued", message="the requeue")
            assert all(status(conn, i) == "dead" for i in newer)

            # Home: back to the newest, and following again.
            await pilot.press("home")
            latest = make_dead(
                conn, "email", 1, "SMTP timeout", queue_name="later"
            )  # the requeued one waits in default
            await until(pilot, lambda: panels.selected_key(table) == str(latest[0]), message="the newest again")
            assert table.cursor_row == 0 and "newer" not in await screen_text(pilot)

    run(scenario)


def test_the_job_screen_counts_its_relative_times_on(conn, dsn):
    [job_id] = make_dead(conn, "email", 1, "SMTP timeout")

    def finished(text: str) -> str:
        return next(line for line in text.splitlines() if "finished" in line).split("(")[1].split(")")[0]

    async def scenario() -> None:
        app = app_for(dsn)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: str(job_id) in rows(app, "dead"), message="the dead job")
            await select(pilot, "dead", str(job_id))
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, JobScreen), message="the job screen")
            app.paused = True  # no refresh: the clock of the screen alone moves its times
            first = finished(await screen_text(pilot))
            assert first.endswith(" ago")
            # The screen's text is read by awaiting, so this polls by hand, with the same kind of deadline.
            deadline = time.monotonic() + 10
            later = first
            while later == first and time.monotonic() < deadline:
                await pilot.pause(0.2)
                later = finished(await screen_text(pilot))
            assert later != first and later.endswith(" ago"), (first, later)

    run(scenario)


# --- tabs ------------------------------------------------------------------------------------------


def test_keys_and_tab_reach_every_panel_and_toasts_leave_the_filter_clear():
    async def scenario() -> None:
        app = TopApp(FixedSource(), refresh=3600, tz=UTC)  # type: ignore[arg-type]
        async with app.run_test(size=(80, 24), notifications=True) as pilot:
            await until(pilot, lambda: app.refreshes >= 1, message="first refresh")
            # Tab walks every panel of every tab, showing each tab in turn, and comes back round.
            seen = []
            for _ in range(9):
                seen.append((app.tab, app.focused.id))
                await pilot.press("tab")
                await until(
                    pilot, lambda: app.focused is not None and app.focused.id != seen[-1][1], message="the next panel"
                )
            assert seen == [
                ("jobs", "kinds"),
                ("jobs", "queues"),
                ("dead", "dead"),
                ("dead", "groups"),
                ("workers", "workers"),
                ("reaper", "reaper"),
                ("latency", "latency"),
                ("latency", "leases"),
                ("latency", "attempts"),
            ]
            assert (app.tab, app.focused.id) == ("jobs", "kinds")
            await pilot.press("shift+tab")
            await until(pilot, lambda: app.focused.id == "attempts", message="the previous panel")

            # The latency tab's w steps through its windows, and says which in the panel's title.
            await pilot.press("5")
            await until(pilot, lambda: app.focused is not None and app.focused.id == "latency", message="latency")
            for window in ("5m–6m", "60m–70m", "1m–2m"):
                await pilot.press("w")
                await until(
                    pilot,
                    lambda window=window: f"last {window} (w)" in str(app.query_one("#latency-panel").border_title),
                    message=f"the {window} window",
                )

            # Each tab's key shows it (and only it, on a small terminal) with its first panel focused.
            for key, tab, first in (("2", "dead", "dead"), ("3", "workers", "workers"), ("1", "jobs", "kinds")):
                await pilot.press(key)
                await until(pilot, lambda first=first: app.focused is not None and app.focused.id == first, message=tab)
                shown = [p.TAB.id for p in app.query(Pane) if p.display]
                assert shown == [tab]
                assert f"[{key} " in (await screen_text(pilot)).splitlines()[3]  # the tab bar marks it

            # A click on a tab's title shows it too.
            await pilot.click("#tabbar", offset=(30, 0))
            await until(pilot, lambda: app.focused is not None and app.focused.id == "workers", message="the click")

            # The help screen and the palette name the tabs' keys.
            await pilot.press("question_mark")
            await until(pilot, lambda: isinstance(app.screen, HelpScreen), message="the help screen")
            app.screen.query_one("#help").scroll_end(animate=False)  # the list is longer than 24 lines
            assert "command palette" in await screen_text(pilot)
            assert ("4", "Reaper tab: jobs returned from expired leases") in app.key_help()
            await pilot.press("escape")
            assert {c.title for c in app.get_system_commands(app.screen)} >= {
                "Show the Jobs tab",
                "Show the Dead tab",
                "Show the Workers tab",
                "Show the Reaper tab",
                "Show the Latency tab",
            }

            # A notification shows while the filter is open: it does not cover the filter.
            await pilot.press("slash", *"mail")
            app.notify("requeued 412 dead email jobs", timeout=30)
            toasts = await until(
                pilot, lambda: [t for t in app.screen.query("Toast") if t.region], message="the notification"
            )
            box = app.query_one("#filter")
            assert box.region and not any(box.region.overlaps(t.region) for t in toasts)
            assert app.match == "mail"

    run(scenario)


# --- losing the database ---------------------------------------------------------------------------


def test_survives_the_database_going_away_and_coming_back(conn, dsn, server_dsn):
    client.enqueue(conn, "email", {})
    name = conninfo.conninfo_to_dict(dsn)["dbname"]

    async def scenario() -> None:
        app = app_for(dsn)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.refreshes >= 1, message="first refresh")
            with psycopg.connect(server_dsn, autocommit=True) as admin:
                # New connections are refused and the console's own is cut: the database is gone for it.
                admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
                try:
                    admin.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = %s AND application_name = %s",
                        (name, APPLICATION_NAME),
                    )
                    await until(pilot, lambda: app.down is not None, message="the console to notice")
                    text = await screen_text(pilot)
                    assert "database unavailable" in text and "stale" in text
                    assert app.figures is not None and app.figures.total.ready == 1  # last figures kept
                    refreshes = app.refreshes
                    client.enqueue(conn, "email", {})  # the test's own connection was left alone
                    await pilot.pause(0.5)
                    assert app.refreshes == refreshes and app.down is not None
                finally:
                    admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
            await until(
                pilot, lambda: app.down is None and app.figures.total.ready == 2, message="the console to reconnect"
            )
            assert "database unavailable" not in await screen_text(pilot)

    run(scenario)


# --- the command line ------------------------------------------------------------------------------


def test_a_bad_dsn_is_one_clear_message(tmp_path, empty_dsn):
    result = jobsup("top", "--dsn", f"postgresql://nobody:s3cret@/nodb?host={tmp_path}")
    assert result.returncode == 1
    assert result.stderr.startswith("jobsup: error: cannot connect to postgresql://nobody:***@")
    assert "s3cret" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    result = jobsup("top", "--dsn", empty_dsn)
    assert result.returncode == 1 and "run `jobsup migrate`" in result.stderr


def test_the_data_source_needs_no_textual_and_the_console_no_supervisor():
    check = (
        "import sys, jobsup.monitor.source, jobsup.monitor.figures; "
        "assert 'textual' not in sys.modules, 'the data source imported textual'; "
        "import jobsup.monitor.app, jobsup.cli.top; "
        "assert not [m for m in sys.modules if m.startswith('jobsup.supervisor')], 'imported the supervisor'"
    )
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr


# --- the whole screen, fixed -------------------------------------------------------------------------


NOW = datetime(2026, 3, 2, 9, 30, 0, tzinfo=UTC)


def fixed_figures(step: int) -> fig.Figures:
    """The figures of a busy queue at NOW + step seconds, growing by a fixed pattern."""
    now = NOW + timedelta(seconds=step)
    grown = sum((0, 31, 55, 18, 42, 37, 26)[: step + 1])  # jobs done by then: a rate that varies
    workers = tuple(
        fig.Worker(
            pid=3100 + i,
            state="busy" if i < 5 else "idle",
            job_id=9000 + i if i < 5 else None,
            kind=("email", "report", "email", "resize", "email")[i] if i < 5 else None,
            job_started_at=now - timedelta(seconds=2 + 7 * i) if i < 5 else None,
            rss=(60 + 3 * i) << 20,
            cpu=float(40 - 4 * i) if i < 5 else 0.0,
            jobs_done=900 + 37 * i,
            restarts=1 if i == 3 else 0,
            last_exit="exit code -9 (SIGKILL)" if i == 3 else None,
        )
        for i in range(8)
    )
    return fig.Figures(
        now=now,
        kinds=(
            fig.KindRow(
                "email",
                ready=120 - step,
                scheduled=14,
                running=3,
                done=48_210 + grown,
                failed=1_204 + step,
                dead=412,
                queues=("default",),
            ),
            fig.KindRow(
                "report", ready=4, scheduled=0, running=1, done=2_113 + 2 * step, failed=17, dead=2, queues=("reports",)
            ),
            fig.KindRow(
                "resize",
                ready=0,
                scheduled=2,
                running=1,
                done=15_002 + 5 * step,
                failed=230,
                dead=31,
                queues=("default",),
            ),
        ),
        queues=(
            fig.QueueRow("default", ready=120 - step, scheduled=16, running=4, oldest=4.2, kinds=("email", "resize")),
            fig.QueueRow("reports", ready=4, running=1, oldest=95.0, kinds=("report",)),
        ),
        dead_jobs=tuple(
            fig.DeadJob(
                8800 - i,
                ("email", "resize", "email")[i % 3],
                "default",
                5,
                5,
                now - timedelta(seconds=30 * i + 5),
                (
                    "SMTPServerDisconnected: Connection unexpectedly closed",
                    "worker exited with code -9 (SIGKILL) while running the job",
                    "SMTPServerDisconnected: Connection unexpectedly closed",
                )[i % 3],
            )
            for i in range(12)
        ),
        dead_groups=(
            fig.DeadGroup(
                "email", "SMTPServerDisconnected: Connection unexpectedly closed", 412, now - timedelta(seconds=5)
            ),
            fig.DeadGroup(
                "resize", "worker exited with code -9 (SIGKILL) while running the job", 31, now - timedelta(seconds=35)
            ),
            fig.DeadGroup("report", "lease expired: sup-b stopped renewing it", 2, now - timedelta(minutes=14)),
        ),
        supervisors=(
            fig.Supervisor(
                "web-1:3077:a1",
                "web-1",
                3077,
                "0.1.0",
                ("default", "reports"),
                8,
                now - timedelta(minutes=42, seconds=7),
                0.4,
                "running",
                61_325,
                workers,
            ),
            fig.Supervisor(
                "web-2:1200:b2",
                "web-2",
                1200,
                "0.1.0",
                ("default",),
                4,
                now - timedelta(hours=3),
                48.0,
                "running",
                9_120,
                (),
            ),
        ),
        reaper_passes=(
            fig.ReaperPass(
                3,
                now - timedelta(minutes=1, seconds=12),
                "web-1:3077:a1",
                4,
                (8790, 8791, 8795, 8799),
                ("web-2:1200:b2",),
                1,
            ),
            fig.ReaperPass(2, now - timedelta(minutes=14), "web-1:3077:a1", 2, (8601, 8602), ("web-3:999:c3",), 0),
        ),
        reaped_per_minute=(0,) * 15 + (2,) + (0,) * 12 + (4, 0),
        latency=tuple(latency.summarize(fixed_latency_rows(step))),
        leases=tuple(
            fig.Lease(
                9000 + i,
                ("email", "report", "email", "resize", "email")[i],
                "web-1:3077:a1",
                1 + i % 2,
                28.5 - 3 * i - step,
            )
            for i in range(5)
        ),
        attempts=(("dead", 5, 445), ("queued", 0, 120 - step), ("queued", 2, 16), ("running", 1, 5)),
        done_last_minute=2_580 + 7 * step,
    )


def fixed_latency_rows(step: int) -> list[dict[str, Any]]:
    """Rows of latency_read: email waits longer in its last minute than before (rising); resize does not."""
    result = []
    for kind, lat, before, run_time, n in (
        ("email", 2.4, 0.08, 0.31, 120 + step),
        ("report", 0.9, 0.8, 12.5, 4),
        ("resize", 0.012, 0.011, 1.8, 40),
    ):
        for metric, seconds, earlier in (("queue_latency", lat, before), ("run_time", run_time, run_time)):
            for part, value, count in ((1, seconds, n), (5, earlier, n), (60, seconds, 3 * n), (60, earlier, 9 * n)):
                result.append(
                    {"kind": kind, "metric": metric, "bucket": latency.bucket(value), "part": part, "count": count}
                )
    return result


class FixedSource:
    """The console's data source reduced to a script of figures: the stand-in of the snapshot test."""

    read_only = False
    label = "postgresql://jobsup:***@db.example/jobsup"

    def __init__(self) -> None:
        self.step = 0

    async def refresh(self, match: str | None = None) -> fig.Figures:
        figures = fixed_figures(self.step)
        self.step += 1
        return figures

    async def schedules(self) -> list[Any]:
        return fixed_schedules()

    async def close(self) -> None:
        pass


# 160×48 shows the Jobs tab pinned above the Dead tab; 80×24 one tab at a time, each of them.
@pytest.mark.parametrize(
    "size, tab",
    [
        ((160, 48), None),
        ((80, 24), None),
        ((80, 24), "dead"),
        ((80, 24), "workers"),
        ((80, 24), "reaper"),
        ((80, 24), "latency"),
        ((160, 48), "latency"),
        ((120, 40), None),
        ((80, 24), "schedules"),
    ],
)
def test_snapshot_of_the_whole_screen(size, tab):
    async def scenario() -> None:
        app = TopApp(FixedSource(), refresh=3600, tz=UTC)  # type: ignore[arg-type]
        async with app.run_test(size=size) as pilot:
            for n in range(1, 7):  # six refreshes, a second apart by the fixed clock
                await until(pilot, lambda n=n: app.refreshes >= n, message=f"refresh {n}")
                if n < 6:
                    app.refresh_now()
            if tab == "schedules":  # a screen of its own, not a tab
                await pilot.press("s")
                await until(
                    pilot,
                    lambda: app.screen is not app.main and app.screen.panel.loads >= 1,  # type: ignore[attr-defined]
                    message="the schedules",
                )
            elif tab:
                app.action_show_tab(tab)
                await until(
                    pilot,
                    lambda: app.focused is app.query_one(f"#pane-{tab}", Pane).first_table(),
                    message=f"the {tab} tab",
                )
            await pilot.pause()
            text = await screen_text(pilot)
        path = SNAPSHOTS / f"top_{size[0]}x{size[1]}{'_' + tab if tab else ''}.txt"
        if UPDATE_SNAPSHOTS or not path.exists():
            path.parent.mkdir(exist_ok=True)
            path.write_text(text)
        assert text == path.read_text(), f"the screen differs from {path} (JOBSUP_UPDATE_SNAPSHOTS=1 rewrites it)"

    run(scenario)


# --- the header's figures, the keys, the footer, the layouts ------------------------------------------


def footer(text: str) -> str:
    return text.splitlines()[-1]


def test_done_per_minute_counts_the_jobs_done_in_the_last_60_seconds(conn, dsn):
    ids = client.enqueue_many(conn, [{"kind": "email"}] * 4)
    jobs = lifecycle.claim(conn, ["default"], 4, "sup-a", 30)
    lifecycle.complete(conn, [(j.id, j.attempts) for j in jobs], "sup-a")
    conn.execute("UPDATE jobsup.jobs SET done_at = now() - interval '2 minutes' WHERE id = %s", (ids[0],))

    async def scenario() -> None:
        app = app_for(dsn, refresh=3600)
        async with app.run_test(size=(160, 48)) as pilot:
            # The first refresh already knows: the figure comes from the database, not from what the
            # console saw since it opened.
            await until(pilot, lambda: app.refreshes >= 1, message="first refresh")
            text = await screen_text(pilot)
            assert "done/min 3 " in text and "~" not in text.splitlines()[1]

    run(scenario)


def test_the_help_screen_lists_every_key_of_every_panel():
    async def scenario() -> None:
        app = TopApp(FixedSource(), refresh=3600, tz=UTC)  # type: ignore[arg-type]
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.refreshes >= 1, message="first refresh")
            helps = app.key_help()
            described = {text for _, text in helps}
            for node in app.screen.walk_children():
                for binding in getattr(node, "BINDINGS", []):
                    if getattr(binding, "tooltip", ""):
                        assert binding.tooltip in described, binding
            assert ("w", "the next window of the latency table: the last 1m–2m, 5m–6m or 60m–70m") in helps
            await pilot.press("question_mark")
            await until(pilot, lambda: isinstance(app.screen, HelpScreen), message="the help screen")
            app.screen.query_one("#help").scroll_end(animate=False)
            assert "the next window of the latency table" in await screen_text(pilot)

    run(scenario)


def test_the_footer_offers_only_the_keys_that_apply():
    async def scenario() -> None:
        app = TopApp(FixedSource(), refresh=3600, tz=UTC)  # type: ignore[arg-type]
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.refreshes >= 1, message="first refresh")
            for tab in ("latency", "reaper", "workers"):
                app.action_show_tab(tab)
                await until(pilot, lambda tab=tab: app.focused is app.query_one(f"#pane-{tab}", Pane).first_table())
                assert "Requeue" not in footer(await screen_text(pilot)), tab
            app.action_show_tab("dead")
            await until(pilot, lambda: app.focused is app.query_one("#dead"), message="the Dead tab")
            assert "r Requeue  R Requeue all…" in footer(await screen_text(pilot))
            app.action_show_tab("jobs")
            await until(pilot, lambda: app.focused is app.query_one("#kinds"), message="the Jobs tab")
            line = footer(await screen_text(pilot))
            assert "R Requeue all…" in line and not re.search(r"(^|\s)r Requeue", line)
            await pilot.press("s")
            await until(pilot, lambda: app.screen is not app.main, message="the schedules")
            await pilot.pause(0.2)
            line = footer(await screen_text(pilot))
            assert "Requeue" not in line and "n Run now" in line

    run(scenario)


def test_a_filter_that_matches_no_dead_job_says_so(conn, dsn):
    make_dead(conn, "email", 8, "SMTP timeout")

    async def scenario() -> None:
        app = app_for(dsn)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: len(rows(app, "dead")) == 8, message="the dead jobs")
            await pilot.press("slash", *"xyz", "enter")
            await until(
                pilot, lambda: app.figures.match == "xyz" and not rows(app, "dead"), message="the filtered figures"
            )
            await pilot.pause(0.1)
            text = await screen_text(pilot)
            assert "Dead 0 of 8" in text and "no dead job matches 'xyz'" in text
            await pilot.press("escape")
            await until(pilot, lambda: len(rows(app, "dead")) == 8, message="the filter to clear")
            assert "Dead 8" in await screen_text(pilot) and " of 8" not in (await screen_text(pilot)).splitlines()[3]

    run(scenario)


def fixed_schedules() -> list[Any]:
    from jobsup.ops.schedules import ScheduleState

    return [
        ScheduleState(
            name=name,
            kind=kind,
            expression=expression,
            tz="Europe/Amsterdam",
            queue="default",
            priority=0,
            max_attempts=3,
            missed="skip",
            paused=name == "nightly-export",
            next_fire=NOW + timedelta(seconds=next_in),
            last_fire=NOW - timedelta(seconds=last_ago),
            last_job_id=8812 + i,
            last_status="done",
            seen_at=NOW,
            seen_by="web-1:3077:a1",
            state="paused" if name == "nightly-export" else "active",
            now=NOW,
        )
        for i, (name, kind, expression, next_in, last_ago) in enumerate(
            (
                ("digest", "email", "every 5m", 130, 170),
                ("nightly-export", "export", "0 2 * * *", 59_000, 27_400),
                ("cleanup-thumbnails", "resize", "*/15 * * * *", 400, 500),
            )
        )
    ]


def test_layouts_fit_at_80_and_120_columns():
    async def scenario() -> None:
        app = TopApp(FixedSource(), refresh=3600, tz=UTC)  # type: ignore[arg-type]
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.refreshes >= 1, message="first refresh")
            app.action_show_tab("latency")
            await until(pilot, lambda: app.focused is app.query_one("#latency"), message="the Latency tab")
            assert "q Quit" in footer(await screen_text(pilot))
            await pilot.press("s")
            await until(pilot, lambda: app.screen is not app.main and app.screen.panel.loads >= 1, message="schedules")
            await pilot.pause(0.1)
            text = await screen_text(pilot)
            assert "last job" in text and "8812 done" in text and "q Quit" in footer(text)
        app = TopApp(FixedSource(), refresh=3600, tz=UTC)  # type: ignore[arg-type]
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.refreshes >= 1, message="first refresh")
            await pilot.pause(0.1)
            header = next(line for line in (await screen_text(pilot)).splitlines() if "│ kind " in line)
            labels = header.split("│")[1].split()
            assert labels == ["kind", "ready", "sched", "run", "done", "failed", "dead", "canc"], header

    run(scenario)


def test_ctrl_c_quits():
    async def scenario() -> None:
        app = TopApp(FixedSource(), refresh=3600, tz=UTC)  # type: ignore[arg-type]
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.refreshes >= 1, message="first refresh")
            await pilot.press("ctrl+c")
            assert app._exit, "ctrl+c did not quit"  # exit() was called: the app is closing
            assert not any("quit" in n.message for n in app._notifications)

    run(scenario)


def test_the_console_draws_on_the_terminal_when_stderr_is_redirected(dsn, tmp_path):
    """`jobsup top 2>file`: the screen is still drawn on the terminal, the file gets none of it."""
    from .terminal import Terminal

    errors = tmp_path / "stderr"
    env = {**os.environ, "TERM": "xterm-256color"}
    with errors.open("w") as err:
        top = Terminal([sys.executable, "-m", "jobsup", "top", "--dsn", dsn], env, stderr=err)
    try:
        top.wait_for(b"supervisors", timeout=30)
        assert top.quit(b"q", timeout=30) == 0
    finally:
        top.close()
    assert "\x1b[" not in errors.read_text()


def test_the_latency_windows_are_named_for_what_they_cover():
    from rich.console import Console

    from jobsup.cli.stats import print_latency
    from jobsup.ops.snapshot import Snapshot

    assert [latency.window_label(w) for w in latency.WINDOWS] == ["1m–2m", "5m–6m", "60m–70m"]
    console = Console(file=io.StringIO(), width=120, record=True)
    snap = Snapshot(NOW, [], {}, [], [], latency=latency.summarize(fixed_latency_rows(0)))
    print_latency(snap, console)
    text = console.export_text()
    assert "latency and run time, last 1m–2m" in text and "last 60m–70m" in text

    async def scenario() -> None:
        app = TopApp(FixedSource(), refresh=3600, tz=UTC)  # type: ignore[arg-type]
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.refreshes >= 1, message="first refresh")
            assert "last 1m–2m (w)" in str(app.query_one("#latency-panel").border_title)

    run(scenario)


def test_ready_jobs_no_live_supervisor_can_run_are_named(conn, dsn):
    client.enqueue_many(conn, [{"kind": "a", "queue": "mix"}, *[{"kind": "c", "queue": "mix"}] * 5])
    client.enqueue(conn, "c", {}, queue="other")  # no supervisor serves queue other at all
    conn.execute("UPDATE jobsup.jobs SET run_at = now() - interval '75 seconds' WHERE kind = 'c' AND queue = 'mix'")
    fake_supervisor(conn, "sup-a", 4242, [], queues=["mix"], kinds=["a", "b"])
    # A supervisor that would serve kind c is stopping, another one's heartbeat is old: neither serves.
    fake_supervisor(conn, "sup-b", 4243, [], queues=["mix"], kinds=["c"], state="stopping")
    fake_supervisor(conn, "sup-c", 4244, [], queues=["mix"], kinds=None, heartbeat_ago=60)

    async def scenario() -> None:
        app = app_for(dsn, stale_after=30)
        async with app.run_test(size=(160, 48)) as pilot:
            await until(pilot, lambda: app.refreshes >= 1, message="first refresh")
            await pilot.pause(0.1)
            text = await screen_text(pilot)
            assert re.search(r"unserved: kind c in queue mix, 5 ready, oldest 1m1\ds", text), text
            assert "kind c in queue other, 1 ready" in text and "kind a in" not in text
            assert rows(app, "kinds")["c"][0] == "c ✖"
            assert rows(app, "kinds")["a"][0] == "a"
            # One that serves kind c turns up: the note goes.
            fake_supervisor(conn, "sup-d", 4245, [], queues=["mix", "other"], kinds=["c"])
            await until(pilot, lambda: not app.figures.unserved(app.stale_after), message="the note to go")
            assert "unserved" not in await screen_text(pilot)

    run(scenario)


def test_the_header_says_how_many_running_jobs_have_not_started(dsn, conn):
    """Jobs handed to a worker behind the one it runs are running rows (a limit counts them) but have
    not started: the header says how many, from the supervisors' heartbeats."""
    fake_supervisor(conn, "sup-a", 4242, [{"pid": 7, "state": "busy", "job_id": 1, "kind": "email", "behind": [2, 3]}])

    async def scenario() -> None:
        app = app_for(dsn, stale_after=30)
        async with app.run_test(size=(160, 48)) as pilot:
            await until(pilot, lambda: app.refreshes >= 1, message="first refresh")
            assert "running 0 (2 not started)" in await screen_text(pilot)

    run(scenario)
