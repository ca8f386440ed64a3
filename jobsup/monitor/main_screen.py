"""The console's main screen: the header lines (header.py), the filter, the tabs and their bar, the footer. It owns
what moves around it: which tab is shown (a key, a click, the focus), Tab and Shift+Tab through the
panels of every tab, and the filter's box. The app (app.py) owns the figures and draws them on it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Static

from jobsup.monitor import writes
from jobsup.monitor.figures import Figures
from jobsup.monitor.header import Headline, Health, Title
from jobsup.monitor.panels import View
from jobsup.monitor.tabs import TABS, Pane, Tabs, tab_bar


class FilterInput(Input):
    # Shown in the footer while the filter has the focus (the app's letter keys are typed into it then).
    BINDINGS = [Binding("enter", "submit", "Keep the filter"), Binding("escape", "screen.clear_filter", "Clear it")]


class MainScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        # A priority binding runs as the key arrives, before the keys typed after it are handed to the
        # widget that has the focus now: so "/email" typed fast lands in the filter whole.
        Binding(
            "slash",
            "filter",
            "Filter",
            priority=True,
            tooltip="show only a kind or queue whose name contains the text",
        ),
        Binding("escape", "clear_filter", "Clear filter", show=False, tooltip="clear the filter"),
    ]

    def __init__(
        self, on_ready: Callable[[], None], on_tabs: Callable[[], None], on_filter: Callable[[str | None], None]
    ) -> None:
        """`on_ready` is called once its widgets are there to draw on, `on_tabs` when another tab shows,
        `on_filter` when the filter's text changes."""
        super().__init__()
        self.ready = False
        self.tabs = Tabs()
        self.figures: Figures | None = None  # the app's latest: which tabs have something to offer
        self.match: str | None = None
        self._on_ready = on_ready
        self._on_tabs = on_tabs
        self._on_filter = on_filter
        self._before_filter: DataTable | None = None

    def compose(self) -> ComposeResult:
        yield Title(id="title")
        yield Static(id="banner")
        yield Headline(id="headline")
        yield Health(id="health")
        # Up here, not above the footer: notifications appear bottom right and would cover it.
        yield FilterInput(placeholder="filter: part of a kind or queue name (Enter keeps it, Esc clears)", id="filter")
        with Vertical(id="body"):
            first, *others = TABS
            yield first()
            # Docked to the top of the body, unless the first tab is pinned: then between it and the rest.
            yield Static(id="tabbar")
            for pane in others:
                yield pane()
        yield Footer()

    def on_mount(self) -> None:
        self.ready = True
        self.select_tab(self.tabs.tab)
        self.query_one("#kinds", DataTable).focus()
        self._on_ready()

    # --- tabs ------------------------------------------------------------------------------------

    @property
    def pinned(self) -> bool:
        """Whether the first tab stays in view above the others (a terminal of at least WIDE × TALL)."""
        return self.has_class("-wide") and self.has_class("-tall")

    @property
    def tab(self) -> str:
        """The tab of the focused panel."""
        return self.tabs.tab

    def select_tab(self, tab: str) -> None:
        self.tabs.select(tab)
        for pane in self.query(Pane):
            pane.set_class(pane.TAB.id == self.tabs.tab, "-active")
            pane.set_class(pane.TAB.id == self.tabs.lower, "-lower")
        self._on_tabs()

    def show_tab(self, tab: str) -> None:
        """Show a tab and focus its first panel."""
        self.select_tab(tab)
        table = self.query_one(f"#pane-{tab}", Pane).first_table()
        if table is not None:
            # After the next layout: a table that was hidden cannot take the focus yet.
            self.call_after_refresh(table.focus)

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        """The tab follows the focus, whether it came from Tab, a key or a click."""
        pane = next((node for node in event.widget.ancestors if isinstance(node, Pane)), None)
        if pane is not None and pane.TAB.id != self.tab:
            self.select_tab(pane.TAB.id)

    def panes(self) -> list[Pane]:
        """The panes the tab bar and Tab offer: those with something to show, and the one shown."""
        shown = (self.tab, self.tabs.marked(self.pinned))
        return [p for p in self.query(Pane) if p.offered(self.figures) or p.TAB.id in shown]

    def cycle(self, step: int) -> bool:
        """Focus the next (`step` 1) or previous (-1) panel of every tab, showing its tab; False while the
        filter has the focus, whose Tab moves as in any form."""
        if isinstance(self.focused, Input):
            return False
        tables = [t for pane in self.panes() for t in pane.query(DataTable)]
        focused = self.focused
        here = tables.index(focused) if focused in tables else -1 if step > 0 else 0
        table = tables[(here + step) % len(tables)]
        pane = next(node for node in table.ancestors if isinstance(node, Pane))
        if not self.tabs.visible(pane.TAB.id, self.pinned):
            self.select_tab(pane.TAB.id)
            self.call_after_refresh(table.focus)
        else:
            table.focus()
        return True

    def show_tab_bar(self, view: View) -> None:
        badges = [(pane.TAB, pane.badge(self.figures, view) if self.figures else "") for pane in self.panes()]
        bar = self.query_one("#tabbar", Static)
        width = bar.content_size.width or None  # 0 before the first layout
        bar.update(tab_bar(badges, self.tabs.marked(self.pinned), f"reverse {view.accent}", "dim", width))

    # --- the filter ------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "filter":  # a / typed into the filter is just a /
            return not isinstance(self.focused, Input)
        return True

    def action_filter(self) -> None:
        box = self.query_one(FilterInput)
        if not isinstance(self.focused, Input):
            self._before_filter = writes.focused_table(self.app)
        box.add_class("-shown")
        box.value = self.match or ""
        # At once, not after a refresh as focus() does: keys typed right after / belong to the filter.
        self.set_focus(box)

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self._set_match(event.value.strip() or None)

    @on(Input.Submitted, "#filter")
    def _filter_submitted(self, event: Input.Submitted) -> None:
        self.query_one(FilterInput).remove_class("-shown")
        self.show_tab("dead")  # what the filter narrows most: the dead jobs and their groups

    def action_clear_filter(self) -> None:
        box = self.query_one(FilterInput)
        was_open = box.has_class("-shown")
        box.remove_class("-shown")
        if was_open:
            back = (
                self._before_filter
                if self._before_filter is not None and self._before_filter.is_attached
                else self.query_one("#kinds", DataTable)
            )
            back.focus()
        if self.match is not None or box.value:
            box.value = ""  # posts Input.Changed, which clears the match and refreshes
            self._set_match(None)

    def _set_match(self, match: str | None) -> None:
        self.match = match
        self._on_filter(match)
