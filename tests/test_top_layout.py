"""The console at the sizes people run it, every tab in the bar: at 80×24 a badge without its title never
reads as the next tab's key; side by side (from 120 columns) the counts by kind keep their last column
once the wait column joins them."""

from __future__ import annotations

import dataclasses
from datetime import UTC
from typing import Any

from jobsup.limits import Limits, Rate
from jobsup.monitor import figures as fig
from jobsup.monitor.app import TopApp

from .console_helpers import run, screen_text, until
from .test_top import FixedSource


class EveryTabSource(FixedSource):
    """The fixed figures with jobs waiting for their parents, a limited kind throttling 48 jobs and an
    unfinished workflow: the Limits and Workflows tabs join the bar, each with its badge."""

    async def refresh(self, match: str | None = None) -> fig.Figures:
        figures = await super().refresh(match)
        charge = fig.LimitRow("charge", Limits(concurrency=3, rate=Rate(50, 1.0)), held=3, throttled=48)
        return dataclasses.replace(
            figures,
            kinds=tuple(dataclasses.replace(k, waiting=7) for k in figures.kinds),
            limits=(charge,),
            workflows_listed=2,
            workflows_unfinished=1,
        )


async def first_refresh(app: TopApp, pilot: Any) -> str:
    await until(pilot, lambda: app.refreshes >= 1, message="first refresh")
    await pilot.pause(0.1)
    return await screen_text(pilot)


def test_at_80_columns_the_tab_bar_keeps_each_badge_with_its_key():
    async def scenario() -> None:
        app = TopApp(EveryTabSource(), refresh=3600, tz=UTC)  # type: ignore[arg-type]
        async with app.run_test(size=(80, 24)) as pilot:
            text = await first_refresh(app, pilot)
            bar = next(line for line in text.splitlines() if "[1 Jobs]" in line)
            assert bar.strip() == "[1 Jobs] 2(445)  3(5/8)  4(6)  5(↑1)  6(48)  7(1)", bar
            app.action_show_tab("limits")
            await until(pilot, lambda: app.tab == "limits", message="the Limits tab")
            bar = next(line for line in (await screen_text(pilot)).splitlines() if "[6 Limits" in line)
            assert bar.strip() == "1  2(445)  3(5/8)  4(6)  5(↑1) [6 Limits 48] 7(1)", bar

    run(scenario)


def test_side_by_side_the_counts_keep_their_last_column_beside_wait():
    async def scenario() -> None:
        for size in ((120, 40), (160, 48)):
            app = TopApp(EveryTabSource(), refresh=3600, tz=UTC)  # type: ignore[arg-type]
            async with app.run_test(size=size) as pilot:
                text = await first_refresh(app, pilot)
                header = next(line for line in text.splitlines() if "│ kind " in line)
                labels = header.split("│")[1].split()
                assert labels == ["kind", "wait", "ready", "sched", "run", "done", "failed", "dead", "canc"], header
                assert "│ queue " in header and "oldest ready" in header, header  # the queues beside, whole

    run(scenario)
