"""The console's writes, each asked first: requeue dead jobs, cancel a running job, pause or resume a
queue, change a kind's limits. The tabs offer them (tabs.py: a key on the table whose rows they take, in
the footer only there), the command palette too, each taking the selection of the focused table; the job
screen offers a requeue. Each runs as a worker of the app, which reports any that fails.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, Protocol, cast

from textual.app import App
from textual.binding import Binding
from textual.dom import DOMNode
from textual.widgets import DataTable

from jobsup.errors import JobsupError
from jobsup.monitor.figures import Figures, LimitRow, Scope
from jobsup.monitor.limits_panels import LimitInput, LimitsPanel
from jobsup.monitor.panels import KindsPanel, group_scope, selected_key, worker_job
from jobsup.monitor.schedules import ConfirmSchedule
from jobsup.monitor.screens import Confirm
from jobsup.monitor.source import Source

REQUEUE = Binding("r", "requeue", "Requeue", tooltip="requeue the selected dead job")
REQUEUE_SCOPE = Binding(
    "R",
    "requeue_scope",
    "Requeue all…",
    tooltip="requeue every dead job of the selected kind or error group (asks first)",
)
CANCEL = Binding(
    "c",
    "cancel_job",
    "Cancel job…",
    tooltip="cancel the selected worker's job: its worker is stopped and replaced (asks first)",
)
PAUSE = Binding(
    "P",
    "queue('pause')",
    "Pause queue…",
    tooltip="pause the selected queue: no supervisor claims from it (asks first)",
)
RESUME = Binding("U", "queue('resume')", "Resume queue…", tooltip="resume the selected queue (asks first)")
LIMIT = Binding(
    "L",
    "limit",
    "Limits…",
    tooltip="change the limits of the selected kind: concurrency=3 rate=50/s, or reset (asks first)",
)
# In this order on the help screen, above the app's keys; hidden there in a --read-only console.
BINDINGS = [REQUEUE, REQUEUE_SCOPE, CANCEL, PAUSE, RESUME, LIMIT]
WRITES = {b.action.partition("(")[0] for b in BINDINGS}


class Console(Protocol):
    """What a write needs of the app (TopApp), beside what every Textual app has."""

    source: Source
    read_only: bool
    figures: Figures | None

    def refresh_now(self) -> None: ...


def console(node: DOMNode) -> Console:
    return cast(Console, node.app)


def start(node: DOMNode, work: Coroutine[Any, Any, None], name: str) -> None:
    """Run a write as a worker of the app: the app's one handler reports it if it fails."""
    node.app.run_worker(work, name=name, exit_on_error=False)


async def requeue(app: App[Any], ids: list[int], kind: str | None, scope: str) -> None:
    n = len(await console(app).source.requeue(ids, kind=kind))
    if n == len(ids):
        app.notify(f"requeued {scope}", title="requeue")
    else:
        app.notify(
            f"requeued {n} of {scope}: the others were no longer dead, or their unique key is live again",
            title="requeue",
            severity="warning",
        )
    console(app).refresh_now()


async def requeue_scope(app: App[Any], scope: Scope) -> None:
    ids = await console(app).source.dead_ids(scope)
    if not ids:
        app.notify(f"no {scope.describe(0).removeprefix('0 ')} to requeue", severity="warning")
        return
    stated = scope.describe(len(ids))
    yes = await app.push_screen_wait(
        Confirm(
            f"Requeue {stated}?",
            "Each goes back to its queue with its attempts reset to 0; its error history is kept.",
        )
    )
    if not yes:
        app.notify("nothing was requeued")
        return
    await requeue(app, ids, scope.kind, stated)


async def cancel(app: App[Any], job_id: int) -> None:
    yes = await app.push_screen_wait(
        ConfirmSchedule(
            f"Cancel job {job_id}?",
            "Its worker is stopped (SIGTERM, then SIGKILL after the kill grace) and replaced; the job is "
            "recorded cancelled and never retried. A job that finishes first stays as it ended.",
            "Yes, cancel",
        )
    )
    if not yes:
        app.notify("nothing was cancelled")
        return
    done = await console(app).source.cancel(job_id)
    said = {"requested": "cancel requested: its supervisor stops the worker", "cancelled": "cancelled"}
    app.notify(
        f"job {job_id} ({done.kind}): {said.get(done.action, 'not changed: ' + done.note)}",
        title="cancel",
        severity="information" if done.action != "unchanged" else "warning",
    )
    console(app).refresh_now()


async def queue(app: App[Any], action: str, name: str) -> None:
    question = {
        "pause": (
            f"Pause queue {name}?",
            "No supervisor claims from it until it is resumed; "
            "running jobs finish, claimed ones not yet started go back.",
            "Yes, pause",
        ),
        "resume": (f"Resume queue {name}?", "Every supervisor of the queue claims from it again.", "Yes, resume"),
    }[action]
    if not await app.push_screen_wait(ConfirmSchedule(*question)):
        app.notify("nothing was changed")
        return
    app.notify(await console(app).source.queue_action(action, name), title="queue")
    console(app).refresh_now()


async def limit(app: App[Any], row: LimitRow) -> None:
    change = await app.push_screen_wait(LimitInput(row))
    if change is None or not await app.push_screen_wait(ConfirmSchedule(*change.question())):
        app.notify("nothing was changed")
        return
    source = console(app).source
    try:
        if change.given is None:
            done = await source.reset_limits(row.kind)
        else:
            done = await source.set_limits(row.kind, change.given)
    except JobsupError as exc:  # a bad value the input let through, or the database: nothing changed
        app.notify(str(exc), title=f"limits of kind {row.kind}", severity="error", timeout=8)
        return
    said = f"{done.before} → {done.after}" if done.before != done.after else f"unchanged: {done.after}"
    app.notify(f"kind {done.kind}: {said}", title="limits")
    console(app).refresh_now()


# --- the selection of the focused table, for a tab's key or the command palette ---------------------


def focused_table(app: App[Any]) -> DataTable | None:
    return app.focused if isinstance(app.focused, DataTable) else None


def selected_scope(app: App[Any]) -> Scope:
    """The dead jobs R takes: the selected kind's, error group's or dead job's kind's; all of them from
    the total row or no selection."""
    table = focused_table(app)
    key = selected_key(table) if table is not None else None
    if table is None or key is None:
        return Scope()
    if table.id == "kinds":
        return app.screen.query_one(KindsPanel).scope()
    if table.id == "groups":
        return group_scope(key)
    figures = console(app).figures
    if table.id == "dead" and figures:
        job = next((j for j in figures.dead_jobs if str(j.id) == key), None)
        return Scope(kind=job.kind) if job else Scope()
    return Scope()


def requeue_selected_scope(app: App[Any]) -> None:
    start(app, requeue_scope(app, selected_scope(app)), "requeue")


def requeue_selected(app: App[Any]) -> None:
    table = focused_table(app)
    key = selected_key(table) if table is not None and table.id == "dead" else None
    if key is None:
        app.notify("select a dead job first (2: the Dead tab); R requeues a whole kind or group", severity="warning")
        return
    figures = console(app).figures
    job = next((j for j in figures.dead_jobs if str(j.id) == key), None) if figures else None
    scope = f"dead job {key}" + (f" ({job.kind})" if job else "")
    start(app, requeue(app, [int(key)], None, scope), "requeue")


def cancel_selected(app: App[Any]) -> None:
    table = focused_table(app)
    job_id = worker_job(selected_key(table)) if table is not None and table.id == "workers" else None
    if job_id is None:
        app.notify("select a busy worker first (3: the Workers tab): c cancels the job it runs", severity="warning")
        return
    start(app, cancel(app, job_id), "cancel")


def queue_selected(app: App[Any], action: str) -> None:
    table = focused_table(app)
    name = selected_key(table) if table is not None and table.id == "queues" else None
    if name is None:
        app.notify("select a queue first (1: the Jobs tab, its queues table)", severity="warning")
        return
    start(app, queue(app, action, name), "queue")


def limit_selected(app: App[Any]) -> None:
    table = focused_table(app)
    row = app.screen.query_one(LimitsPanel).selected() if table is not None and table.id == "limits" else None
    if row is None:
        app.notify("select a kind first (6: the Limits tab)", severity="warning")
        return
    start(app, limit(app, row), "limit")
