"""The Limits tab of `jobsup top`: each kind with a limit in force, what it holds, how fast it starts, what
it throttles and for how long, with its busiest keys under it; and the input of L, which
changes the selected kind's limits (the app asks first, and refuses in --read-only).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Input, Static

from jobsup.errors import BadInput
from jobsup.limits import Limits
from jobsup.monitor import figures as fig
from jobsup.monitor import formats as fmt
from jobsup.monitor.figures import Figures, LimitRow
from jobsup.monitor.panels import Panel, Table, View, fill, last_column_width, left, right, selected_key

# What L's input takes: the names of a handler's declaration (Limits.of), as name=value words.
NAMES = ("concurrency", "rate", "burst", "key_concurrency", "key_rate", "key_burst")
NONE = ("none", "off")  # the value that removes a limit
COLUMNS = (
    ("kind", "kind / key", False),
    ("held", "held", True),
    ("starts", "starts", True),
    ("throttled", "throttled", True),
    ("startable", "startable", True),  # a kind's ready jobs its limits allow to start: they wait for a worker
    ("oldest", "oldest", True),
)
INPUT_HELP = (
    "name=value, separated by spaces: concurrency, rate (50/s, 100/m, 1000/h), burst, key_concurrency, "
    "key_rate, key_burst; name=none removes one, the others stay. reset alone: the app's limits again."
)


def kind_of(row_key: str | None) -> str | None:
    """The kind of a row of the limits table: a kind's row is keyed by the kind, its keys' rows by
    kind NUL key.

    >>> kind_of("charge"), kind_of("charge\\x00acct-7"), kind_of(None)
    ('charge', 'charge', None)
    """
    return None if row_key is None else row_key.partition("\x00")[0]


def as_input(limits: Limits) -> str:
    """Limits in the words L's input takes, so the operator edits what is in force.

    >>> from jobsup.limits import Rate
    >>> as_input(Limits(3, Rate(50, 1.0, 5), None, Rate(10, 60.0)))
    'concurrency=3 rate=50/s burst=5 key_rate=10/m'
    """
    words = []
    for name, value in limits.to_json().items():
        if name.endswith("burst") and value == 1:
            continue  # the default: said only when it is not
        words.append(f"{name}={value}")
    return " ".join(words)


@dataclass(frozen=True)
class LimitChange:
    """What L asks to do to a kind's limits: `given` over those in force, or (None) reset to its app's."""

    kind: str
    given: Mapping[str, str | None] | None
    before: Limits
    after: Limits
    set_by: str | None = None  # who set the limits in force, if an operator did

    def question(self) -> tuple[str, str, str]:
        """The confirmation's question, its detail and its yes."""
        now = f"In force: {self.before}" + (f" (set by {self.set_by})." if self.set_by else ".")
        if not self.after.limited:
            then = "Then none: the kind is no longer limited, and its jobs are claimed as any other's."
        else:
            then = f"Then: {self.after}."
        if self.given is None:
            source = "its app's declaration" if self.after.limited else "no app declares limits for it"
            detail = f"{now}\n{then} ({source})"
            return f"Reset the limits of kind {self.kind}?", detail, "Yes, reset"
        detail = f"{now}\n{then}\nThey win over the app's declaration until reset; running jobs keep their slots."
        return f"Set the limits of kind {self.kind}?", detail, "Yes, set"


def parse_change(row: LimitRow, text: str) -> LimitChange:
    """What the operator typed for `row`'s kind, checked as set_limits will check it; BadInput if wrong.

    >>> from jobsup.limits import Rate
    >>> row = LimitRow("charge", Limits(concurrency=5, rate=Rate(50, 1.0)), declared=Limits(concurrency=2))
    >>> change = parse_change(row, "concurrency=3, key_concurrency=1")
    >>> change.given, str(change.after)
    ({'concurrency': '3', 'key_concurrency': '1'}, 'concurrency 3, rate 50/s, key_concurrency 1')
    >>> str(parse_change(row, "rate=none").after), str(parse_change(row, "reset").after)
    ('concurrency 5', 'concurrency 2')
    >>> parse_change(row, "speed=3")
    Traceback (most recent call last):
    ...
    jobsup.errors.BadInput: 'speed=3': give name=value with a name of concurrency, rate, burst, key_concurrency, \
key_rate, key_burst; or reset alone
    """
    words = text.replace(",", " ").split()
    if [w.lower() for w in words] == ["reset"]:
        return LimitChange(row.kind, None, row.limits, row.declared or Limits(), row.set_by)
    if not words:
        raise BadInput("type the limits to set, such as concurrency=3 rate=50/s, or reset")
    given: dict[str, str | None] = {}
    for word in words:
        name, equals, value = word.partition("=")
        if not equals or not value or name.lower() not in NAMES:
            raise BadInput(f"{word!r}: give name=value with a name of {', '.join(NAMES)}; or reset alone")
        given[name.lower()] = None if value.lower() in NONE else value
    return LimitChange(row.kind, given, row.limits, _after(row.kind, row.limits, given), row.set_by)


def _after(kind: str, current: Limits, given: Mapping[str, str | None]) -> Limits:
    """The limits set_limits (jobsup.ops.limits) writes: those given over those in force; a rate given
    without its burst takes the default burst, a rate not given keeps its own."""
    kept = {
        "concurrency": current.concurrency,
        "rate": current.rate,
        "burst": None,
        "key_concurrency": current.key_concurrency,
        "key_rate": current.key_rate,
        "key_burst": None,
    }
    return Limits.of(kind, **{**kept, **given})


class OpenThrottled(Message):
    """Open the job screen of the next throttled job of a kind, or of one of its keys."""

    def __init__(self, kind: str, key: str | None) -> None:
        super().__init__()
        self.kind = kind
        self.key = key


class LimitsPanel(Panel):
    TITLE = "limits: each limited kind and its busiest keys"

    def compose(self) -> ComposeResult:
        yield Table(COLUMNS, id="limits")
        yield Static(id="limit-detail")

    def show(self, figures: Figures, view: View) -> None:
        shown = [k for k in figures.limits if fmt.matches(view.match, k.kind)]
        rows: list[tuple[str, list[Text]]] = []
        for k in shown:
            rows.append((k.kind, self._kind_cells(k, view)))
            rows += [(f"{k.kind}\x00{key.key}", self._key_cells(k, key, view)) for key in k.keys]
            more = k.keys_seen - len(k.keys)
            if more > 0:
                rows.append(
                    (f"{k.kind}\x00", [left(f"  +{more:,} more keys", "dim"), *(left("") for _ in COLUMNS[1:])])
                )
        # The limits in words, in the room the figures leave on a wide screen (the layout's breakpoint, so
        # the column does not come and go with the figures); the line under the table says them whole.
        wide = self.screen.has_class("-wide")
        if wide:
            room = last_column_width(
                self.size.width,
                [[label, *(cells[i].plain for _, cells in rows)] for i, (_, label, _) in enumerate(COLUMNS)],
            )
            texts = {k.kind: str(k.limits) for k in shown}
            for key, cells in rows:
                cells.append(left(fmt.cut(texts.get(key, ""), room), "dim"))
        table = self.query_one(Table)
        selected = selected_key(table)
        redrawn = self._limits_column(table, wide)
        fill(table, rows)
        keys = [key for key, _ in rows]
        if redrawn and selected in keys:  # the cursor stays on what the operator chose
            table.move_cursor(row=keys.index(selected), scroll=False)
        if not figures.limits:
            self.border_subtitle = "no kind has a limit: declare one on its handler, or set one with jobsup limit"
        elif any(k.throttled_capped for k in shown):
            self.border_subtitle = f"throttled counted up to {fig.THROTTLED_COUNTED:,} a kind"
        else:
            self.border_subtitle = ""
        self._show_detail()

    @staticmethod
    def _limits_column(table: Table, wanted: bool) -> bool:
        """Add or remove the limits column; whether it did, clearing the rows to be drawn anew."""
        if wanted == ("limits" in table.columns):
            return False
        table.clear()
        if wanted:
            table.add_column("limits", key="limits")
        else:
            table.remove_column("limits")
        return True

    @staticmethod
    def _kind_cells(k: LimitRow, view: View) -> list[Text]:
        limits = k.limits
        late = k.throttled_age is not None and k.throttled_age > view.warn_age
        return [
            left(k.kind, "bold"),
            right(fmt.held(k.held, limits.concurrency), view.warning if k.at_concurrency else ""),
            right(fmt.starts(k.starts, limits.rate), view.warning if fmt.at_rate(k.starts, limits.rate) else ""),
            right(k.throttled_text),
            right(fmt.count(k.startable)),
            right(fmt.age(k.throttled_age), view.warning if late else ""),
        ]

    @staticmethod
    def _key_cells(k: LimitRow, key: fig.LimitedKey, view: View) -> list[Text]:
        limit, rate = k.limits.key_concurrency, k.limits.key_rate
        full = limit is not None and key.held >= limit
        return [
            left(f"  {key.key}"),
            right(fmt.held(key.held, limit), view.warning if full else ""),
            right(fmt.starts(key.starts, rate), view.warning if fmt.at_rate(key.starts, rate) else ""),
            right(fmt.count(key.throttled)),
            left(""),  # counted for the kind only: its keys share the kind's room
            right(fmt.age(key.throttled_age)),
        ]

    def selected(self) -> LimitRow | None:
        """The kind of the selected row (a key's row selects its kind)."""
        kind = kind_of(selected_key(self.query_one(Table)))
        figures = self._shown[0] if self._shown else None
        return next((k for k in figures.limits if k.kind == kind), None) if figures else None

    @on(DataTable.RowHighlighted)
    def _moved(self) -> None:
        self._show_detail()

    def _show_detail(self) -> None:
        """The selected kind's limits whole, and whose they are: the table cuts them, or leaves them out on
        a narrow screen."""
        row = self.selected()
        detail = self.query_one("#limit-detail", Static)
        if row is None:
            detail.update("")
            return
        if row.set_by:
            whose = f"set by {row.set_by}" + (f" over its app's {row.declared}" if row.declared else "")
        else:
            whose = "declared by its app"
        detail.update(Text.assemble((row.kind, "bold"), f": {row.limits}", (f" · {whose}", "dim")))


class LimitInput(ModalScreen[LimitChange | None]):
    """The limits to set on a kind, typed as name=value words (or reset); checked before it closes."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel", key_display="Esc")]

    def __init__(self, row: LimitRow) -> None:
        super().__init__()
        self.row = row

    def compose(self) -> ComposeResult:
        with Vertical(id="limit-input") as box:
            box.border_title = f"limits of kind {self.row.kind}"
            box.border_subtitle = "Enter next · Esc cancel"
            yield Static(Text.assemble(("in force: ", "bold"), str(self.row.limits)))
            yield Input(value=as_input(self.row.limits), id="limit-text")
            yield Static(Text(INPUT_HELP, style="dim"), id="limit-help")
            yield Static(id="limit-error")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#limit-text", Input).focus()

    @on(Input.Submitted, "#limit-text")
    def _submitted(self, event: Input.Submitted) -> None:
        event.stop()
        try:
            change = parse_change(self.row, event.value)
        except BadInput as exc:
            error = self.query_one("#limit-error", Static)
            error.update(Text(str(exc), style="bold"))
            error.add_class("-shown")
            return
        self.dismiss(change)
