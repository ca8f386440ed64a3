"""The lines above the tabs of `jobsup top`, each a widget that draws itself from the figures: the title
(state, clock, filter, database), the headline (the queue's totals, supervisors and workers) and the
health lines (what needs the operator)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from jobsup.monitor import formats as fmt
from jobsup.monitor.figures import Figures
from jobsup.monitor.panels import View, pack


class Title(Static):
    def show(self, state: str, clock: str, view: View, read_only: bool, label: str, every: float) -> None:
        """`state`: live, paused, stale, or … before the first figures; `every`: seconds between refreshes."""
        style = {"stale": "bold reverse", "paused": "bold reverse", "live": "bold"}.get(state, "")
        parts: list[tuple[str, str] | str] = [("jobsup top ", "bold"), (f" {state} ", style), f" {clock}"]
        if view.match:
            parts.append(("  filter: " + view.match, "bold"))
        if read_only:
            parts.append(("  READ-ONLY", "bold"))
        line = Text.assemble(*parts)
        # The database is always named, cut in its middle if it must be; the refresh interval only if it fits.
        room = (self.size.width or self.app.size.width) - 2
        interval = f"  every {fmt.age(every)}"
        line.append(f"  {fmt.middle_cut(label, max(12, room - line.cell_len - 2))}")
        if line.cell_len + len(interval) <= room:
            line.append(interval, style="dim")
        self.update(line)


class Headline(Static):
    def show(self, figures: Figures | None, view: View) -> None:
        if figures is None:
            self.update(Text("connecting to the database…", style="dim"))
            return
        total = figures.total
        live = figures.live_supervisors(view.stale_after)
        workers = [w for s in live for w in s.workers]
        busy = sum(1 for w in workers if w.state == "busy")
        # Held and counted as running (a limit counts them), but handed to a worker behind another job.
        behind = sum(w.behind for w in workers)
        oldest = figures.oldest_ready
        stale = fmt.stale_note(figures.supervisors, view.stale_after)
        items = [
            ("ready", fmt.count(total.ready), ""),
            ("scheduled", fmt.count(total.scheduled), ""),
            ("running", fmt.count(total.running) + (f" ({behind} not started)" if behind else ""), ""),
            *([("waiting", fmt.count(total.waiting), "")] if view.waiting else []),
            ("dead", fmt.count(total.dead), view.error if total.dead else ""),
            ("oldest ready", fmt.age(oldest), view.warning if oldest and oldest > view.warn_age else ""),
            ("done/min", fmt.count(figures.done_last_minute), ""),
            ("supervisors", f"{len(live)}" + (f" {stale}" if stale else ""), view.error if stale else ""),
            ("workers", f"{busy}/{len(workers)} busy", ""),
        ]
        width = self.size.width - 2
        self.update(
            pack(
                [Text.assemble((label + " ", "dim"), (value, style or "bold")) for label, value, style in items],
                width if width > 0 else self.app.size.width - 2,
            )
        )


class Health(Static):
    """Lines of warning under the header when something needs the operator, such as "vacuum held back
    14m by pid 4211 (idle in transaction)" (jobsup.ops.health), or ready jobs that no live supervisor can
    run ("unserved: kind c in queue mix, 5 ready, oldest 1m15s"); hidden when there are none."""

    def show(self, figures: Figures, view: View) -> None:
        lines = [figures.health, fmt.unserved_note(figures.unserved(view.stale_after))]
        shown = [f"⚠ {line}" for line in lines if line]
        self.update(Text("\n".join(shown), style=view.warning) if shown else "")
        self.set_class(bool(shown), "-shown")
