"""The tabs of `jobsup top`: one resource per pane, as in k9s and Sidekiq's kiq, switched by a key.

The tabs are data: the app builds the tab bar, the keys 1…n, the help screen and the command palette
from TABS, and Tab / Shift+Tab walk the panels of every tab in this order. Adding a tab is a Pane
subclass with its TAB, and one more entry in TABS. A tab owns the writes its tables offer (writes.py):
their keys are its bindings, in the footer only while a table whose rows they take has the focus.

On a terminal of at least PINNED_SIZE the first tab (Jobs) stays in view above the tab bar and the
other tabs share the rest; below it each tab has the whole screen (see top.tcss).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rich.style import Style
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable

from jobsup.monitor import formats as fmt
from jobsup.monitor import writes
from jobsup.monitor.figures import Figures
from jobsup.monitor.latency_panels import AttemptsPanel, LatencyPanel, LeasesPanel
from jobsup.monitor.limits_panels import LimitsPanel, OpenThrottled
from jobsup.monitor.panels import (
    DeadPanel,
    GroupsPanel,
    KindsPanel,
    QueuesPanel,
    ReaperPanel,
    ThroughputPanel,
    View,
    WorkersPanel,
    selected_key,
    worker_job,
)
from jobsup.monitor.workflow_panels import OpenJob, OpenWorkflow, WorkflowsPanel

# Columns and lines from which the first tab stays in view above the others (and panels sit side by side
# from the same width). 160×48 is such a size; 80×24, a fresh terminal's, is not.
WIDE = 120
TALL = 40


@dataclass(frozen=True)
class Tab:
    id: str  # the pane's id is pane-<id>; the action show_tab('<id>') shows it
    title: str
    key: str
    description: str  # for the help screen and the command palette


class Pane(Vertical):
    """The content of one tab."""

    TAB: ClassVar[Tab]
    # The writes the tab offers (bound in BINDINGS): each action and the tables whose selection it takes.
    # Elsewhere (another table, a --read-only console) it is hidden and its key falls through to the
    # app's, which says why nothing happens.
    TAKES: ClassVar[dict[str, frozenset[str]]] = {}

    def __init__(self) -> None:
        super().__init__(id=f"pane-{self.TAB.id}", classes="pane")

    def badge(self, figures: Figures, view: View) -> str:
        """A short figure beside the tab's title in the tab bar (what it holds), or nothing."""
        return ""

    def offered(self, figures: Figures | None) -> bool:
        """Whether the tab bar and Tab offer this tab; its key shows it either way."""
        return True

    def first_table(self) -> DataTable | None:
        return next(iter(self.query(DataTable)), None)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        tables = self.TAKES.get(action)
        if tables is None:
            return True
        focused = writes.focused_table(self.app)
        if writes.console(self).read_only or focused is None or focused.id not in tables:
            return False
        # r takes the selected job, L the selected kind: an empty table (a filter that matches none) has none.
        return action not in ("requeue", "limit") or selected_key(focused) is not None

    def action_requeue_scope(self) -> None:
        writes.requeue_selected_scope(self.app)


class JobsPane(Pane):
    TAB = Tab("jobs", "Jobs", "1", "counts by kind, queues, throughput")
    BINDINGS: ClassVar[list[BindingType]] = [writes.REQUEUE_SCOPE, writes.PAUSE, writes.RESUME]
    # R on a kind's row requeues its dead jobs, on the total row all of them.
    TAKES = {"requeue_scope": frozenset({"kinds"}), "queue": frozenset({"queues"})}

    def action_queue(self, action: str) -> None:
        writes.queue_selected(self.app, action)

    def compose(self) -> ComposeResult:
        with Horizontal(classes="split"):
            yield KindsPanel(id="kinds-panel")
            with Vertical(id="side"):
                yield QueuesPanel(id="queues-panel")
                yield ThroughputPanel(id="throughput-panel")


class DeadPane(Pane):
    TAB = Tab("dead", "Dead", "2", "dead jobs, newest first; grouped by error")
    BINDINGS: ClassVar[list[BindingType]] = [writes.REQUEUE, writes.REQUEUE_SCOPE]
    TAKES = {"requeue": frozenset({"dead"}), "requeue_scope": frozenset({"dead", "groups"})}

    def action_requeue(self) -> None:
        writes.requeue_selected(self.app)

    @on(DataTable.RowSelected, "#dead")
    def _open_job(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:  # a dead job's row is keyed by its id
            self.post_message(OpenJob(int(event.row_key.value)))

    def compose(self) -> ComposeResult:
        with Horizontal(classes="split"):
            yield DeadPanel(id="dead-panel")
            yield GroupsPanel(id="groups-panel")

    def badge(self, figures: Figures, view: View) -> str:
        total = figures.total.dead
        if not total:
            return ""
        if figures.dead_matching is not None:  # filtered: what the tab shows, of how many
            return f"{fmt.count(figures.dead_matching)} of {fmt.count(total)}"
        return fmt.count(total)


class WorkersPane(Pane):
    TAB = Tab("workers", "Workers", "3", "supervisors and their workers")
    BINDINGS: ClassVar[list[BindingType]] = [writes.CANCEL]
    TAKES = {"cancel_job": frozenset({"workers"})}

    def action_cancel_job(self) -> None:
        writes.cancel_selected(self.app)

    @on(DataTable.RowSelected, "#workers")
    def _open_job(self, event: DataTable.RowSelected) -> None:
        job_id = worker_job(event.row_key.value)  # a busy worker's row names its job
        if job_id is not None:
            self.post_message(OpenJob(job_id))

    def compose(self) -> ComposeResult:
        yield WorkersPanel(id="workers-panel")

    def badge(self, figures: Figures, view: View) -> str:
        workers = [w for s in figures.live_supervisors(view.stale_after) for w in s.workers]
        return f"{sum(w.state == 'busy' for w in workers)}/{len(workers)}" if workers else ""


class ReaperPane(Pane):
    TAB = Tab("reaper", "Reaper", "4", "jobs returned from expired leases")

    def compose(self) -> ComposeResult:
        yield ReaperPanel(id="reaper-panel")

    def badge(self, figures: Figures, view: View) -> str:
        rescued = sum(figures.reaped_per_minute)
        return fmt.count(rescued) if rescued else ""


class LatencyPane(Pane):
    TAB = Tab("latency", "Latency", "5", "queue latency and run time per kind, expiring leases, attempts")

    def compose(self) -> ComposeResult:
        yield LatencyPanel(id="latency-panel")
        with Horizontal(id="latency-lower"):  # side by side at any width: both are narrow
            yield LeasesPanel(id="leases-panel")
            yield AttemptsPanel(id="attempts-panel")

    def badge(self, figures: Figures, view: View) -> str:
        rising = sum(k.rising for k in figures.latency)
        return f"↑{rising}" if rising else ""


class LimitsPane(Pane):
    TAB = Tab("limits", "Limits", "6", "each limited kind and its busiest keys: held, starts, throttled")
    BINDINGS: ClassVar[list[BindingType]] = [writes.LIMIT]
    TAKES = {"limit": frozenset({"limits"})}

    def action_limit(self) -> None:
        writes.limit_selected(self.app)

    @on(DataTable.RowSelected, "#limits")
    def _open_throttled(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:  # a kind's row, or one of its keys' ("kind\x00key")
            kind, _, key = event.row_key.value.partition("\x00")
            self.post_message(OpenThrottled(kind, key or None))

    def compose(self) -> ComposeResult:
        yield LimitsPanel(id="limits-panel")

    def badge(self, figures: Figures, view: View) -> str:
        throttled = sum(k.throttled for k in figures.limits)
        capped = any(k.throttled_capped for k in figures.limits)
        return fmt.count(throttled) + ("+" if capped else "") if throttled else ""

    def offered(self, figures: Figures | None) -> bool:
        # Most queues limit nothing: the tab joins the bar (and Tab's round) once a kind has a limit.
        return figures is not None and bool(figures.limits)


class WorkflowsPane(Pane):
    TAB = Tab("workflows", "Workflows", "7", "the newest workflows and their progress; Enter: one as a tree")

    @on(DataTable.RowSelected, "#workflows")
    def _open_workflow(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self.post_message(OpenWorkflow(int(event.row_key.value)))

    def compose(self) -> ComposeResult:
        yield WorkflowsPanel(id="workflows-panel")

    def badge(self, figures: Figures, view: View) -> str:
        return fmt.count(figures.workflows_unfinished) if figures.workflows_unfinished else ""

    def offered(self, figures: Figures | None) -> bool:
        # As the Limits tab: in the bar (and Tab's round) once there is a workflow.
        return figures is not None and figures.workflows_listed > 0


TABS: tuple[type[Pane], ...] = (
    JobsPane,
    DeadPane,
    WorkersPane,
    ReaperPane,
    LatencyPane,
    LimitsPane,
    WorkflowsPane,
)
PINNED = TABS[0].TAB.id  # the tab kept in view on a large terminal


@dataclass
class Tabs:
    """Which tab has the focus, and which one shows below the pinned tab on a large terminal.

    >>> t = Tabs()
    >>> t.select("workers"); t.select("jobs")
    >>> t.tab, t.lower, t.visible("workers", pinned=True), t.visible("workers", pinned=False)
    ('jobs', 'workers', True, False)
    """

    tab: str = PINNED
    lower: str = TABS[1].TAB.id

    def select(self, tab: str) -> None:
        self.tab = tab
        if tab != PINNED:
            self.lower = tab

    def visible(self, tab: str, pinned: bool) -> bool:
        return tab in (PINNED, self.lower) if pinned else tab == self.tab

    def marked(self, pinned: bool) -> str:
        """The tab the tab bar marks: the one below it when the first tab is pinned above it."""
        return self.lower if pinned else self.tab


def tab_bar(
    tabs: Sequence[tuple[Tab, str]], shown: str, active: str, inactive: str = "", width: int | None = None
) -> Text:
    """One line: each tab's key, title and badge; `shown` in the `active` style. A click shows a tab.
    Wider than `width` (80 columns with seven tabs and their badges), the tabs lose the space between
    them, then the others than `shown` their titles: every key and badge stays in view, a badge without
    its title in parentheses, so that it never reads as the next tab's key.

    >>> tabs = [(Tab("jobs", "Jobs", "1", ""), ""), (Tab("dead", "Dead", "2", ""), "445")]
    >>> tabs.append((Tab("workers", "Workers", "3", ""), "4/4"))
    >>> tab_bar(tabs, "dead", "reverse").plain
    ' 1 Jobs  [2 Dead 445]  3 Workers 4/4 '
    >>> tab_bar(tabs, "dead", "reverse", width=35).plain
    ' 1 Jobs [2 Dead 445] 3 Workers 4/4 '
    >>> tab_bar(tabs, "jobs", "reverse", width=30).plain
    '[1 Jobs] 2(445)  3(4/4) '
    """
    bar = _tab_bar(tabs, shown, active, inactive, gap=" ", titled=True)
    if width is not None and bar.cell_len > width:
        bar = _tab_bar(tabs, shown, active, inactive, gap="", titled=True)
        if bar.cell_len > width:
            bar = _tab_bar(tabs, shown, active, inactive, gap="", titled=False)
    return bar


def _tab_bar(tabs: Sequence[tuple[Tab, str]], shown: str, active: str, inactive: str, gap: str, titled: bool) -> Text:
    out = Text()
    for n, (tab, badge) in enumerate(tabs):
        if n:
            out.append(gap)
        style = Style.parse(active if tab.id == shown else inactive or "none") + Style(
            meta={"@click": f"app.show_tab({tab.id!r})"}
        )
        # Brackets too, not only the colour: the shown tab stays plain on a monochrome terminal.
        edges = "[]" if tab.id == shown else "  "
        title = f" {tab.title}" if titled or tab.id == shown else ""
        if badge:
            badge = f" {badge}" if title else f"({badge})"
        out.append(Text.assemble(f"{edges[0]}{tab.key}", (title, "bold"), badge, edges[1], style=style))
    return out
