"""The console's control keys: c cancels the selected worker's job, P / U pause and resume the
selected queue, each asked first and refused in --read-only; the kinds table counts cancelled jobs."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from jobsup import client
from jobsup.db import lifecycle
from jobsup.monitor import panels
from jobsup.monitor.schedules import ConfirmSchedule

from .console_helpers import app_for, fake_supervisor, rows, run, screen_text, select, until

pytestmark = pytest.mark.slow  # the console driven by the Pilot takes seconds a test


async def select_queue(pilot, name: str) -> None:
    """The queues table is the second of the Jobs tab, which focuses its first (the kinds) on showing."""
    app = pilot.app
    await until(pilot, lambda: app.focused is not None and app.focused.id == "kinds", message="the Jobs tab")
    await pilot.pause(0.1)
    table = app.query_one("#queues")
    table.focus()
    table.move_cursor(row=table.get_row_index(name))
    await until(
        pilot,
        lambda: app.focused is table and panels.selected_key(table) == name,
        message=f"the cursor on queue {name}",
    )


def test_c_cancels_the_selected_workers_job_after_asking(conn, dsn):
    [job_id] = client.enqueue_many(conn, [{"kind": "report"}])
    lifecycle.claim(conn, ["default"], 1, "sup-a", 60)  # running under sup-a, whose heartbeat we write
    fake_supervisor(
        conn,
        "sup-a",
        4242,
        [
            {
                "pid": 501,
                "state": "busy",
                "job_id": job_id,
                "kind": "report",
                "job_started_at": datetime.now(UTC).isoformat(),
                "rss": 1,
                "cpu": 0.0,
                "jobs_done": 0,
                "restarts": 0,
            }
        ],
    )

    async def scenario() -> None:
        app = app_for(dsn, stale_after=60)
        async with app.run_test(size=(80, 24)) as pilot:
            key = f"sup-a\x00501\x00{job_id}"
            await until(pilot, lambda: key in rows(app, "workers"), message="the busy worker")
            await select(pilot, "workers", key)
            footer = (await screen_text(pilot)).splitlines()[-1]
            assert "c Cancel job…" in footer and "q Quit" in footer
            await pilot.press("c")
            confirm = await until(
                pilot, lambda: app.screen if isinstance(app.screen, ConfirmSchedule) else None, message="the question"
            )
            assert confirm.question == f"Cancel job {job_id}?"
            await pilot.press("enter")  # No is focused: nothing happens
            await until(pilot, lambda: not isinstance(app.screen, ConfirmSchedule), message="the dialog to close")
            assert conn.execute("SELECT cancelled_by FROM jobsup.jobs WHERE id = %s", (job_id,)).fetchone() == (None,)
            await pilot.press("c")
            await until(pilot, lambda: isinstance(app.screen, ConfirmSchedule), message="the question")
            await pilot.press("y")
            await until(
                pilot,
                lambda: conn.execute("SELECT cancelled_by FROM jobsup.jobs WHERE id = %s", (job_id,)).fetchone()[0],
                message="the cancel request",
            )
            await until(
                pilot,
                lambda: any("cancel requested" in n.message for n in app._notifications),
                message="the notification",
            )

    run(scenario)


def test_p_and_u_pause_and_resume_the_selected_queue(conn, dsn):
    client.enqueue_many(conn, [{"kind": "email", "queue": "mail"}])

    async def scenario() -> None:
        app = app_for(dsn)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: "mail" in rows(app, "queues"), message="the queue")
            await select_queue(pilot, "mail")
            footer = (await screen_text(pilot)).splitlines()[-1]
            assert "P Pause queue…" in footer and "U Resume queue…" in footer and "q Quit" in footer
            await pilot.press("P")
            await until(pilot, lambda: isinstance(app.screen, ConfirmSchedule), message="the question")
            assert app.screen.question == "Pause queue mail?"
            await pilot.press("y")
            await until(
                pilot,
                lambda: (
                    conn.execute("SELECT count(*) FROM jobsup.queue_pauses WHERE queue = 'mail'").fetchone()[0] == 1
                ),
                message="the pause",
            )
            await until(pilot, lambda: rows(app, "queues")["mail"][0] == "mail paused", message="the mark")
            await pilot.press("U")
            await until(pilot, lambda: isinstance(app.screen, ConfirmSchedule), message="the question")
            await pilot.press("y")
            await until(
                pilot,
                lambda: conn.execute("SELECT count(*) FROM jobsup.queue_pauses").fetchone()[0] == 0,
                message="the resume",
            )

    run(scenario)


def test_read_only_refuses_the_control_keys(conn, dsn):
    client.enqueue_many(conn, [{"kind": "email", "queue": "mail"}])

    async def scenario() -> None:
        app = app_for(dsn, read_only=True)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: "mail" in rows(app, "queues"), message="the queue")
            await select_queue(pilot, "mail")
            assert "Pause queue" not in await screen_text(pilot)
            await pilot.press("P", "U", "c")
            await pilot.pause(0.1)
            assert not isinstance(app.screen, ConfirmSchedule)
            assert any("read-only" in n.message for n in app._notifications)
            assert conn.execute("SELECT count(*) FROM jobsup.queue_pauses").fetchone()[0] == 0
            helps = " ".join(text for _, text in app.key_help())
            assert "pause the selected queue" not in helps and "cancel the selected" not in helps

    run(scenario)


def test_the_kinds_table_counts_cancelled_jobs(conn, dsn):
    ids = client.enqueue_many(conn, [{"kind": "email"}] * 3)
    from jobsup.ops.control import cancel

    cancel(conn, ids=ids[:2])

    async def scenario() -> None:
        app = app_for(dsn)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: rows(app, "kinds").get("email", [""])[-1] == "2", message="the count")
            assert rows(app, "kinds")["email"][1] == "1"  # the one still ready

    run(scenario)
