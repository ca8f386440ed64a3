"""The console's Limits tab against a real PostgreSQL: each limited kind with what it holds, its starts,
what waits and for how long, its busiest keys; L changes a kind's limits after asking (refused in
--read-only); Enter opens a kind's or key's next throttled job, whose screen shows its key and why it
waits."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from jobsup import client
from jobsup.db import lifecycle
from jobsup.monitor import formats as fmt
from jobsup.monitor.limits_panels import LimitInput
from jobsup.monitor.schedules import ConfirmSchedule
from jobsup.monitor.screens import JobScreen
from jobsup.monitor.source import ReadOnly, Source
from jobsup.ops.limits import set_limits

from .console_helpers import app_for, rows, run, screen_text, select, until

pytestmark = pytest.mark.slow  # the console driven by the Pilot takes seconds a test

IN_FORCE = "concurrency 2, rate 50/m (burst 5), key_concurrency 1"


def charge_backlog(conn: psycopg.Connection) -> list:
    """Kind charge limited to 2 at once and 1 per key: 2 jobs held (keys a and b), the rest throttled."""
    set_limits(conn, "charge", "alice@box", concurrency=2, rate="50/m", burst=5, key_concurrency=1)
    long_ago = datetime.now(UTC) - timedelta(minutes=10)
    client.enqueue_many(conn, [{"kind": "charge", "key": "a", "run_at": long_ago}] * 3)
    client.enqueue_many(conn, [{"kind": "charge", "key": "b"}] * 5 + [{"kind": "charge", "key": "c"}] * 2)
    client.enqueue(conn, "email", {})  # a kind without limits: not in the tab
    jobs, _ = lifecycle.claim_limited(conn, ["charge"], ["default"], 10, "sup-a", 60)
    assert sorted(j.key for j in jobs) == ["a", "b"]
    return jobs


def tab_bar(text: str) -> str:
    return next(line for line in text.splitlines() if "1 Jobs" in line)


def limits_row(conn: psycopg.Connection, kind: str) -> tuple:
    return conn.execute(
        "SELECT concurrency, rate, key_concurrency, set_by FROM jobsup.limits WHERE kind = %s", (kind,)
    ).fetchone()


def test_the_limits_tab_shows_each_limited_kind_and_its_busiest_keys(conn, dsn):
    charge_backlog(conn)

    async def scenario() -> None:
        app = app_for(dsn)
        async with app.run_test(size=(160, 48)) as pilot:
            await until(pilot, lambda: "charge" in rows(app, "limits"), message="the limited kind")
            await pilot.press("6")
            await until(pilot, lambda: app.focused is app.query_one("#limits"), message="the Limits tab")
            table = rows(app, "limits")
            # held of concurrency, starts of the rate, throttled (ready, held back by the limits: here
            # the kind's concurrency), startable (ready, allowed: none at 2 of 2), the oldest for
            kind, held, starts, throttled, startable, oldest, limits = table["charge"]
            assert (kind, held, starts, throttled, startable) == ("charge", "2 of 2", "2 of 50/m", "8", "0")
            assert oldest.startswith("10m") and limits == IN_FORCE
            # The busiest keys, by held then throttled: a and b hold their one slot each.
            keys = [k for k in table if k.startswith("charge\x00")]
            assert keys == ["charge\x00b", "charge\x00a", "charge\x00c"]
            assert table["charge\x00b"][:4] == ["  b", "1 of 1", "1 in 1m", "4"]
            assert table["charge\x00a"][3] == "2" and table["charge\x00a"][5] == oldest  # a's jobs are the oldest
            assert "email" not in table
            text = await screen_text(pilot)
            assert "[6 Limits 8]" in text  # the tab bar's badge: jobs throttled; the Jobs tab stays above it
            assert "jobs by kind" in text
            detail = str(app.query_one("#limit-detail").render())  # the selected kind's limits in full
            assert detail == f"charge: {IN_FORCE} · set by alice@box"
            assert "L Limits…" in text.splitlines()[-1]

    run(scenario)


def test_the_tab_joins_the_bar_and_tabs_round_once_a_kind_has_a_limit(conn, dsn):
    # Two ready: a limit of 1 lets one start (startable), and holds the other back (throttled).
    client.enqueue_many(conn, [{"kind": "charge", "key": k} for k in "ab"])

    async def scenario() -> None:
        app = app_for(dsn)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.refreshes >= 1, message="first refresh")
            await pilot.pause(0.1)
            assert "Limits" not in tab_bar(await screen_text(pilot))
            await pilot.press("6")  # its key shows it all the same, saying why it is empty
            await until(pilot, lambda: app.focused is app.query_one("#limits"), message="the Limits tab")
            assert "no kind has a limit" in await screen_text(pilot)
            await pilot.press("1")
            await until(pilot, lambda: app.focused is app.query_one("#kinds"), message="the Jobs tab")
            set_limits(conn, "charge", "alice@box", concurrency=1)
            await until(pilot, lambda: "charge" in rows(app, "limits"), message="the limited kind")
            await pilot.pause(0.1)
            text = await screen_text(pilot)
            assert "6 Limits 1" in tab_bar(text)
            # Below 120 columns the limits in words leave the table for the line under it.
            assert len(rows(app, "limits")["charge"]) == 6
            assert str(app.query_one("#limit-detail").render()) == "charge: concurrency 1 · set by alice@box"
            await pilot.press("shift+tab")  # back from the first panel: the last panel of the last tab
            await until(pilot, lambda: app.focused is app.query_one("#limits"), message="Tab reaching the tab")

    run(scenario)


def test_L_sets_the_limits_typed_after_asking_and_resets_them(conn, dsn):
    charge_backlog(conn)

    async def scenario() -> None:
        app = app_for(dsn)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: "charge\x00c" in rows(app, "limits"), message="the limited kind")
            await select(pilot, "limits", "charge\x00c")  # a key's row acts on its kind
            await pilot.press("L")
            box = await until(
                pilot, lambda: app.screen if isinstance(app.screen, LimitInput) else None, message="the input"
            )
            field = box.query_one("#limit-text")
            assert field.value == "concurrency=2 rate=50/m burst=5 key_concurrency=1"  # in force, to edit
            field.value = "concurrency=3 rate=10/x"
            await pilot.press("enter")  # a bad value: said in the input, which stays open
            await until(pilot, lambda: "10/x" in str(box.query_one("#limit-error").render()), message="the error")
            assert isinstance(app.screen, LimitInput)
            field.value = "concurrency=3, rate=none"
            await pilot.press("enter")
            confirm = await until(
                pilot, lambda: app.screen if isinstance(app.screen, ConfirmSchedule) else None, message="the question"
            )
            assert confirm.question == "Set the limits of kind charge?"
            assert "Then: concurrency 3, key_concurrency 1." in confirm.detail
            await pilot.press("enter")  # No is focused: nothing changes
            await until(pilot, lambda: app.screen is app.main, message="the dialog to close")
            assert limits_row(conn, "charge") == (2, 50, 1, "alice@box")

            await pilot.press("L")
            await until(pilot, lambda: isinstance(app.screen, LimitInput), message="the input")
            app.screen.query_one("#limit-text").value = "concurrency=3 rate=none"
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, ConfirmSchedule), message="the question")
            await pilot.press("y")
            await until(pilot, lambda: limits_row(conn, "charge")[:3] == (3, None, 1), message="the new limits")
            assert limits_row(conn, "charge")[3] not in (None, "alice@box")  # who did it: this console's user
            await until(pilot, lambda: rows(app, "limits")["charge"][1] == "2 of 3", message="the new limit shown")

            # reset: the app's declaration (none here), so the kind is no longer limited.
            await pilot.press("L")
            await until(pilot, lambda: isinstance(app.screen, LimitInput), message="the input")
            app.screen.query_one("#limit-text").value = "reset"
            await pilot.press("enter")
            confirm = await until(
                pilot, lambda: app.screen if isinstance(app.screen, ConfirmSchedule) else None, message="the question"
            )
            assert confirm.question == "Reset the limits of kind charge?" and "no longer limited" in confirm.detail
            await pilot.press("y")
            await until(pilot, lambda: "charge" not in rows(app, "limits"), message="the kind to leave the tab")
            assert conn.execute("SELECT count(*) FROM jobsup.jobs WHERE limited").fetchone()[0] == 0

    run(scenario)


def test_read_only_refuses_L(conn, dsn):
    charge_backlog(conn)

    async def scenario() -> None:
        app = app_for(dsn, read_only=True)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: "charge" in rows(app, "limits"), message="the limited kind")
            await select(pilot, "limits", "charge")
            assert "Limits…" not in (await screen_text(pilot)).splitlines()[-1]
            await pilot.press("L")
            await pilot.pause(0.1)
            assert app.screen is app.main
            assert any("read-only" in n.message for n in app._notifications)
            assert "change the limits" not in " ".join(text for _, text in app.key_help())
        with pytest.raises(ReadOnly):
            await Source(dsn, read_only=True).set_limits("charge", {"concurrency": 9})
        assert limits_row(conn, "charge") == (2, 50, 1, "alice@box")

    run(scenario)


def test_enter_on_a_key_opens_its_next_throttled_job_saying_why_it_waits(conn, dsn):
    held = charge_backlog(conn)
    holder = next(j.id for j in held if j.key == "b")

    async def scenario() -> None:
        app = app_for(dsn)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: "charge\x00b" in rows(app, "limits"), message="key b")
            await select(pilot, "limits", "charge\x00b")
            await pilot.press("enter")
            screen = await until(
                pilot, lambda: app.screen if isinstance(app.screen, JobScreen) else None, message="the job screen"
            )
            assert screen.job["key"] == "b" and screen.job["status"] == "queued"
            text = await screen_text(pilot)
            assert "key          b" in text
            assert "why" in text and "its kind charge is at its concurrency limit, 2 of 2" in text
            assert str(holder) in screen.why

    run(scenario)


def test_starts_count_the_jobs_started_within_the_rates_period(conn, dsn):
    set_limits(conn, "charge", "alice@box", rate="100/m", burst=10)
    ids = client.enqueue_many(conn, [{"kind": "charge", "key": k} for k in "aab"] + [{"kind": "charge"}])
    jobs, _ = lifecycle.claim_limited(conn, ["charge"], ["default"], 4, "sup-a", 60)
    assert len(jobs) == 4
    lifecycle.complete(conn, [(j.id, j.attempts) for j in jobs[:2]], "sup-a")  # finished: their starts count
    conn.execute("UPDATE jobsup.jobs SET started_at = now() - interval '2 minutes' WHERE id = %s", (ids[3],))

    [charge] = asyncio.run(limit_rows_of(dsn))
    assert charge.starts == 3 and fmt.starts(charge.starts, charge.limits.rate) == "3 of 100/m"
    assert {k.key: k.starts for k in charge.keys} == {"a": 2, "b": 1}
    assert charge.held == 2 and charge.throttled == 0 and charge.startable == 0 and charge.throttled_age is None


async def limit_rows_of(dsn: str) -> tuple:
    """The Limits tab's rows, as one refresh of the console's source reads them."""
    source = Source(dsn)
    try:
        return (await source.refresh()).limits
    finally:
        await source.close()


def test_a_keys_ready_jobs_that_its_limits_allow_are_not_counted_throttled(conn, dsn):
    set_limits(conn, "charge", "alice@box", key_concurrency=1)
    client.enqueue_many(conn, [{"kind": "charge", "key": "a"}] * 3 + [{"kind": "charge", "key": "b"}] * 2)
    [held], _ = lifecycle.claim_limited(conn, ["charge"], ["default"], 1, "sup-a", 60)
    assert held.key == "a"

    [charge] = asyncio.run(limit_rows_of(dsn))
    # a holds its one slot: its 2 others are throttled; b may start one of its 2 (the other waits).
    assert {k.key: (k.held, k.throttled) for k in charge.keys} == {"a": (1, 2), "b": (0, 1)}
    assert (charge.held, charge.throttled, charge.startable) == (1, 3, 1)
