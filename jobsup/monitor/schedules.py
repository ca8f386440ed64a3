"""The console's schedules: a table of every schedule (app.every) with its next and last fire and the
status of its last job, and keys to run one now, pause it or resume it, each asked first as a requeue
is; none of them in --read-only.

Self-contained: `SchedulesPanel(source)` reads through the console's data source on its own timer, so it
fits in a tab or a screen of any layout; `SchedulesScreen` is that panel as a screen of its own.
"""

from __future__ import annotations

from datetime import datetime, tzinfo

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from jobsup.errors import DatabaseUnavailable
from jobsup.monitor import figures as fig
from jobsup.monitor.panels import fill, selected_key
from jobsup.monitor.screens import Confirm
from jobsup.monitor.source import Source
from jobsup.ops.cron import ScheduleState

# Keys of the schedules table, as data (the footer and a help screen can read them).
KEYS: list[Binding] = [
    Binding("n", "schedule('run')", "Run now", tooltip="enqueue one job of the selected schedule now (asks first)"),
    Binding("P", "schedule('pause')", "Pause", tooltip="pause the selected schedule on every supervisor (asks first)"),
    Binding("U", "schedule('resume')", "Resume", tooltip="resume the selected schedule (asks first)"),
    # In --read-only mode the keys fall through to this one, which says why nothing happens.
    Binding("n,P,U", "refuse", show=False),
]
COLUMNS = ("name", "kind", "expression", "tz", "state", "next fire", "last fire", "last job")
QUESTIONS = {
    "run": (
        "Enqueue one job of schedule {name} now?",
        "An ordinary job of its kind and payload, outside its fire times; the next fire stays as it was.",
        "Yes, run now",
    ),
    "pause": (
        "Pause schedule {name}?",
        "Every supervisor skips its fires until it is resumed; the fires meanwhile are not kept.",
        "Yes, pause",
    ),
    "resume": ("Resume schedule {name}?", "It fires again from its next fire time on.", "Yes, resume"),
}


class ConfirmSchedule(Confirm):
    BINDINGS = [
        Binding("n,escape", "answer(False)", "No"),
        Binding("y", "answer(True)", "Yes"),
        Binding("left,right", "app.focus_next", show=False),
    ]


class SchedulesReady(Message):
    def __init__(self, schedules: list[ScheduleState]) -> None:
        super().__init__()
        self.schedules = schedules


def _when(moment: datetime | None, now: datetime, tz: tzinfo | None) -> str:
    """
    >>> from datetime import timezone
    >>> now = datetime(2026, 12, 1, 10, 0, tzinfo=timezone.utc)
    >>> _when(datetime(2026, 12, 1, 10, 0, 30, tzinfo=timezone.utc), now, timezone.utc), _when(None, now, None)
    ('10:00:30 (in 30.0s)', '-')
    """
    if moment is None:
        return "-"
    seconds = (moment - now).total_seconds()
    local = moment.astimezone(tz)
    shown = f"{local:%H:%M:%S}" if local.date() == now.astimezone(tz).date() else f"{local:%m-%d %H:%M}"
    return f"{shown} (in {fig.age(seconds)})" if seconds >= 0 else f"{shown} ({fig.age(-seconds)} ago)"


def rows(schedules: list[ScheduleState], tz: tzinfo | None = None) -> list[tuple[str, list[Text]]]:
    """The table's rows: (schedule name, cells)."""
    styles = {"paused": "bold", "orphaned": "dim"}
    out = []
    for s in schedules:
        job = f"{s.last_job_id} {s.last_status or 'gone'}" if s.last_job_id else "-"
        cells = [
            s.name,
            s.kind,
            s.expression,
            s.tz,
            s.state,
            "-" if s.paused or s.state == "orphaned" else _when(s.next_fire, s.now, tz),
            _when(s.last_fire, s.now, tz),
            job,
        ]
        out.append((s.name, [Text(cell, style=styles.get(s.state, "")) for cell in cells]))
    return out


class SchedulesPanel(Vertical):
    """Every schedule, refreshed every `refresh` seconds through `source`."""

    DEFAULT_CSS = """
    SchedulesPanel { height: 1fr; border: round $primary 50%; border-title-color: $text; }
    SchedulesPanel:focus-within { border: round $accent; }
    SchedulesPanel DataTable { height: 1fr; background: transparent; }
    """
    BINDINGS = [*KEYS]  # a new list, typed as textual's list[BindingType] (list is invariant)

    def __init__(
        self,
        source: Source,
        *,
        refresh: float = fig.DEFAULT_REFRESH,
        read_only: bool = False,
        tz: tzinfo | None = None,
        id: str | None = "schedules-panel",
    ) -> None:
        super().__init__(id=id)
        self.source = source
        self.refresh_every = refresh
        self.read_only = read_only or source.read_only
        self.tz = tz
        self.schedules: list[ScheduleState] = []
        self.loads = 0  # successful reads, for tests
        self._loading = False

    def compose(self) -> ComposeResult:
        table: DataTable = DataTable(id="schedules", cursor_type="row", zebra_stripes=False)
        table.add_columns(*COLUMNS)
        yield table

    def on_mount(self) -> None:
        self.border_title = "schedules"
        self.border_subtitle = "" if self.read_only else "n run now · P pause · U resume"
        self.set_interval(self.refresh_every, self.reload)
        self.reload()

    def reload(self) -> None:
        if not self._loading:  # one read at a time: a slow database does not pile them up
            self._loading = True
            self.run_worker(self._load(), name="schedules", group="schedules", exit_on_error=False)

    async def _load(self) -> None:
        try:
            self.post_message(SchedulesReady(await self.source.schedules()))
        except DatabaseUnavailable as exc:
            self.border_subtitle = f"database unavailable: {exc}"
        finally:
            self._loading = False

    def on_schedules_ready(self, message: SchedulesReady) -> None:
        self.schedules = message.schedules
        self.loads += 1
        table = self.query_one(DataTable)
        fill(table, rows(self.schedules, self.tz))
        if not self.schedules:
            self.border_subtitle = "no schedules: declare them with app.every(...)"

    def selected(self) -> str | None:
        return selected_key(self.query_one(DataTable))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "schedule":
            return not self.read_only
        if action == "refuse":
            return self.read_only
        return True

    def action_refuse(self) -> None:
        self.notify("this console is read-only (--read-only): no schedule was changed", severity="warning")

    def action_schedule(self, action: str) -> None:
        name = self.selected()
        if name is None:
            self.notify("select a schedule first", severity="warning")
            return
        self.run_worker(self._act(action, name), name=f"schedule {action}", exit_on_error=False)

    async def _act(self, action: str, name: str) -> None:
        question, detail, yes = QUESTIONS[action]
        if not await self.app.push_screen_wait(ConfirmSchedule(question.format(name=name), detail, yes=yes)):
            self.notify("nothing was changed")
            return
        self.notify(await self.source.schedule_action(action, name), title="schedules")
        self.reload()


class SchedulesScreen(Screen[None]):
    """The schedules panel on a screen of its own (Esc closes it)."""

    BINDINGS = [Binding("escape,s", "app.pop_screen", "Close", key_display="Esc")]

    def __init__(
        self, source: Source, *, refresh: float = fig.DEFAULT_REFRESH, read_only: bool = False, tz: tzinfo | None = None
    ) -> None:
        super().__init__()
        self.panel = SchedulesPanel(source, refresh=refresh, read_only=read_only, tz=tz)

    def compose(self) -> ComposeResult:
        yield Static(Text("jobsup top · schedules", style="bold"), id="title")
        yield self.panel
        yield Footer()

    def on_mount(self) -> None:
        self.panel.query_one(DataTable).focus()
