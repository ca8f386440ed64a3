"""The console's modal screens: the one confirmation of every destructive action, a job, the keys."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
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
    ago = fig.age(abs((now - moment).total_seconds()))
    relation = "ago" if moment <= now else "from now"
    return f"{moment.astimezone(tz):%Y-%m-%d %H:%M:%S} ({ago} {relation})"


def job_details(job: dict[str, Any], now: datetime, tz: tzinfo | None = None, why: str | None = None) -> RenderableType:
    """A job as the job screen shows it: its fields, why it is where it is (jobsup explain's text, as
    read when the screen opened), its payload and the history of its failed attempts."""
    fields = Table.grid(padding=(0, 2))
    fields.add_column(style="bold")
    fields.add_column()
    # The key (the per-key dimension of its kind's limits) is shown when the job has one: most have none.
    key = [("key", job["key"])] if job.get("key") is not None else []
    for label, value in (
        ("status", job["status"]),
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
    ):
        fields.add_row(label, Text(str(value)))
    parts: list[RenderableType] = [fields]
    if why:
        parts += [Text(""), Text("why", style="bold underline"), Text(why)]
    parts += [
        Text(""),
        Text("payload", style="bold underline"),
        Text(json.dumps(job["payload"], indent=2, ensure_ascii=False)),
    ]
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
    ) -> None:
        super().__init__()
        self.job = job
        self.clock = clock
        self.tz = tz
        self.read_only = read_only
        self.tick = tick
        self.why = why  # jobsup explain's text, read as the screen opened

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="job") as box:
            box.border_title = f"job {self.job['id']} · {self.job['kind']} · {self.job['status']}"
            box.border_subtitle = "Esc close" + (" · r requeue" if self._can_requeue() else "")
            yield Static(job_details(self.job, self.clock(), self.tz, self.why), id="job-details")
        yield Footer()

    def on_mount(self) -> None:
        self.set_interval(self.tick, self._redraw)

    def _redraw(self) -> None:
        self.query_one("#job-details", Static).update(job_details(self.job, self.clock(), self.tz, self.why))

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
