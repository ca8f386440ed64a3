"""The console's modal screens: the one confirmation of every destructive action, a job, the keys."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, tzinfo
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Footer, Static

from jobsup.monitor import figures as fig
from jobsup.monitor import formats as fmt
from jobsup.monitor.panels import View, status_style
from jobsup.otel import trace_fields
from jobsup.workflow import Child, Parent

# A job's parents and children listed one by one on its screen, each; the rest are counted by status.
FAMILY_SHOWN = 12
Family = tuple[Sequence[Parent], Sequence[Child]]
PLAIN = View()  # without the theme's colours: bold and dim only


class Confirm(ModalScreen[bool]):
    """Yes or no, with No focused: Enter or Esc right after the question changes nothing."""

    BINDINGS = [
        Binding("n,escape", "answer(False)", "No"),
        Binding("y", "answer(True)", "Yes, requeue"),
        Binding("left,right", "app.focus_next", show=False),
    ]

    def __init__(self, question: str, detail: str = "", yes: str = "Yes, requeue") -> None:
        super().__init__()
        self.question = question
        self.detail = detail
        self.yes = yes

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm"):
            yield Static(Text(self.question, style="bold"), id="question")
            if self.detail:
                yield Static(Text(self.detail), id="detail")
            with Horizontal(id="buttons"):
                yield Button("No", id="no", variant="primary")
                yield Button(self.yes, id="yes", variant="error")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


def _when(moment: datetime | None, now: datetime, tz: tzinfo | None) -> str:
    if moment is None:
        return "-"
    ago = fmt.age(abs((now - moment).total_seconds()))
    relation = "ago" if moment <= now else "from now"
    return f"{moment.astimezone(tz):%Y-%m-%d %H:%M:%S} ({ago} {relation})"


def job_details(
    job: dict[str, Any],
    now: datetime,
    tz: tzinfo | None = None,
    why: str | None = None,
    family: Family = ((), ()),
    view: View = PLAIN,
) -> RenderableType:
    """A job as the job screen shows it: its fields, why it is where it is (jobsup explain's text, as
    read when the screen opened), the jobs it waits for and those that wait for it, its payload and the
    history of its failed attempts."""
    fields = Table.grid(padding=(0, 2))
    fields.add_column(style="bold")
    fields.add_column()
    # The key (the per-key dimension of its kind's limits) is shown when the job has one: most have none.
    key = [("key", job["key"])] if job.get("key") is not None else []
    workflow = [("workflow", str(job["workflow_id"]))] if job.get("workflow_id") is not None else []
    trace = trace_fields(job.get("meta")).get("trace_id")
    if trace:
        workflow.append(("trace", trace))
    if job["status"] == "waiting":
        workflow.append(("parents left", f"{job.get('parents_left', '?')} of {len(family[0])}"))
    for label, value in (
        ("status", Text(job["status"], style=status_style(job["status"], view))),
        ("kind", job["kind"]),
        ("queue", job["queue"]),
        *key,
        ("attempts", f"{job['attempts']} of {job['max_attempts']}"),
        ("priority", str(job["priority"])),
        ("created", _when(job["created_at"], now, tz)),
        ("run at", _when(job["run_at"], now, tz)),
        ("started", _when(job["started_at"], now, tz)),
        ("finished", _when(job["done_at"], now, tz)),
        ("locked by", job["locked_by"] or "-"),
        ("lease until", _when(job["locked_until"], now, tz)),
        ("unique key", job["unique_key"] or "-"),
        *workflow,
    ):
        fields.add_row(label, value if isinstance(value, Text) else Text(str(value)))
    parts: list[RenderableType] = [fields]
    if why:
        parts += [Text(""), Text("why", style="bold underline"), Text(why)]
    parents, children = family
    if parents:
        parts += [Text(""), *relatives("parents", parents, view, "this job runs even if they fail")]
    if children:
        parts += [Text(""), *relatives("children", children, view, "they run even if this job fails")]
    parts += [
        Text(""),
        Text("payload", style="bold underline"),
        Text(json.dumps(job["payload"], indent=2, ensure_ascii=False)),
    ]
    if job.get("meta"):  # what enqueue middleware stored with it
        parts += [Text(""), Text("meta", style="bold underline"), Text(json.dumps(job["meta"], indent=2))]
    if job["last_error"]:
        parts += [Text(""), Text("last error", style="bold underline"), Text(job["last_error"])]
    errors = job["errors"] or []
    parts += [Text(""), Text(f"failed attempts ({len(errors)})", style="bold underline")]
    for entry in errors:
        at = fig.parse_time(entry.get("at"))
        parts.append(
            Text.assemble(
                (f"attempt {entry.get('attempt', '?')}", "bold"),
                f" · {_when(at, now, tz)} · by {entry.get('by') or '-'}",
            )
        )
        parts.append(Text(str(entry.get("error") or ""), style="bold"))
        if entry.get("traceback"):
            parts.append(Text(str(entry["traceback"]).rstrip(), style="dim"))
        parts.append(Text(""))
    if not errors:
        parts.append(Text("none", style="dim"))
    return Group(*parts)


# The order a job's parents and children are listed in: those that failed, then those not yet ended,
# then the done ones; what holds a fan-in up comes before the forty parents that are done.
RELATIVES_ORDER = {"dead": 0, "cancelled": 1, "running": 2, "queued": 3, "waiting": 4, "done": 5}


def relatives(title: str, jobs: Sequence[Parent | Child], view: View, runs_anyway: str) -> list[RenderableType]:
    """A job's parents or children under `title`: id, kind and status, the first FAMILY_SHOWN of them
    (RELATIVES_ORDER), the rest counted by status. A dependency whose child runs even if its parent fails
    (on_parent_failure="run") is said so on its line, or once in the title, in words (`runs_anyway`),
    when every one of them is."""
    policies = {j.on_parent_failure for j in jobs}
    heading = Text(f"{title} ({len(jobs):,})", style="bold underline")
    if policies == {"run"}:
        heading.append(f" {runs_anyway}", style="dim")
    grid = Table.grid(padding=(0, 2))
    grid.add_column(justify="right")
    grid.add_column()
    grid.add_column()
    grid.add_column(style="dim")
    ordered = sorted(jobs, key=lambda j: (RELATIVES_ORDER.get(j.status, 9), j.id))
    for j in ordered[:FAMILY_SHOWN]:
        note = "on_parent_failure=run" if j.on_parent_failure == "run" and len(policies) > 1 else ""
        grid.add_row(str(j.id), j.kind, Text(j.status, style=status_style(j.status, view)), note)
    rest = Counter(j.status for j in ordered[FAMILY_SHOWN:])
    if not rest:
        return [heading, grid]
    counted = Text(f"+{sum(rest.values()):,} more: ", style="dim")
    for n, (status, count) in enumerate(sorted(rest.items(), key=lambda item: -item[1])):
        counted.append(", " if n else "")
        counted.append(f"{count:,} {status}", style=status_style(status, view))
    return [heading, grid, counted]


# Seconds between redraws of the job screen, so "(4.0s ago)" counts on while it is open.
JOB_TICK = 1.0


class JobScreen(ModalScreen[str | None]):
    """One job. Dismissed with "requeue" when the operator asks to requeue it (r, if it is dead).

    `clock` tells the database's time now: the relative times are redrawn from it every `tick` seconds.
    """

    BINDINGS = [
        Binding("escape,q,enter", "dismiss(None)", "Close", key_display="Esc"),
        Binding("r", "requeue", "Requeue"),
    ]

    def __init__(
        self,
        job: dict[str, Any],
        clock: Callable[[], datetime],
        *,
        tz: tzinfo | None = None,
        read_only: bool = False,
        tick: float = JOB_TICK,
        why: str | None = None,
        family: Family = ((), ()),
        view: View = PLAIN,
    ) -> None:
        super().__init__()
        self.job = job
        self.clock = clock
        self.tz = tz
        self.read_only = read_only
        self.tick = tick
        self.why = why  # jobsup explain's text, read as the screen opened
        self.family = family  # its parents and children, read as the screen opened
        self.view = view

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="job") as box:
            box.border_title = f"job {self.job['id']} · {self.job['kind']} · {self.job['status']}"
            box.border_subtitle = "Esc close" + (" · r requeue" if self._can_requeue() else "")
            yield Static(self._details(), id="job-details")
        yield Footer()

    def on_mount(self) -> None:
        self.set_interval(self.tick, self._redraw)

    def _details(self) -> RenderableType:
        return job_details(self.job, self.clock(), self.tz, self.why, self.family, self.view)

    def _redraw(self) -> None:
        self.query_one("#job-details", Static).update(self._details())

    def _can_requeue(self) -> bool:
        return self.job["status"] == "dead" and not self.read_only

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return self._can_requeue() if action == "requeue" else True

    def action_requeue(self) -> None:
        self.dismiss("requeue")


class HelpScreen(ModalScreen[None]):
    """Every key of the console, from the same data as the bindings."""

    BINDINGS = [Binding("escape,q,question_mark", "dismiss(None)", "Close", key_display="Esc")]

    def __init__(self, keys: Iterable[tuple[str, str]]) -> None:
        super().__init__()
        self.keys = list(keys)

    def compose(self) -> ComposeResult:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold", justify="right")
        table.add_column()
        for key, description in self.keys:
            table.add_row(key, description)
        with VerticalScroll(id="help") as box:
            box.border_title = "jobsup top: keys"
            box.border_subtitle = "Esc close"
            yield Static(table)
        yield Footer()
