"""The Workflows tab of `jobsup top` and a workflow's tree.

The tab lists the newest workflows with their progress (jobsup.ops.workflows.recent, read only while the
tab is in view). Enter on one opens its tree, a screen of its own that reads the workflow again every
refresh (jobsup.ops.workflows.show): each job under its first parent, a wide fan-out of one kind folded
into one line (jobsup.ops.workflow_tree). Enter on a job opens the job screen, which lists its parents and
children; Enter on a folded line unfolds it, and folds it again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, tzinfo

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from jobsup.errors import DatabaseUnavailable
from jobsup.monitor import figures as fig
from jobsup.monitor import formats as fmt
from jobsup.monitor.figures import Figures
from jobsup.monitor.panels import Panel, Table, View, fill, last_column_width, left, right, status_style
from jobsup.monitor.source import Source
from jobsup.ops.workflow_tree import ENDED, STATUSES, Line, tree
from jobsup.ops.workflows import Progress, WorkflowView

Column = tuple[str, str, bool]  # key, label, whether it holds numbers (right-aligned)
COLUMNS: tuple[Column, ...] = (
    ("id", "id", True),
    ("name", "name", False),
    ("created", "created", True),
    ("done", "done", True),
    ("failed", "failed", True),
    ("running", "run", True),
    ("queued", "queued", True),
    ("waiting", "wait", True),
    ("progress", "progress", False),
)
TREE_COLUMNS: tuple[Column, ...] = (
    ("job", "job", False),
    ("status", "status", False),
    ("attempts", "att", True),
    ("started", "started", True),
    ("took", "took", True),
    ("note", "", False),
)
# Below this many columns the tree leaves out when its jobs started (how long they took stays): the
# note, what a fold counts or why a job ended, needs the room more.
NARROW = 100
# More siblings of one kind than this are folded into one line: fewer than `jobsup workflow` (20), since a
# fold here opens with Enter and a terminal of 24 lines shows a dozen of the tree's.
FANOUT = 5
BAR_WIDTHS = (6, 30)  # cells of a progress bar in the list: at least, at most (what is left between)
BAR_TAIL = len(" 100% finished")  # what follows the bar in its cell


def columns(table: DataTable, wanted: list[Column]) -> dict[str, Column]:
    """The table's columns made `wanted` (key, label, is_number) if they differ, which clears its rows;
    those but the last, the one that takes the room left, by key."""
    if [c.key.value for c in table.ordered_columns] != [key for key, _, _ in wanted]:
        table.clear(columns=True)
        for key, label, is_number in wanted:
            table.add_column(Text(label, justify="right") if is_number else label, key=key)
    return {c[0]: c for c in wanted[:-1]}


def only(cells: list[Text], of: Sequence[Column], shown: Mapping[str, Column]) -> list[Text]:
    """The cells of a row made for every column `of` a table, but those of the columns shown."""
    return [cell for cell, (key, _, _) in zip(cells, of, strict=False) if key in shown]


def room_left(width: int, shown: Mapping[str, Column], rows: list[list[Text]], floor: int = 16) -> int:
    """Cells left for the last column of a panel `width` wide, after the `shown` ones and their `rows`."""
    texts = [[label, *(row[i].plain for row in rows)] for i, (_, label, _) in enumerate(shown.values())]
    return last_column_width(width, texts, floor)


def bar(done: int, failed: int, total: int, width: int, view: View) -> Text:
    """A progress bar of `width` cells and the share ended: done jobs in the success colour, dead or
    cancelled ones in the error colour (one cell at least), the rest dotted.

    >>> print(bar(5, 1, 12, 10, View()).plain)
    ████▏█···· 50%
    >>> print(bar(0, 0, 0, 4, View()).plain)
    ···· 0%
    """
    eighths = round(fmt.progress(done, 0, total) * width * 8) if total else 0
    # One cell at least for a single failure among thousands: a failure is what the eye looks for.
    failed_cells = min(width, max(1, round(failed / total * width))) if failed and total else 0
    full, part = divmod(eighths, 8)
    full = min(full, width - failed_cells)
    done_text = "█" * full + (" ▏▎▍▌▋▊▉"[part] if part and full < width - failed_cells else "")
    out = Text(done_text, style=view.success)
    out.append("█" * failed_cells, style=view.error.replace("reverse", "").strip() or "bold")
    out.append("·" * max(0, width - len(done_text) - failed_cells), style="dim")
    out.append(f" {fmt.percent(fmt.progress(done, failed, total))}")
    return out


def finished(w: Progress) -> bool:
    """Whether every job of the workflow has ended (or the pruner has found it so)."""
    return w.finished_at is not None or (w.total > 0 and w.done + w.failed == w.total)


class WorkflowsPanel(Panel):
    TITLE = "workflows, newest first"

    def compose(self) -> ComposeResult:
        yield Table(COLUMNS, id="workflows")

    def show(self, figures: Figures, view: View) -> None:
        if figures.workflows is None:  # not read this refresh (the tab was out of view): keep what is shown
            return
        listed = figures.workflows
        if not listed:
            self.border_subtitle = "no workflow yet: app.workflow(name), then add jobs and enqueue it"
        else:
            self.border_subtitle = "Enter: its tree" + (
                f" · the newest {fig.WORKFLOWS_LISTED}" if len(listed) >= fig.WORKFLOWS_LISTED else ""
            )
        table = self.query_one(Table)
        # Below NARROW columns the list leaves out when each was created and its queued jobs (the tree has
        # both): the bar needs the room.
        narrow = 0 < self.size.width < NARROW
        shown = columns(table, [c for c in COLUMNS if not (narrow and c[0] in ("created", "queued"))])
        cells = [only(self._cells(w, figures.now, view), COLUMNS, shown) for w in listed]
        room = room_left(self.size.width, shown, cells, 0)
        fill(
            table,
            [
                (str(w.id), [*c, self._progress(w, min(max(BAR_WIDTHS[0], room - BAR_TAIL), BAR_WIDTHS[1]), view)])
                for w, c in zip(listed, cells, strict=True)
            ],
        )

    @staticmethod
    def _cells(w: Progress, now: datetime, view: View) -> list[Text]:
        return [
            right(str(w.id)),
            left(w.name or "-", "" if w.name else "dim"),
            right(fmt.age(fmt.since(w.created_at, now)) + " ago"),
            right(f"{w.done:,}/{w.total:,}", view.success if finished(w) and not w.failed else ""),
            right(fmt.count(w.failed), status_style("dead", view) if w.failed else ""),
            right(fmt.count(w.running), status_style("running", view) if w.running else ""),
            right(fmt.count(w.queued)),
            right(fmt.count(w.waiting), status_style("waiting", view)),
        ]

    @staticmethod
    def _progress(w: Progress, width: int, view: View) -> Text:
        out = bar(w.done, w.failed, w.total, width, view)
        if finished(w):
            out.append(" finished", style=view.error if w.failed else view.success)
        return out


class OpenJob(Message):
    """Open the job screen of a job (the app's, so a requeue from it works as from any table)."""

    def __init__(self, job_id: int) -> None:
        super().__init__()
        self.job_id = job_id


class OpenWorkflow(Message):
    """Open a workflow's tree, on a screen of its own."""

    def __init__(self, workflow_id: int) -> None:
        super().__init__()
        self.workflow_id = workflow_id


class WorkflowReady(Message):
    def __init__(self, workflow: WorkflowView | None) -> None:
        super().__init__()
        self.workflow = workflow


class WorkflowScreen(Screen[None]):
    """One workflow as a tree, read again every `refresh` seconds through `source`."""

    # Enter is the table's own (RowSelected): the border's subtitle says what it does here.
    BINDINGS = [Binding("escape,q", "close", "Close", key_display="Esc")]

    def __init__(
        self,
        source: Source,
        workflow_id: int,
        clock: Callable[[], datetime | None],
        view: Callable[[], View],
        *,
        refresh: float = fig.DEFAULT_REFRESH,
        tz: tzinfo | None = None,
    ) -> None:
        super().__init__()
        self.source = source
        self.workflow_id = workflow_id
        self.clock = clock  # the database's time now, as the main screen's figures tell it
        self.view = view  # the theme's colours, as the main screen's panels have them
        self.refresh_every = refresh
        self.tz = tz
        self.workflow: WorkflowView | None = None
        self.expanded: set[str] = set()  # the keys of the folded lines unfolded
        self.lines: list[Line] = []
        self.loads = 0  # successful reads, for tests
        self._loading = False
        self._gone = False

    def compose(self) -> ComposeResult:
        yield Static(Text(f"jobsup top · workflow {self.workflow_id}", style="bold"), id="title")
        with Vertical(id="workflow-panel") as box:
            box.border_title = f"workflow {self.workflow_id}"
            box.border_subtitle = "Enter: open a job, unfold or fold a line · Esc back"
            yield Static(Text("reading the workflow…", style="dim"), id="workflow-head")
            yield Table(TREE_COLUMNS, id="workflow-tree")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#workflow-tree", DataTable).focus()
        self.set_interval(self.refresh_every, self.reload)
        self.reload()

    def on_resize(self) -> None:
        self._show()

    def reload(self) -> None:
        if not self._loading and not self._gone:  # one read at a time: a slow database does not pile them up
            self._loading = True
            self.run_worker(self._load(), name="workflow", group="workflow", exit_on_error=False)

    async def _load(self) -> None:
        try:
            self.post_message(WorkflowReady(await self.source.workflow(self.workflow_id)))
        except DatabaseUnavailable as exc:
            self.query_one("#workflow-panel").border_subtitle = f"database unavailable: {exc}"
        finally:
            self._loading = False

    def on_workflow_ready(self, message: WorkflowReady) -> None:
        if message.workflow is None:
            self._gone = True
            self.query_one("#workflow-head", Static).update(
                Text(f"workflow {self.workflow_id} no longer exists (pruned)", style="bold")
            )
            return
        self.workflow = message.workflow
        self.loads += 1
        self._show()

    def _now(self) -> datetime:
        now = self.clock()
        if now is not None:
            return now
        return self.workflow.created_at if self.workflow else datetime.now().astimezone()

    def _show(self) -> None:
        w = self.workflow
        if w is None:
            return
        view, now = self.view(), self._now()
        self.query_one("#workflow-panel").border_title = f"workflow {w.id}" + (f" · {w.name}" if w.name else "")
        self.query_one("#workflow-head", Static).update(self._head(w, now, view))
        self.lines = tree(w, self.expanded, fanout=FANOUT)
        width = self.query_one("#workflow-panel").size.width
        table = self.query_one("#workflow-tree", DataTable)
        shown = columns(table, [c for c in TREE_COLUMNS if c[0] != "started" or width >= NARROW])
        cells = [only(tree_cells(line, now, view), TREE_COLUMNS, shown) for line in self.lines]
        room = room_left(width, shown, cells)
        fill(table, [(line.key, [*c, note(line, room, view)]) for line, c in zip(self.lines, cells, strict=True)])

    def _head(self, w: WorkflowView, now: datetime, view: View) -> Text:
        """Two lines: when it was made (and finished), and its jobs counted by status with a bar."""
        counts = w.counts()
        total = sum(counts.values())
        failed = counts["dead"] + counts["cancelled"]
        created = w.created_at.astimezone(self.tz)
        first = Text.assemble(
            ("created ", "dim"),
            f"{created:%Y-%m-%d %H:%M:%S} ({fmt.age(fmt.since(w.created_at, now))} ago)",
        )
        if w.finished_at is not None:
            first.append("  finished ", style="dim")
            first.append(f"{w.finished_at.astimezone(self.tz):%H:%M:%S}" + (" with failures" if w.failed else ""))
        second = bar(counts["done"], failed, total, 20, view)
        second.append(f"  {counts['done']:,}/{total:,} done", style="bold")
        for status in STATUSES:
            if counts[status] and status != "done":
                second.append("  ")
                second.append(f"{counts[status]:,} {status}", style=status_style(status, view))
        return Text("\n").join([first, second])

    @on(DataTable.RowSelected, "#workflow-tree")
    def _selected(self, event: DataTable.RowSelected) -> None:
        event.stop()  # not the app's: it opens jobs of its own tables
        line = next((line for line in self.lines if line.key == event.row_key.value), None)
        if line is None:
            return
        if line.job is not None:
            self.app.post_message(OpenJob(line.job.id))
            return
        self.expanded.symmetric_difference_update({line.key})
        self._show()

    def action_close(self) -> None:
        self.dismiss(None)


def tree_cells(line: Line, now: datetime, view: View) -> list[Text]:
    """A line's cells but its note: the job (or fold) drawn in the tree, its status, attempts and times."""
    started = [m.started_at for m in line.members if m.started_at is not None]
    first_start = min(started) if started else None
    ended = all(m.status in ENDED for m in line.members)
    done_times = [m.done_at for m in line.members if m.done_at is not None]
    until = max(done_times) if ended and done_times else now
    took = fmt.age((until - first_start).total_seconds()) if first_start else "-"
    began = fmt.age(fmt.since(first_start, now)) + " ago" if first_start else "-"
    job = line.job
    if job is None:
        mark = "▾" if line.expanded else "▸"
        counts = line.counts()
        label = Text.assemble((line.prefix, "dim"), f"{mark} {len(line.members):,} × ", (line.kind, "bold"))
        all_done = counts["done"] == len(line.members)
        status = Text(f"{counts['done']:,}/{len(line.members):,} done", style=view.success if all_done else "")
        return [label, status, right(""), right(began), right(took)]
    label = Text.assemble((line.prefix, "dim"), (str(job.id), "bold"), f" {job.kind}")
    return [
        label,
        left(job.status, status_style(job.status, view)),
        right(f"{job.attempts}/{job.max_attempts}"),
        right(began),
        right(took),
    ]


def note(line: Line, width: int, view: View) -> Text:
    """What else a line says, cut to `width`: a fold's other statuses counted; a job's other parents,
    what it still waits for, or why it ended as it did."""
    out = Text()
    job = line.job
    if job is None:
        counts = line.counts()
        for status in STATUSES:
            if counts[status] and status != "done":  # the status column's
                out.append(" · " if out else "")
                out.append(f"{counts[status]:,} {status}", style=status_style(status, view))
        out.truncate(max(1, width), overflow="ellipsis")
        return out
    parts = []
    if line.more_parents:
        parts.append(f"after {line.more_parents:,} more")
    if line.outside_parents:
        parts.append(f"after {line.outside_parents:,} outside the workflow")
    if job.status == "waiting" and job.parents_left:
        parts.append(f"waits for {job.parents_left:,}")
    out.append(" · ".join(parts), style="dim")
    if job.status in ("dead", "cancelled") and job.last_error:
        out.append(" · " if parts else "")
        out.append(fmt.short_error(job.last_error, max(1, width - out.cell_len)))
    out.truncate(max(1, width), overflow="ellipsis")
    return out
