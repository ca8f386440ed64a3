"""The panels of `jobsup top`: each turns Figures into rows of text and nothing more.

Row keys carry what an action needs (a job id, a kind, a group), so the app can act on the selected row
without reading cells back. Cells are rich Text, never markup: a job's error text is shown as written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import tzinfo
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.coordinate import Coordinate
from textual.widget import Widget
from textual.widgets import DataTable, Label, Sparkline, Static

from jobsup.monitor import figures as fig
from jobsup.monitor import formats as fmt
from jobsup.monitor.figures import Figures, Scope

TOTAL_KEY = "\x00total"  # the row key of the counts table's total row: no kind is named so
# The counts table's headers: short, so its eight columns (nine with wait) fit in half of 120 columns (the
# panel beside the queues) with room for a kind's name; the header line and the docs say what they stand for.
COUNT_LABELS = {"scheduled": "sched", "running": "run", "cancelled": "canc", "waiting": "wait"}
UNSERVED_MARK = "✖"  # beside a kind with ready jobs that no live supervisor can run
# A panel's border (1 cell each side) and a vertical scrollbar (2) around its table's columns.
FRAME = 2 + 2


@dataclass(frozen=True)
class View:
    """What, besides the figures, decides how they look."""

    match: str | None = None
    warn_age: float = 60.0
    stale_after: float = fig.STALE_AFTER
    changed: frozenset[tuple[str, str]] = frozenset()
    accent: str = "bold"  # rich styles taken from the Textual theme
    warning: str = "bold"
    error: str = "bold reverse"
    success: str = ""
    tz: tzinfo | None = None
    # Jobs have waited for their parents since the console started: the counts show the waiting ones from
    # then on (a column that came and went with them would move every other one).
    waiting: bool = False


def status_style(status: str, view: View) -> str:
    """How a job's status is shown wherever one is (the job screen, a workflow's tree, attempts by
    status): dead as the dead counts are, running as busy workers, waiting (for its parents) dimmed as
    idle workers, since nothing can run it yet.

    >>> [status_style(s, View(success="green")) for s in ("done", "dead", "running", "waiting", "queued")]
    ['green', 'bold', 'bold', 'dim', '']
    """
    styles = {
        "done": view.success,
        "dead": view.error.replace("reverse", "").strip() or "bold",
        "cancelled": view.warning,
        "running": view.accent,
        "waiting": "dim",
    }
    return styles.get(status, "")


def selected_key(table: DataTable) -> str | None:
    if not table.row_count or not table.is_valid_row_index(table.cursor_row):
        return None
    return table.coordinate_to_cell_key(Coordinate(table.cursor_row, 0)).row_key.value


def fill(table: DataTable, rows: Sequence[tuple[str, Sequence[Text]]], newest_first: bool = False) -> int:
    """Show `rows` (key, cells), keeping the operator's place; the number of rows above the view.

    In the focused table the cursor stays on the row it was on, wherever that row moves: what the
    operator selected is what r acts on. In the others it stays at its place.

    A `newest_first` table (the dead jobs) follows its newest row while the cursor is on the first row:
    new rows arrive in view and the cursor moves to the newest. Once the operator has moved the cursor
    down, it holds that row at the same line of the screen whatever arrives above it, and the count
    returned says how many rows (newer ones) are out of sight above.
    """
    keys = [key for key, _ in rows]
    if keys == [row.key.value for row in table.ordered_rows]:
        columns = [column.key for column in table.ordered_columns]
        for key, cells in rows:
            for column, cell in zip(columns, cells, strict=True):  # a cell for each column
                table.update_cell(key, column, cell, update_width=True)
        return round(table.scroll_y)
    selected, index, top = selected_key(table), table.cursor_row, round(table.scroll_y)
    table.clear()
    for key, cells in rows:
        table.add_row(*cells, key=key)
    if not rows:
        return 0
    if newest_first:
        if index <= 0:
            cursor, top = 0, 0
        elif selected in keys:
            cursor = keys.index(selected)
            top = max(0, cursor - (index - top))  # the held row stays on its line of the screen
        else:  # the held row is gone (requeued): the row that took its place
            cursor = min(index, len(rows) - 1)
        table.move_cursor(row=cursor, scroll=False)
        # The new rows' height is known only after the next layout: scrolling now would be cut short.
        table.call_after_refresh(table.scroll_to, y=top, animate=False)
        return top
    # The focused table follows its selected row (the `in` test also rules out None for the type checker).
    if table.has_focus and selected in keys:
        cursor = keys.index(selected)
    else:
        cursor = min(index, len(rows) - 1)
    table.move_cursor(row=cursor, scroll=False)
    table.scroll_y = top
    return top


def last_column_width(panel_width: int, columns: Sequence[Sequence[str]], floor: int = 16) -> int:
    """Room left for a table's last column, given the texts of the other columns (with their headers).

    Each column takes its widest text plus a cell padding of 2, the last one its padding too; the
    panel's border and a possible scrollbar take 4.

    >>> last_column_width(80, [["id", "12345"], ["kind", "email"]])
    60
    """
    used = sum(max(map(len, column)) + 2 for column in columns) + 2 + 4
    return max(floor, panel_width - used)


def pack(items: Sequence[Text], width: int, gap: int = 2) -> Text:
    """Items on lines of at most `width` cells, breaking only between items, never inside one.

    >>> print(pack([Text("ready 3"), Text("dead 12"), Text("oldest ready 1m02s")], 20).plain)
    ready 3  dead 12
    oldest ready 1m02s
    """
    out = Text()
    used = 0
    for item in items:
        if used and used + gap + item.cell_len > width:
            out.append("\n")
            used = 0
        elif used:
            out.append(" " * gap)
            used += gap
        out.append_text(item)
        used += item.cell_len
    return out


def right(value: str, style: str = "") -> Text:
    return Text(value, style=style, justify="right")


def left(value: str, style: str = "") -> Text:
    return Text(value, style=style)


class Panel(Vertical):
    """A bordered box with a title; the app finds its table to act on the selection."""

    TITLE = ""

    def on_mount(self) -> None:
        self.border_title = self.TITLE
        self._shown: tuple[Figures, View] | None = None

    def update(self, figures: Figures, view: View) -> None:
        self._shown = (figures, view)
        self.show(figures, view)

    def on_resize(self) -> None:
        # Text is cut to the panel's width: a new width (the first layout, a resized terminal) redraws.
        if self._shown is not None:
            self.show(*self._shown)

    def show(self, figures: Figures, view: View) -> None:
        raise NotImplementedError


class Table(DataTable):
    """A DataTable that selects whole rows and keeps its place across refreshes."""

    # Rows only: Home and End go to the first and last row, not to the first and last column.
    BINDINGS = [Binding("home", "scroll_top", show=False), Binding("end", "scroll_bottom", show=False)]

    def __init__(self, columns: Sequence[tuple[str, str, bool]], **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=False, **kwargs)
        self._columns = columns

    def on_mount(self) -> None:
        for key, label, is_number in self._columns:
            self.add_column(Text(label, justify="right") if is_number else label, key=key)


# --- counts by kind ------------------------------------------------------------------------------


class KindsPanel(Panel):
    TITLE = "jobs by kind"

    def compose(self) -> ComposeResult:
        yield Table(
            [
                ("kind", "kind", False),
                *((name, COUNT_LABELS.get(name, name), True) for name in fig.COUNT_COLUMNS),
            ],
            id="kinds",
        )

    def show(self, figures: Figures, view: View) -> None:
        rows = []
        kinds = [k for k in figures.kinds if fmt.matches(view.match, k.kind, *k.queues)]
        unserved = {u.kind for u in figures.unserved(view.stale_after)}
        table = self.query_one(Table)
        if view.waiting and "waiting" not in table.columns:  # first, as `jobsup stats` shows it
            table.clear(columns=True)
            table.add_column("kind", key="kind")
            for name in fig.KIND_COLUMNS:
                table.add_column(Text(COUNT_LABELS.get(name, name), justify="right"), key=name)
        for k in kinds:
            cells = self._cells(k, view)
            if k.kind in unserved:  # the header's note says which queue, how many and since when
                cells[0] = Text.assemble(k.kind, (f" {UNSERVED_MARK}", view.warning))
            rows.append((k.kind, cells))
        total = fig.KindRow("total", **fig.column_sums(kinds), queues=())  # queues named: the sums fill only counts
        rows.append((TOTAL_KEY, self._cells(total, view, bold=True)))
        fill(table, rows)
        # Side by side with the queues (a wide terminal), the panel takes the room its columns need, up to
        # two thirds of the row, and the queues what is left: a column that appears (wait) does not push the
        # last one (canc) out of view. Stacked (a narrow terminal), it has the whole width anyway.
        needed = sum(c.get_render_width(table) for c in table.ordered_columns) + FRAME
        row = self.parent.size.width if isinstance(self.parent, Widget) else 0
        self.styles.min_width = min(needed, row * 2 // 3) if self.screen.has_class("-wide") and row else None

    @staticmethod
    def _cells(k: fig.KindRow, view: View, bold: bool = False) -> list[Text]:
        cells = [left(k.kind, "bold" if bold else "")]
        for name in fig.KIND_COLUMNS if view.waiting else fig.COUNT_COLUMNS:
            style = view.accent if (k.kind, name) in view.changed else ("bold" if bold else "")
            if name == "dead" and k.dead and not style:
                style = view.error.replace("reverse", "").strip() or "bold"
            cells.append(right(fmt.count(getattr(k, name)), style))
        return cells

    def scope(self) -> Scope:
        key = selected_key(self.query_one(Table))
        return Scope() if key in (None, TOTAL_KEY) else Scope(kind=key)


# --- queues: backlog and the age of the oldest ready job ----------------------------------------


class QueuesPanel(Panel):
    TITLE = "queues"

    def compose(self) -> ComposeResult:
        yield Table(
            [
                ("queue", "queue", False),
                ("ready", "ready", True),
                ("scheduled", "sched", True),
                ("running", "running", True),
                ("oldest", "oldest ready", True),
            ],
            id="queues",
        )

    def show(self, figures: Figures, view: View) -> None:
        rows = []
        for q in figures.queues:
            if not fmt.matches(view.match, q.queue, *q.kinds):
                continue
            late = q.oldest is not None and q.oldest > view.warn_age
            name = Text.assemble(q.queue, (" paused", view.warning)) if q.paused else left(q.queue)
            rows.append(
                (
                    q.queue,
                    [
                        name,
                        right(fmt.count(q.ready)),
                        right(fmt.count(q.scheduled)),
                        right(fmt.count(q.running)),
                        right(fmt.age(q.oldest), view.warning if late else ""),
                    ],
                )
            )
        fill(self.query_one(Table), rows)


# --- throughput ----------------------------------------------------------------------------------


class ThroughputPanel(Panel):
    TITLE = "throughput"

    def compose(self) -> ComposeResult:
        for name in ("done", "failed"):
            with Horizontal(classes="spark-row"):
                yield Label(name, id=f"{name}-rate", classes="spark-label")
                yield Sparkline([], id=f"{name}-spark")

    def show_rates(self, throughput: fig.Throughput) -> None:
        for name in ("done", "failed"):
            rates = throughput.rates(name)
            label = Text.assemble((f"{name:<6}", "bold"), right(f"{fmt.rate(rates[-1] if rates else None):>9}"))
            self.query_one(f"#{name}-rate", Label).update(label)
            # One value would fill the whole box (the sparkline scales to it); fewer than two draw a baseline.
            self.query_one(f"#{name}-spark", Sparkline).data = rates if len(rates) > 1 else []

    def show(self, figures: Figures, view: View) -> None:
        pass  # rates need the history the app keeps: show_rates


# --- dead jobs, one by one and grouped ----------------------------------------------------------


class DeadPanel(Panel):
    TITLE = "dead jobs, newest first"
    newer_above = 0  # rows out of sight above the held row (see fill)

    def compose(self) -> ComposeResult:
        yield Table(
            [
                ("id", "id", True),
                ("kind", "kind", False),
                ("attempts", "att", True),
                ("died", "died", True),
                ("error", "last error", False),
            ],
            id="dead",
        )

    def show(self, figures: Figures, view: View) -> None:
        matching = figures.dead_matching  # None with no filter
        if figures.dead_jobs:
            of = fmt.count(figures.total.dead) if matching is None else f"{fmt.count(matching)} matching"
            self.border_subtitle = f"{len(figures.dead_jobs)} of {of}"
        elif figures.match and figures.total.dead:
            # An empty table under a filter is not "no dead jobs": say that the filter hides them.
            self.border_subtitle = f"no dead job matches {figures.match!r} (Esc clears the filter)"
        else:
            self.border_subtitle = ""
        cells = [
            [
                str(j.id),
                j.kind,
                f"{j.attempts}/{j.max_attempts}",
                fmt.age(fmt.since(j.done_at, figures.now)) + " ago" if j.done_at else "-",
            ]
            for j in figures.dead_jobs
        ]
        width = last_column_width(self.size.width, list(zip(["id", "kind", "att", "died"], *cells, strict=True)))
        above = fill(
            self.query_one(Table),
            [
                (
                    str(j.id),
                    [right(c[0]), left(c[1]), right(c[2]), right(c[3]), left(fmt.short_error(j.last_error, width))],
                )
                for j, c in zip(figures.dead_jobs, cells, strict=True)
            ],
            newest_first=True,
        )
        self.newer_above = above
        # Said in the title, where the eye is when it looks for the newest: Home goes back to following.
        self.border_title = self.TITLE + (f" · [b]↑ {above} newer[/b] (Home)" if above else "")


class GroupsPanel(Panel):
    TITLE = "dead jobs by kind and error"

    def compose(self) -> ComposeResult:
        yield Table(
            [
                ("count", "count", True),
                ("kind", "kind", False),
                ("last", "latest", True),
                ("error", "last error", False),
            ],
            id="groups",
        )

    def show(self, figures: Figures, view: View) -> None:
        latest = [
            fmt.age(fmt.since(g.last_at, figures.now)) + " ago" if g.last_at else "-" for g in figures.dead_groups
        ]
        width = last_column_width(
            self.size.width,
            [
                ["count", *(fmt.count(g.count) for g in figures.dead_groups)],
                ["kind", *(g.kind for g in figures.dead_groups)],
                ["latest", *latest],
            ],
        )
        # A group's key is its kind and error, so the selection follows the group as counts change.
        fill(
            self.query_one(Table),
            [
                (
                    group_key(g),
                    [
                        right(fmt.count(g.count), "bold"),
                        left(g.kind),
                        right(when),
                        left(fmt.short_error(g.error, width) or "(no error)"),
                    ],
                )
                for g, when in zip(figures.dead_groups, latest, strict=True)
            ],
        )


def group_key(group: fig.DeadGroup) -> str:
    return f"{group.kind}\x00{'' if group.error is None else '=' + group.error}"


def group_scope(key: str) -> Scope:
    kind, _, error = key.partition("\x00")
    return Scope(kind=kind, error=error[1:] if error else None, by_error=True)


# --- supervisors and their workers ---------------------------------------------------------------


class WorkersPanel(Panel):
    TITLE = "supervisors and workers"

    def compose(self) -> ComposeResult:
        yield Static(id="supervisors")
        yield Table(
            [
                ("sup", "sup", False),
                ("pid", "pid", True),
                ("state", "state", False),
                ("job", "job", True),
                ("kind", "kind", False),
                ("for", "for", True),
                ("rss", "rss", True),
                ("cpu", "cpu%", True),
                ("done", "done", True),
                ("restarts", "rst", True),
                ("exit", "last exit", False),
            ],
            id="workers",
        )

    def show(self, figures: Figures, view: View) -> None:
        lines = []
        rows = []
        for sup in figures.supervisors:
            stale = sup.stale(view.stale_after)
            mark = Text("✖ STALE " if stale else "● ", style=view.error if stale else view.success)
            # One line each, whatever the width: the queues, the longest part, come last and are cut.
            line = Text.assemble(
                mark,
                (f"{sup.host}:{sup.pid}", "bold"),
                (f"  {sup.state}", view.warning) if sup.state != "running" else "",
                (f"  heartbeat {fmt.age(sup.heartbeat_age)} ago", view.error if stale else "dim"),
                f"  up {fmt.age(fmt.since(sup.started_at, figures.now))}  {sup.procs} procs"
                f"  {fmt.count(sup.jobs_done)} done  queues {','.join(sup.queues)}",
            )
            if self.size.width:  # 0 while its tab is hidden: cut when shown (on_resize redraws)
                line.truncate(max(10, self.size.width - 2), overflow="ellipsis")
            lines.append(line)
            tag = f"{sup.pid}"
            for w in sup.workers:
                busy_for = fmt.since(w.job_started_at, figures.now) if w.state == "busy" else None
                state, job, kind = w.state, str(w.job_id) if w.job_id is not None else "-", w.kind or "-"
                if w.behind:  # handed out behind it, not started: "662 +2"
                    job = f"{job} +{w.behind}"
                if w.shared is not None:  # jobs that share the process: k of its capacity, the loop's lag
                    state = "blocked" if w.blocked_by is not None else state
                    job = f"{w.shared}/{w.capacity}"
                    kind = f"blocked by {w.blocked_by}" if w.blocked_by is not None else f"shared, lag {fmt.lag(w.lag)}"
                state_style = view.accent if state == "busy" else ("dim" if state == "idle" else "")
                cells = [
                    left(tag, "dim" if stale else ""),
                    right(str(w.pid)),
                    left(state, view.error if state == "blocked" else state_style),
                    right(job),
                    left(kind, view.error if w.blocked_by is not None else ""),
                    right(fmt.age(busy_for)),
                    right(fmt.size(w.rss)),
                    right("-" if w.cpu is None else f"{w.cpu:.0f}"),
                    right(fmt.count(w.jobs_done)),
                    right(str(w.restarts), view.warning if w.restarts else ""),
                ]
                key = f"{sup.id}\x00{w.pid}" + (f"\x00{w.job_id}" if w.job_id is not None else "")
                rows.append((key, cells, w.last_exit))
        if not lines:
            lines.append(Text("no supervisor is running: jobsup start --app module:app", style="dim"))
        self.query_one("#supervisors", Static).update(Text("\n").join(lines))
        headers = ["sup", "pid", "state", "job", "kind", "for", "rss", "cpu%", "done", "rst"]
        width = last_column_width(
            self.size.width, [[h, *(r[1][i].plain for r in rows)] for i, h in enumerate(headers)], 8
        )
        fill(
            self.query_one(Table),
            [(key, [*cells, left(fmt.short_error(exit_, width) or "-")]) for key, cells, exit_ in rows],
        )


def worker_job(key: str | None) -> int | None:
    parts = (key or "").split("\x00")
    return int(parts[2]) if len(parts) == 3 else None


# --- reaper activity ------------------------------------------------------------------------------


class ReaperPanel(Panel):
    TITLE = "reaper: jobs returned from expired leases"

    def compose(self) -> ComposeResult:
        with Horizontal(classes="spark-row"):
            yield Label("", id="reaped-label", classes="spark-label")
            yield Sparkline([], id="reaped-spark")
        yield Table(
            [
                ("at", "when", True),
                ("by", "by", False),
                ("count", "jobs", True),
                ("dead", "dead", True),
                ("from", "from", False),
                ("ids", "ids", False),
            ],
            id="reaper",
        )

    def show(self, figures: Figures, view: View) -> None:
        series = figures.reaped_per_minute
        self.border_subtitle = "" if figures.reaper_passes else "no reaper has returned a job yet"
        self.query_one("#reaped-label", Label).update(
            Text.assemble(("rescued", "bold"), f" {sum(series):>5,}/{len(series)}m")
        )
        self.query_one("#reaped-spark", Sparkline).data = [float(n) for n in series] if len(series) > 1 else []
        cells = [
            [
                fmt.age(fmt.since(p.at, figures.now)) + " ago",
                p.supervisor or "-",
                fmt.count(p.count),
                fmt.count(p.dead),
                ", ".join(p.sources) or "-",
            ]
            for p in figures.reaper_passes
        ]
        headers = ["when", "by", "jobs", "dead", "from"]
        width = last_column_width(self.size.width, list(zip(headers, *cells, strict=True)), 8)
        fill(
            self.query_one(Table),
            [
                (
                    str(p.id),
                    [
                        right(c[0]),
                        left(c[1]),
                        right(c[2]),
                        right(c[3], view.error if p.dead else ""),
                        left(c[4]),
                        left(fmt.id_list(p.job_ids, width)),
                    ],
                )
                for p, c in zip(figures.reaper_passes, cells, strict=True)
            ],
        )
