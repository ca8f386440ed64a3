"""Schedules (app.every): fire times and DST by computation, then real supervisors against a real
PostgreSQL firing millisecond-scale intervals (tests/apps/cron.py)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import psycopg
import pytest

from jobsup import App
from jobsup.db.sql import STATEMENTS as SQL
from jobsup.errors import BadInput
from jobsup.schedule import Schedule
from jobsup.supervisor.scheduler import choose

from .helpers import cli_env, jobsup, wait_for

APP = "tests.apps.cron:app"


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def fires_on(schedule: Schedule, start: str, end: str) -> list[str]:
    found = []
    for moment in schedule.fires_after(utc(start)):
        if moment >= utc(end):
            return found
        found.append(moment.strftime("%Y-%m-%dT%H:%M"))
    raise AssertionError("unreachable")


# --- fire times, by computation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "tz, expression, start, end, expected",
    [
        # Berlin springs forward 2026-03-29 at 02:00 CET: 02:30 does not exist; it fires at 03:00 CEST.
        (
            "Europe/Berlin",
            "30 2 * * *",
            "2026-03-28T12:00",
            "2026-03-30T12:00",
            ["2026-03-29T01:00", "2026-03-30T00:30"],
        ),
        # Berlin falls back 2026-10-25 at 03:00 CEST: 02:30 happens twice; it fires once, at the first (CEST).
        (
            "Europe/Berlin",
            "30 2 * * *",
            "2026-10-24T12:00",
            "2026-10-26T12:00",
            ["2026-10-25T00:30", "2026-10-26T01:30"],
        ),
        # New York springs forward 2026-03-08 at 02:00 EST: 02:30 fires at 03:00 EDT.
        (
            "America/New_York",
            "30 2 * * *",
            "2026-03-07T12:00",
            "2026-03-09T12:00",
            ["2026-03-08T07:00", "2026-03-09T06:30"],
        ),
        # New York falls back 2026-11-01 at 02:00 EDT: 02:30 is not repeated there (01:30 is), so one fire...
        (
            "America/New_York",
            "30 2 * * *",
            "2026-10-31T12:00",
            "2026-11-02T12:00",
            ["2026-11-01T07:30", "2026-11-02T07:30"],
        ),
        # ... and the repeated 01:30 fires once, at its first (EDT) occurrence.
        (
            "America/New_York",
            "30 1 * * *",
            "2026-10-31T12:00",
            "2026-11-02T12:00",
            ["2026-11-01T05:30", "2026-11-02T06:30"],
        ),
    ],
)
def test_a_daily_fire_happens_once_on_both_dst_days(tz, expression, start, end, expected):
    assert fires_on(Schedule("daily", "tick", expression, tz=tz), start, end) == expected


def test_an_hourly_schedule_follows_real_time_across_dst():
    hourly = Schedule("hourly", "tick", "30 * * * *", tz="Europe/Berlin")
    # The local day has 23 hours in spring and 25 in autumn, and a fire in each of them.
    assert len(fires_on(hourly, "2026-03-28T23:00", "2026-03-29T22:00")) == 23
    autumn = fires_on(hourly, "2026-10-24T22:00", "2026-10-25T23:00")
    assert len(autumn) == 25 and autumn[:4] == [
        "2026-10-24T22:30",
        "2026-10-24T23:30",
        "2026-10-25T00:30",
        "2026-10-25T01:30",
    ]


def test_intervals_fall_on_multiples_of_the_interval_since_the_epoch():
    every = Schedule("fast", "tick", "250ms")
    start = utc("2026-12-01T10:00:00.100000")
    fires = every.fires_after(start)
    assert [next(fires).isoformat() for _ in range(3)] == [
        "2026-12-01T10:00:00.250000+00:00",
        "2026-12-01T10:00:00.500000+00:00",
        "2026-12-01T10:00:00.750000+00:00",
    ]
    assert Schedule("s", "tick", "@hourly").next_fire(start) == utc("2026-12-01T11:00")


def test_the_missed_fire_policies_choose_from_the_fires_due():
    after, now = utc("2026-12-01T10:00"), utc("2026-12-01T10:10:30")
    for missed, expected in (("latest", 1), ("none", 0), ("all", 10)):
        schedule = Schedule("m", "tick", "* * * * *", missed=missed)
        due, _ = schedule.due(after, now, 1000)
        assert len(due) == 10 and due[-1] == utc("2026-12-01T10:10")
        assert choose(schedule, due, catch_up=True) == due[len(due) - expected :]
        assert choose(schedule, due, catch_up=False) == due  # on time: every fire
    capped = Schedule("m", "tick", "* * * * *", missed="all", missed_limit=3)
    assert choose(capped, capped.due(after, now, 1000)[0], catch_up=True) == [
        utc("2026-12-01T10:08"),
        utc("2026-12-01T10:09"),
        utc("2026-12-01T10:10"),
    ]
    # A year away costs little and still finds the latest fire.
    due, more = capped.due(utc("2025-12-01T10:00"), now, 1)
    assert due == [utc("2026-12-01T10:10")] and more


# --- bad input ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, kwargs, says",
    [
        (("tick", "61 * * * *"), {}, "schedule 'tick': bad cron expression '61 * * * *'"),
        (("tick", "* * *"), {}, "schedule 'tick': bad cron expression '* * *': five fields"),
        (("tick", "@daily"), {"tz": "Europe/Atlantis"}, "schedule 'tick': unknown time zone 'Europe/Atlantis'"),
        (("tick", "0s"), {}, "schedule 'tick': the interval '0s' must be more than 0"),
        (("tick", -5), {}, "schedule 'tick': the interval '-5' must be more than 0"),
        (("tick", "30s"), {"missed": "some"}, "schedule 'tick': missed must be one of latest, none, all"),
        (("tick", "30s"), {"payload": {"fire_at": 1}}, "schedule 'tick': payload cannot use the keys"),
    ],
)
def test_a_bad_schedule_is_refused_with_one_line_naming_it(args, kwargs, says):
    with pytest.raises(BadInput) as caught:
        App().every(*args, **kwargs)
    assert str(caught.value).startswith(says) and "\n" not in str(caught.value)


def test_two_schedules_with_one_name_are_refused():
    app = App()
    app.every("tick", "30s")
    app.every("tick", "@daily", name="daily-tick")  # a second schedule of the same kind, named
    with pytest.raises(BadInput, match="schedule 'tick': two schedules with this name"):
        app.every("tick", "1m")


@pytest.mark.slow  # `jobsup start` in a subprocess
@pytest.mark.parametrize("bad", ["cron", "tz", "interval", "duplicate"])
def test_start_exits_3_when_a_schedule_is_bad(dsn, bad):
    result = jobsup("start", "--dsn", dsn, "--app", APP, "--procs", "1", env=cli_env(CRON_APP_BAD=bad))
    assert result.returncode == 3, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("jobsup: error")]
    assert len(errors) == 1 and ("'broken'" in errors[0] or "'minutely'" in errors[0]), result.stderr


# --- supervisors firing -------------------------------------------------------------------------------


def make_calls(conn: psycopg.Connection) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS cron_calls (job_id bigint, fire_at timestamptz, started timestamptz)")


def fires(conn: psycopg.Connection, schedule: str) -> list[datetime]:
    """The fire times of the schedule's jobs (not those of `cron run`), one per job, ascending."""
    return [
        row[0]
        for row in conn.execute(
            "SELECT (payload->>'fire_at')::timestamptz FROM jobsup.jobs WHERE payload->>'schedule' = %s"
            " AND NOT payload ? 'manual' ORDER BY 1",
            (schedule,),
        )
    ]


def db_now(conn: psycopg.Connection) -> datetime:
    return conn.execute("SELECT now()").fetchone()[0]


def declare(conn: psycopg.Connection, schedule: Schedule, fired_through: datetime | None = None) -> None:
    conn.execute(
        SQL["schedule_declare"],
        {
            "name": schedule.name,
            "kind": schedule.kind,
            "expression": schedule.expression,
            "tz": schedule.tz,
            "payload": "{}",
            "queue": schedule.queue,
            "priority": schedule.priority,
            "max_attempts": schedule.max_attempts,
            "missed": schedule.missed,
        },
    )
    if fired_through is not None:
        conn.execute("UPDATE jobsup.schedules SET fired_through = %s WHERE name = %s", (fired_through, schedule.name))


def assert_every_fire_once(times: list[datetime], step: timedelta) -> None:
    assert len(times) == len(set(times)), "a fire was enqueued twice"
    gaps = [b - a for a, b in pairwise(times) if b - a != step]
    assert not gaps, f"fires missing between {times[0]} and {times[-1]}: gaps {gaps}"


def test_three_supervisors_enqueue_each_fire_exactly_once(conn, dsn, start):
    make_calls(conn)
    # The minutely cron last fired five minutes ago, as if every supervisor had been away: the three
    # start together and must enqueue each of those fires (missed="all") once between them.
    seeded = db_now(conn).replace(second=0, microsecond=0) - timedelta(minutes=5, seconds=1)
    declare(conn, Schedule("minutely", "tick", "* * * * *", missed="all"), fired_through=seeded)
    env = {"CRON_APP_INTERVAL": "200ms"}
    sups = [start("--procs", "1", app=APP, env=env) for _ in range(3)]
    for sup in sups:
        sup.wait_log("scheduler.started")
    began = db_now(conn)
    wait_for(lambda: db_now(conn) > began + timedelta(seconds=6), timeout=30, message="6 s of fires")
    # No fire while they stop: a stopping supervisor claims nothing more, and a fire its own scheduler
    # enqueued after that would stay queued for the next one to start.
    for name in ("tick", "minutely"):
        assert jobsup("cron", "pause", name, "--dsn", dsn).returncode == 0
    not_done = "SELECT count(*) FROM jobsup.jobs WHERE status <> 'done'"
    wait_for(lambda: conn.execute(not_done).fetchone()[0] == 0, timeout=30, message="every fire run")
    for sup in sups:
        assert sup.stop() == 0, sup.log()
    ticks = fires(conn, "tick")
    assert len(ticks) >= 30  # 6 s of 200 ms fires, and those before `began`
    assert_every_fire_once(ticks, timedelta(milliseconds=200))
    minutes = fires(conn, "minutely")
    assert minutes[:5] == [seeded + timedelta(seconds=1, minutes=n) for n in range(5)]
    assert_every_fire_once(minutes, timedelta(minutes=1))
    # Every fire was an ordinary job that ran.
    assert conn.execute(not_done).fetchone()[0] == 0


@pytest.mark.parametrize("missed", ["latest", "none", "all"])
def test_a_restarted_supervisor_enqueues_what_the_missed_fire_policy_says(conn, dsn, start, missed):
    make_calls(conn)
    step = timedelta(milliseconds=300)
    env = {"CRON_APP_INTERVAL": "300ms", "CRON_APP_MISSED": missed}
    first = start("--procs", "1", app=APP, env=env)
    wait_for(lambda: len(fires(conn, "tick")) >= 2, timeout=30, message="two fires")
    assert first.stop() == 0, first.log()
    (stopped_through,) = conn.execute("SELECT fired_through FROM jobsup.schedules WHERE name = 'tick'").fetchone()
    before = fires(conn, "tick")
    wait_for(lambda: db_now(conn) > stopped_through + 5.5 * step, timeout=30, message="five fires missed")
    second = start("--procs", "1", app=APP, env=env)
    line = wait_for(
        lambda: next(
            (line for line in second.log().splitlines() if "schedule.missed" in line and "schedule=tick" in line), None
        ),
        timeout=30,
        message="the restarted supervisor's catch-up",
    )
    caught_up_to = datetime.fromisoformat(re.search(r"through=(\S+)", line).group(1))
    missed_count = int(re.search(r"missed=(\d+)", line).group(1))
    wait_for(lambda: fires(conn, "tick")[-1] > caught_up_to, timeout=30, message="a fire after the restart")
    assert second.stop() == 0, second.log()

    grid = Schedule("tick", "tick", "300ms").due(stopped_through, caught_up_to, 1000)[0]
    assert len(grid) == missed_count >= 5
    caught = [t for t in fires(conn, "tick") if stopped_through < t <= caught_up_to]
    assert caught == {"none": [], "latest": grid[-1:], "all": grid}[missed]
    assert fires(conn, "tick")[: len(before)] == before
    after = [t for t in fires(conn, "tick") if t > caught_up_to]
    assert_every_fire_once(after, step)  # and on time again from there on


def test_a_changed_expression_counts_from_the_start_that_brings_it(conn, dsn, start):
    make_calls(conn)
    # The database knows `tick` as a 1s schedule that last fired a minute ago; the app now says 200ms,
    # missed="all": the 300 fires of the last minute under the new expression were never due.
    declare(conn, Schedule("tick", "tick", "1s", missed="all"), fired_through=db_now(conn) - timedelta(minutes=1))
    sup = start("--procs", "1", app=APP, env={"CRON_APP_INTERVAL": "200ms", "CRON_APP_MISSED": "all"})
    sup.wait_log("scheduler.started")
    wait_for(lambda: len(fires(conn, "tick")) >= 3, timeout=30, message="fires of the new expression")
    (expression, declared_at) = conn.execute(
        "SELECT expression, declared_at FROM jobsup.schedules WHERE name = 'tick'"
    ).fetchone()
    assert sup.stop() == 0, sup.log()
    assert expression == "200ms"
    assert fires(conn, "tick")[0] > declared_at
    assert_every_fire_once(fires(conn, "tick"), timedelta(milliseconds=200))


def test_pause_resume_and_run_from_the_cli(conn, dsn, start):
    make_calls(conn)
    declare(conn, Schedule("gone", "tick", "200ms"), fired_through=db_now(conn) - timedelta(minutes=1))
    env = {"CRON_APP_INTERVAL": "200ms"}
    sups = [start("--procs", "1", app=APP, env=env) for _ in range(2)]
    wait_for(lambda: len(fires(conn, "tick")) >= 3, timeout=30, message="fires")
    for sup in sups:
        sup.wait_log("scheduler.started")

    result = jobsup("cron", "pause", "tick", "--dsn", dsn)
    assert result.returncode == 0 and result.stdout.strip() == "paused schedule tick", result
    paused_at = db_now(conn)
    # Obeyed at once: the fire that would follow the pause reads the flag in its own transaction.
    wait_for(lambda: db_now(conn) > paused_at + timedelta(seconds=2), timeout=30)
    assert fires(conn, "tick")[-1] <= paused_at
    listed = {s["name"]: s for s in json.loads(jobsup("cron", "--json", "--dsn", dsn).stdout)}
    assert listed["tick"]["state"] == "paused" and listed["tick"]["paused"] is True
    assert (
        jobsup("cron", "pause", "tick", "--dsn", dsn).stdout.strip()
        == "schedule tick was already paused (nothing changed)"
    )

    result = jobsup("cron", "resume", "tick", "--dsn", dsn)
    assert result.returncode == 0 and result.stdout.strip() == "resumed schedule tick", result
    resumed_at = db_now(conn)
    wait_for(lambda: fires(conn, "tick")[-1] > resumed_at, timeout=10, message="a fire after resume")
    (created,) = conn.execute(
        "SELECT min(created_at) FROM jobsup.jobs WHERE payload->>'schedule' = 'tick' "
        "AND (payload->>'fire_at')::timestamptz > %s",
        (resumed_at,),
    ).fetchone()
    assert created - resumed_at < timedelta(seconds=2)

    # cron run: exactly one job now (of the orphaned schedule, which nothing else fires).
    result = jobsup("cron", "run", "gone", "--dsn", dsn)
    assert result.returncode == 0, result
    job_id = int(result.stdout.split()[-1])
    runs = conn.execute("SELECT id, kind, payload FROM jobsup.jobs WHERE payload ? 'manual'").fetchall()
    assert [(r[0], r[1], r[2]["schedule"]) for r in runs] == [(job_id, "tick", "gone")]
    result = jobsup("cron", "run", "nosuch", "--dsn", dsn)
    assert (
        result.returncode == 2
        and result.stderr.strip() == "jobsup: error: no schedule named 'nosuch' (jobsup cron lists them)"
    )

    # A schedule that no running app declares is shown as orphaned and never fired.
    listed = {s["name"]: s for s in json.loads(jobsup("cron", "--json", "--dsn", dsn).stdout)}
    assert listed["gone"]["state"] == "orphaned" and listed["tick"]["state"] == "active"
    assert listed["gone"]["last_job_id"] == job_id and listed["gone"]["last_status"] in ("queued", "running", "done")
    assert fires(conn, "gone") == []
    table = jobsup("cron", "--dsn", dsn).stdout
    assert "orphaned" in table and "paused" not in table
    for sup in sups:
        assert sup.stop() == 0, sup.log()


# --- the console ------------------------------------------------------------------------------------


def test_the_console_runs_pauses_and_resumes_a_schedule(conn, dsn, start):
    import asyncio

    from textual.widgets import DataTable

    from jobsup.monitor.app import TopApp
    from jobsup.monitor.schedules import ConfirmSchedule, SchedulesScreen, rows
    from jobsup.monitor.source import Source

    from .helpers import wait_for_async

    make_calls(conn)
    sup = start("--procs", "1", app=APP, env={"CRON_APP_INTERVAL": "200ms"})
    wait_for(lambda: len(fires(conn, "tick")) >= 2, timeout=30, message="fires")

    def paused() -> bool:
        return conn.execute("SELECT paused FROM jobsup.schedules WHERE name = 'tick'").fetchone()[0]

    async def scenario(read_only: bool) -> None:
        app = TopApp(Source(dsn), refresh=0.2, read_only=read_only)
        async with app.run_test(size=(120, 30)) as pilot:

            async def until(condition, timeout=15.0, message="condition"):
                return await wait_for_async(condition, pilot.pause, timeout, message=message)

            await pilot.press("s")
            panel = await until(lambda: isinstance(app.screen, SchedulesScreen) and app.screen.panel)
            await until(lambda: panel.loads and {s.name for s in panel.schedules} == {"tick", "minutely"})
            table = panel.query_one(DataTable)
            table.move_cursor(row=table.get_row_index("tick"))
            await until(lambda: panel.selected() == "tick")
            if read_only:  # the keys are hidden, and pressed anyway they change nothing
                assert panel.check_action("schedule", ("pause",)) is False and panel.border_subtitle == ""
                for key in "PUn":
                    await pilot.press(key)
                await pilot.pause(0.3)
                assert isinstance(app.screen, SchedulesScreen) and not paused()
                return

            await pilot.press("P")
            await until(lambda: isinstance(app.screen, ConfirmSchedule), message="the question")
            await pilot.press("y")
            await until(paused, message="paused in the database")
            paused_at = db_now(conn)
            await until(lambda: db_now(conn) > paused_at + timedelta(seconds=2), message="2 s")
            assert fires(conn, "tick")[-1] <= paused_at
            await until(lambda: dict(rows(panel.schedules))["tick"][4].plain == "paused", message="shown paused")

            await pilot.press("U")
            await until(lambda: isinstance(app.screen, ConfirmSchedule))
            await pilot.press("y")
            await until(lambda: not paused(), message="resumed in the database")
            resumed_at = db_now(conn)
            await until(lambda: fires(conn, "tick")[-1] > resumed_at, timeout=2.0, message="a fire within 2 s")

            await pilot.press("n")
            await until(lambda: isinstance(app.screen, ConfirmSchedule))
            await pilot.press("n")  # No: nothing happens
            await until(lambda: isinstance(app.screen, SchedulesScreen))
            await pilot.press("n")
            await until(lambda: isinstance(app.screen, ConfirmSchedule))
            await pilot.press("y")
            await until(
                lambda: conn.execute("SELECT count(*) FROM jobsup.jobs WHERE payload ? 'manual'").fetchone()[0] == 1,
                message="one job run now",
            )

    asyncio.run(scenario(read_only=False))
    asyncio.run(scenario(read_only=True))
    assert conn.execute("SELECT count(*) FROM jobsup.jobs WHERE payload ? 'manual'").fetchone()[0] == 1
    assert sup.stop() == 0, sup.log()
