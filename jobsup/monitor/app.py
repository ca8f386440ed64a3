"""`jobsup top`: the Textual application. Thin: Source reads, figures.py computes, panels.py lays out.

Every query runs in a Textual worker that never takes the app down (exit_on_error=False); results come
back as messages, and one handler reports any worker that failed. At most one refresh runs at a time.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import datetime, timedelta, tzinfo

from rich.text import Text
from textual import events
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.driver import Driver
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Static
from textual.worker import Worker, WorkerState

from jobsup.errors import DatabaseUnavailable
from jobsup.monitor import figures as fig
from jobsup.monitor import writes
from jobsup.monitor.figures import Figures
from jobsup.monitor.header import Headline, Health, Title
from jobsup.monitor.limits_panels import OpenThrottled
from jobsup.monitor.main_screen import MainScreen
from jobsup.monitor.panels import Panel, ThroughputPanel, View
from jobsup.monitor.screens import HelpScreen, JobScreen
from jobsup.monitor.source import Source
from jobsup.monitor.tabs import TABS, TALL, WIDE, WorkflowsPane
from jobsup.monitor.terminal import terminal_driver
from jobsup.monitor.workflow_panels import OpenJob, OpenWorkflow, WorkflowScreen

# The key map, as data: the footer, the help screen and the command palette all read it.
KEYS: list[Binding] = [
    Binding("p", "pause", "Pause", tooltip="pause or resume the refresh"),
    Binding("s", "schedules", "Schedules", show=False, tooltip="the schedules: run one now, pause, resume"),
    Binding("question_mark", "help", "Keys", tooltip="this list of keys"),
    Binding("q", "quit", "Quit", tooltip="quit"),
    # As htop: Ctrl+C quits, from any screen and even from the filter (Textual's own says "press ctrl+q").
    Binding("ctrl+c", "quit", show=False, priority=True, tooltip="quit, as q"),
    # In --read-only mode r, R, c, P, U and L fall through to this one, which says why nothing happens.
    Binding("r,R,c,P,U,L", "refuse", show=False),
    # The tab bar shows these keys, so the footer does not repeat them.
    *(
        Binding(
            p.TAB.key,
            f"show_tab({p.TAB.id!r})",
            p.TAB.title,
            show=False,
            tooltip=f"{p.TAB.title} tab: {p.TAB.description}",
        )
        for p in TABS
    ),
]
# Keys that are not bindings of the app, for the help screen (the tabs' own are found on them).
OTHER_KEYS = [
    ("Tab ⇧Tab", "the next / previous panel, through every tab"),
    ("↑ ↓ PgUp PgDn", "move in a panel"),
    ("Home End", "the first / last row (Home: follow the newest dead jobs again)"),
    (
        "Enter",
        "open the selected job (dead jobs, busy workers; limits: the kind's or key's next throttled job) or "
        "workflow (its tree)",
    ),
    ("Ctrl+P", "command palette"),
]


class FiguresReady(Message):
    def __init__(self, figures: Figures) -> None:
        super().__init__()
        self.figures = figures


class SourceDown(Message):
    def __init__(self, reason: str) -> None:
        super().__init__()
        self.reason = reason


class TopApp(App[None]):
    main: MainScreen  # the panels' screen; self.screen is a dialog while one is open
    CSS_PATH = "top.tcss"
    TITLE = "jobsup top"
    BINDINGS = [*KEYS]  # a new list, typed as textual's list[BindingType] (list is invariant)
    # Side by side from WIDE columns; the Jobs tab pinned above the others from WIDE × TALL (top.tcss).
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (WIDE, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (TALL, "-tall")]

    def __init__(
        self,
        source: Source,
        *,
        refresh: float = fig.DEFAULT_REFRESH,
        warn_age: float = fig.DEFAULT_WARN_AGE,
        stale_after: float = fig.STALE_AFTER,
        read_only: bool = False,
        tz: tzinfo | None = None,
    ) -> None:
        super().__init__()
        self.source = source
        self.refresh_every = refresh
        self.warn_age = warn_age
        self.stale_after = stale_after
        self.read_only = read_only or source.read_only
        self.tz = tz  # None: the terminal's local time
        self.figures: Figures | None = None
        self.previous: Figures | None = None
        self.throughput = fig.Throughput()
        self.match: str | None = None
        self.paused = False
        self.down: str | None = None  # why the last refresh failed, while the figures are stale
        self.refreshes = 0  # successful refreshes, for tests and the curious
        self._figures_at = 0.0  # time.monotonic() when the figures arrived
        self._refreshing = False
        self._again = False
        self._workflows_shown = False  # what source.list_workflows was last set to
        self._waiting_seen = False  # a job has waited for its parents (View.waiting)

    def get_driver_class(self) -> type[Driver]:
        # On the terminal, not on stderr: `jobsup top 2>file` still shows the console (terminal.py).
        return terminal_driver(super().get_driver_class())

    def get_default_screen(self) -> Screen:
        self.main = MainScreen(on_ready=self._render, on_tabs=self._render_tabs, on_filter=self._filter)
        return self.main

    def on_mount(self) -> None:
        self.theme_changed_signal.subscribe(self, lambda _theme: self._render())
        self.set_interval(self.refresh_every, self._tick)
        self.refresh_now()

    def on_resize(self, event: events.Resize) -> None:
        self.call_after_refresh(self._render)  # the tab bar reads whether the first tab is pinned

    # --- tabs: the main screen's (main_screen.py) ---------------------------------------------------

    @property
    def tab(self) -> str:
        """The tab of the focused panel."""
        return self.main.tab

    def action_show_tab(self, tab: str) -> None:
        """Show a tab and focus its first panel (the keys 1…n, the palette, a click on the tab bar)."""
        self.main.show_tab(tab)

    def action_focus_next(self) -> None:
        # Tab walks the panels of every tab, showing the tab of the next one: Tab alone reaches everything.
        if self.screen is not self.main or not self.main.cycle(1):
            super().action_focus_next()

    def action_focus_previous(self) -> None:
        if self.screen is not self.main or not self.main.cycle(-1):
            super().action_focus_previous()

    def _render_tabs(self) -> None:
        if not self.is_running or not self.main.ready or not self.main.is_attached:
            return
        self._follow_workflows()
        self.main.show_tab_bar(self._view())

    def _follow_workflows(self) -> None:
        """Refreshes read the workflows' list while their tab is in view, and at once when it comes in."""
        shown = self.main.tabs.visible(WorkflowsPane.TAB.id, self.main.pinned)
        if shown != self._workflows_shown:
            self._workflows_shown = shown
            self.source.list_workflows = shown
            if shown:
                self.refresh_now()

    # --- refreshing ----------------------------------------------------------------------------

    def _tick(self) -> None:
        if not self.paused:
            self.refresh_now()

    def refresh_now(self) -> None:
        """Start a refresh unless one is running; then one more follows it, with the latest filter."""
        if self._refreshing:
            self._again = True
            return
        self._refreshing = True
        self.run_worker(self._refresh(), name="refresh", group="refresh", exit_on_error=False)

    async def _refresh(self) -> None:
        try:
            try:
                figures = await self.source.refresh(self.match)
            except DatabaseUnavailable as exc:
                self.post_message(SourceDown(str(exc)))
            else:
                self.post_message(FiguresReady(figures))
        finally:
            self._refreshing = False
            if self._again:
                self._again = False
                self.call_later(self.refresh_now)

    def on_figures_ready(self, message: FiguresReady) -> None:
        self.previous, self.figures = self.figures, message.figures
        self.main.figures = message.figures
        self._figures_at = time.monotonic()
        total = message.figures.total
        self._waiting_seen = self._waiting_seen or total.waiting > 0
        self.throughput.add(message.figures.now.timestamp(), total.done, total.failed)
        if self.down is not None:
            self.notify("connected again", title="database")
        self.down = None
        self.refreshes += 1
        self._render()

    def on_source_down(self, message: SourceDown) -> None:
        self.down = message.reason
        self._render()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The one place a failed worker is reported: the console carries on."""
        if event.state == WorkerState.ERROR:
            error = event.worker.error
            self.notify(
                str(error) or type(error).__name__, title=f"{event.worker.name} failed", severity="error", timeout=8
            )

    # --- drawing -------------------------------------------------------------------------------

    def _view(self) -> View:
        colours = self.get_css_variables()
        changed = fig.changed(self.previous, self.figures) if self.figures else set()
        return View(
            match=self.match,
            warn_age=self.warn_age,
            stale_after=self.stale_after,
            changed=frozenset(changed),
            accent=f"bold {colours['accent']}",
            warning=f"bold {colours['warning']}",
            error=f"bold {colours['error']}",
            success=colours["success"],
            tz=self.tz,
            waiting=self._waiting_seen,
        )

    def _render(self) -> None:
        # The app is closing: a refresh that ended meanwhile has nowhere to go. `is_running` turns
        # False before the widgets are removed; `is_attached` alone misses a shutdown that does not go
        # through exit() (run_test's does not).
        if not self.is_running or not self.main.ready or not self.main.is_attached:
            return
        view = self._view()
        state = ("stale" if self.down else "paused" if self.paused else "live") if self.figures else "…"
        self.main.query_one(Title).show(
            state, self._clock(), view, self.read_only, self.source.label, self.refresh_every
        )
        banner = self.main.query_one("#banner", Static)
        banner.set_class(self.down is not None, "-shown")
        body = self.main.query_one("#body")
        body.set_class(self.down is not None, "-stale")
        if self.down is not None:
            when = f" · the figures below are from {self._clock()}" if self.figures else ""
            banner.update(Text(f"⚠ database unavailable: {self.down}{when} · reconnecting…"))
        self.main.query_one(Headline).show(self.figures, view)
        if self.figures is None:
            return
        self.main.query_one(Health).show(self.figures, view)
        for panel in self.main.query(Panel):
            panel.update(self.figures, view)
        self.main.query_one(ThroughputPanel).show_rates(self.throughput)
        self._render_tabs()
        self.refresh_bindings()  # the footer's keys follow the rows too (check_action)

    def _clock(self) -> str:
        return f"{self.figures.now.astimezone(self.tz):%H:%M:%S}" if self.figures else "-"

    def db_now(self) -> datetime | None:
        """The database's clock now, as the last figures and the time since they came tell it."""
        if self.figures is None:
            return None
        return self.figures.now + timedelta(seconds=time.monotonic() - self._figures_at)

    # --- actions -------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "refuse":
            return self.read_only
        if action == "pause":  # the refresh of the main screen's figures: not offered over another screen
            return self.screen is self.main
        return True

    def action_refuse(self) -> None:
        self.notify("this console is read-only (--read-only): nothing was changed", severity="warning")

    def _filter(self, match: str | None) -> None:
        self.match = match
        self._render()
        self.refresh_now()

    def action_pause(self) -> None:
        self.paused = not self.paused
        self._render()
        if not self.paused:
            self.refresh_now()

    def action_schedules(self) -> None:
        from jobsup.monitor.schedules import SchedulesScreen

        self.push_screen(SchedulesScreen(self.source, refresh=self.refresh_every, read_only=self.read_only, tz=self.tz))

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.key_help()))

    def key_help(self) -> list[tuple[str, str]]:
        """Every key, from the bindings themselves: the app's, each panel's (found by walking the main
        screen, so a panel's new key is listed with no more code) and the schedules screen's."""
        from jobsup.monitor.schedules import KEYS as SCHEDULE_KEYS

        keys: list[tuple[str, str]] = []

        def add(bindings: Iterable[object], prefix: str = "") -> None:
            for b in bindings:
                if not isinstance(b, Binding) or not b.tooltip:
                    continue
                if self.read_only and b.action.partition("(")[0] in (*writes.WRITES, "schedule"):
                    continue
                item = (self.get_key_display(b), prefix + b.tooltip)
                if item not in keys:
                    keys.append(item)

        add(writes.BINDINGS)
        add(MainScreen.BINDINGS)
        add(KEYS)
        for node in self.main.walk_children():
            add(type(node).BINDINGS)
        add(SCHEDULE_KEYS, "schedules (s): ")
        return keys + OTHER_KEYS

    def show_workflow(self, workflow_id: int) -> None:
        """A workflow's tree, on a screen of its own."""
        self.push_screen(
            WorkflowScreen(self.source, workflow_id, self.db_now, self._view, refresh=self.refresh_every, tz=self.tz)
        )

    # Enter on a row: the tabs (and the workflow's tree) say what it opens.

    def on_open_job(self, message: OpenJob) -> None:
        self.run_worker(self._show_job(message.job_id), name="job", exit_on_error=False)

    def on_open_throttled(self, message: OpenThrottled) -> None:
        self.run_worker(self._show_throttled(message.kind, message.key), name="job", exit_on_error=False)

    def on_open_workflow(self, message: OpenWorkflow) -> None:
        self.show_workflow(message.workflow_id)

    async def _show_throttled(self, kind: str, key: str | None) -> None:
        """The job screen of the next throttled job of a kind (or key): it says which limit holds it."""
        job_id = await self.source.next_throttled(kind, key)
        if job_id is None:
            self.notify(f"no job of kind {kind}{f' and key {key}' if key else ''} is throttled", severity="warning")
            return
        await self._show_job(job_id)

    async def _show_job(self, job_id: int) -> None:
        job = await self.source.job(job_id)
        if job is None:
            self.notify(f"job {job_id} no longer exists", severity="warning")
            return
        why = await self.source.explain(job_id)
        family = await self.source.family(job_id)
        # The job's relative times count on from the database's clock while the screen is open.
        answer = await self.push_screen_wait(
            JobScreen(
                job,
                lambda: self.db_now() or job["created_at"],
                tz=self.tz,
                read_only=self.read_only,
                why=why,
                family=family,
                view=self._view(),
            )
        )
        if answer == "requeue":
            await writes.requeue(self, [job_id], None, f"dead job {job_id} ({job['kind']})")

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        if not self.read_only:
            yield SystemCommand(
                "Requeue the selected dead job",
                "r: the job under the cursor of the dead jobs table",
                lambda: writes.requeue_selected(self),
            )
            yield SystemCommand(
                "Requeue dead jobs of the selection…",
                "R: the selected kind or error group, or all; asks first",
                lambda: writes.requeue_selected_scope(self),
            )
            yield SystemCommand(
                "Cancel the selected worker's job…",
                "c: in the workers table; asks first",
                lambda: writes.cancel_selected(self),
            )
            yield SystemCommand(
                "Pause the selected queue…",
                "P: in the queues table; asks first",
                lambda: writes.queue_selected(self, "pause"),
            )
            yield SystemCommand(
                "Resume the selected queue…",
                "U: in the queues table; asks first",
                lambda: writes.queue_selected(self, "resume"),
            )
            yield SystemCommand(
                "Change the limits of the selected kind…",
                "L: in the limits table; asks first",
                lambda: writes.limit_selected(self),
            )
        yield SystemCommand("Filter by kind or queue", "/", self.main.action_filter)
        yield SystemCommand("Clear the filter", "Esc", self.main.action_clear_filter)
        yield SystemCommand("Pause or resume the refresh", "p", self.action_pause)
        yield SystemCommand("Show the keys", "?", self.action_help)
        for pane in TABS:
            yield SystemCommand(
                f"Show the {pane.TAB.title} tab",
                f"{pane.TAB.key}: {pane.TAB.description}",
                lambda tab=pane.TAB.id: self.action_show_tab(tab),
            )

    async def on_unmount(self) -> None:
        await self.source.close()
