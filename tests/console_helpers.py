"""Driving `jobsup top` in a test: the app of a database, a faked supervisor, and waits and looks that
work inside the app's event loop.

The app runs in the test's event loop, so waiting uses `until`, which polls with the Pilot (a blocking
wait would freeze the app it waits for); like tests/helpers.wait_for it fails at a deadline.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Callable, Coroutine
from datetime import UTC
from typing import Any

import psycopg
from rich.console import Console
from textual.pilot import Pilot
from textual.widgets import DataTable

from jobsup.monitor import panels
from jobsup.monitor.app import TopApp
from jobsup.monitor.source import Source
from jobsup.monitor.tabs import Pane

from .helpers import wait_for_async


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(scenario())


async def until(pilot: Pilot, condition: Callable[[], Any], timeout: float = 10.0, message: str = "condition") -> Any:
    return await wait_for_async(condition, pilot.pause, timeout, message=message)


async def screen_text(pilot: Pilot) -> str:
    """The whole screen as plain text, once laid out: what `tmux capture-pane -p` would show."""
    await pilot.pause()
    app = pilot.app
    width, height = app.size
    console = Console(
        width=width,
        height=height,
        file=io.StringIO(),
        force_terminal=True,
        record=True,
        legacy_windows=False,
        safe_box=False,
    )
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()


def rows(app: TopApp, table_id: str) -> dict[str, list[str]]:
    table = app.query_one(f"#{table_id}", DataTable)
    return {row.key.value: [str(cell) for cell in table.get_row(row.key)] for row in table.ordered_rows}


async def select(pilot: Pilot, table_id: str, key: str) -> DataTable:
    """Show a table's tab, focus it and put its cursor on a row, as a key and the arrows would."""
    table = pilot.app.query_one(f"#{table_id}", DataTable)
    pane = next(node for node in table.ancestors if isinstance(node, Pane))
    pilot.app.action_show_tab(pane.TAB.id)
    await until(pilot, lambda: pilot.app.focused is pane.first_table(), message=f"the {pane.TAB.id} tab")
    table.focus()
    table.move_cursor(row=table.get_row_index(key))
    await until(
        pilot,
        lambda: pilot.app.focused is table and panels.selected_key(table) == key,
        message=f"the cursor on {key!r} of #{table_id}",
    )
    return table


def fake_supervisor(
    conn: psycopg.Connection,
    sup_id: str,
    pid: int,
    workers: list[dict[str, Any]],
    heartbeat_ago: float = 0.0,
    *,
    queues: list[str] | None = None,
    kinds: list[str] | None = None,
    state: str = "running",
) -> None:
    """A supervisor's heartbeat row; `kinds` None serves every kind, as the heartbeat writes it."""
    conn.execute(
        "INSERT INTO jobsup.supervisors (id, host, pid, version, queues, procs, started_at, heartbeat_at, "
        "workers, jobs_done, state, kinds) VALUES (%s, 'box', %s, '0.1.0', %s, %s, now() - interval '90 s', "
        "now() - make_interval(secs => %s), %s, 42, %s, %s)",
        (sup_id, pid, queues or ["default"], len(workers), heartbeat_ago, json.dumps(workers), state, kinds),
    )


def app_for(dsn: str, **kwargs: Any) -> TopApp:
    read_only = kwargs.pop("read_only", False)
    return TopApp(
        Source(dsn, read_only=read_only), refresh=kwargs.pop("refresh", 0.2), read_only=read_only, tz=UTC, **kwargs
    )
