"""The console's schedules: a table of every schedule (app.every) with its next and last fire and the
status of its last job, and keys to run one now, pause it or resume it, each asked first as a requeue
is; none of them in --read-only.

Self-contained: `SchedulesPanel(source)` reads through the console's data source on its own timer, so it
fits in a tab or a screen of any layout; `SchedulesScreen` is that panel as a screen of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
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
from jobsup.monitor import formats as fmt
from jobsup.monitor.panels import fill, selected_key
from jobsup.monitor.screens import Confirm
from jobsup.monitor.source import Source
from jobsup.ops.schedules import ScheduleState

# Keys of the schedules table, as data (the footer and a help screen can read them).
KEYS: list[Binding] = [
    Binding("n", "schedule('run')", "Run now", tooltip="enqueue one job of the selected schedule now (asks first)"),
    Binding("P", "schedule('pause')", "Pause", tooltip="pause the selected schedule on every supervisor (asks first)"),
    Binding("U", "schedule('resume')", "Resume", tooltip="resume the selected schedule (asks first)"),
    # In --read-only mode the keys fall through to this one, which says why nothing happens.
    Binding("n,P,U", "refuse", show=False),
]
COLUMNS = ("name", "kind", "expression", "tz", "state", "next fire", "last fire", "last job")
# When the table is wider than its panel (80 columns), the fire times lose their clock time ("in 2m10s"),
# then these columns go, first to last: the name, its state, when it fires and how its last job went stay.
DROP_FIRST = ("tz", "kind", "expression")
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


def _when(moment: datetime | None, now: datetime, tz: tzinfo | None, clock: bool = True) -> str:
    """
    >>> from datetime import timezone
    >>> now = datetime(2026, 12, 1, 10, 0, tzinfo=timezone.utc)
    >>> _when(datetime(2026, 12, 1, 10, 0, 30, tzinfo=timezone.utc), now, timezone.utc), _when(None, now, None)
    ('10:00:30 (in 30.0s)', '-')
    >>> _when(datetime(2026, 12, 1, 9, 58, tzinfo=timezone.utc), now, timezone.utc, clock=False)
    '2m00s ago'
    """
    if moment is None:
        return "-"
    seconds = (moment - now).total_seconds()
    relative = f"in {fmt.age(seconds)}" if seconds >= 0 else f"{fmt.age(-seconds)} ago"
    if not clock:
        return relative
    local = moment.astimezone(tz)
    shown = f"{local:%H:%M:%S}" if local.date() == now.astimezone(tz).date() else f"{local:%m-%d %H:%M}"
    return f"{shown} ({relative})"


def cells(s: ScheduleState, tz: tzinfo | None = None, clock: bool = True) -> dict[str, str]:
    """A schedule's cells by column; `clock` False gives the fire times without their clock time."""
    return {
        "name": s.name,
        "kind": s.kind,
        "expression": s.expression,
        "tz": s.tz,
        "state": s.state,
        "next fire": "-" if s.paused or s.state == "orphaned" else _when(s.next_fire, s.now, tz, clock),
        "last fire": _when(s.last_fire, s.now, tz, clock),
        "last job": f"{s.last_job_id} {s.last_status or 'gone'}" if s.last_job_id else "-",
    }


def fit(table: list[dict[str, str]], short: list[dict[str, str]], width: int) -> tuple[list[str], bool]:
    """The columns to show in `width` cells, and whether the short cells (no clock times) are needed.

    Each column takes its widest cell or header and a padding of 2 (DataTable's).

    >>> full = [{"name": "digest", "tz": "Europe/Amsterdam", "last fire": "09:27:10 (2m50s ago)"}]
    >>> short = [{"name": "digest", "tz": "Europe/Amsterdam", "last fire": "2m50s ago"}]
    >>> fit(full, short, 60), fit(full, short, 40), fit(full, short, 20)
    ((['name', 'tz', 'last fire'], False), (['name', 'tz', 'last fire'], True), (['name', 'last fire'], True))
    """

    def needed(rows: list[dict[str, str]], columns: list[str]) -> int:
        return sum(max(len(c), *(len(r[c]) for r in rows)) + 2 for c in columns)

    columns = [c for c in COLUMNS if not table or c in table[0]]
    if needed(table, columns) <= width:
        return columns, False
    for gone in (None, *DROP_FIRST):
        columns = [c for c in columns if c != gone]
        if needed(short, columns) <= width:
            break
    return columns, True


def rows(
    schedules: list[ScheduleState], tz: tzinfo | None = None, columns: Sequence[str] = COLUMNS, clock: bool = True
) -> list[tuple[str, list[Text]]]:
    """The table's rows: (schedule name, cells of `columns`)."""
    styles = {"paused": "bold", "orphaned": "dim"}
    out = []
    for s in schedules:
        shown = cells(s, tz, clock)
        out.append((s.name, [Text(shown[c], style=styles.get(s.state, "")) for c in columns]))
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
        self._columns: list[str] = list(COLUMNS)

    def compose(self) -> ComposeResult:
        table: DataTable = DataTable(id="schedules", cursor_type="row", zebra_stripes=False)
        table.add_columns(*COLUMNS)
        yield table

    def on_resize(self) -> None:
        self._show()

    def _show(self) -> None:
        """The rows, in the columns that fit the panel's width (fit)."""
        table = self.query_one(DataTable)
        width = self.size.width - 2  # inside the border: room for a scrollbar
        columns, short = list(COLUMNS), False
        if width > 0 and self.schedules:
            columns, short = fit(
                [cells(s, self.tz) for s in self.schedules], [cells(s, self.tz, False) for s in self.schedules], width
            )
        if columns != self._columns:
            table.clear(columns=True)
            table.add_columns(*columns)
            self._columns = columns
        fill(table, rows(self.schedules, self.tz, columns, clock=not short))

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
        self._show()
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
