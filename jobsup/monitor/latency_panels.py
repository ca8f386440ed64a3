"""The Latency tab of `jobsup top`: queue latency and run time per kind, the leases that expire soonest
and the attempts of live and dead jobs."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding

from jobsup.durations import format_seconds
from jobsup.monitor import formats as fmt
from jobsup.monitor.figures import Figures
from jobsup.monitor.panels import Panel, Table, View, fill, left, right, status_style
from jobsup.ops import latency

RISING = "↑"  # beside a kind whose latency is rising (latency.rising)


class LatencyPanel(Panel):
    TITLE = "latency and run time by kind"
    BINDINGS = [
        Binding(
            "w",
            "next_window",
            "Window",
            tooltip="the next window of the latency table: the last "
            + ", ".join(latency.window_label(w) for w in latency.WINDOWS[:-1])
            + f" or {latency.window_label(latency.WINDOWS[-1])}",
        )
    ]
    window = latency.WINDOWS[0]

    def compose(self) -> ComposeResult:
        yield Table(
            [
                ("kind", "kind", False),
                ("jobs", "jobs", True),
                ("lat50", "latency p50", True),
                ("lat95", "p95", True),
                ("run50", "run p50", True),
                ("run95", "p95", True),
                ("trend", "", False),
            ],
            id="latency",
        )

    def action_next_window(self) -> None:
        windows = latency.WINDOWS
        self.window = windows[(windows.index(self.window) + 1) % len(windows)]
        if self._shown is not None:
            self.show(*self._shown)

    def show(self, figures: Figures, view: View) -> None:
        self.border_title = f"{self.TITLE} · last {latency.window_label(self.window)} (w)"
        rows = []
        for k in figures.latency:
            if not fmt.matches(view.match, k.kind):
                continue
            lat, run = k.get("queue_latency", self.window), k.get("run_time", self.window)
            if not lat.count and not run.count:
                continue
            rows.append(
                (
                    k.kind,
                    [
                        left(k.kind),
                        right(fmt.count(run.count)),
                        right(format_seconds(lat.p50)),
                        right(format_seconds(lat.p95), view.warning if k.rising else ""),
                        right(format_seconds(run.p50)),
                        right(format_seconds(run.p95)),
                        left(f"{RISING} rising" if k.rising else "", view.warning),
                    ],
                )
            )
        self.border_subtitle = "" if rows else "no job finished in this window"
        fill(self.query_one(Table), rows)


class LeasesPanel(Panel):
    TITLE = "leases expiring soonest"

    def compose(self) -> ComposeResult:
        yield Table(
            [
                ("id", "id", True),
                ("kind", "kind", False),
                ("att", "att", True),
                ("left", "expires in", True),
                ("by", "held by", False),
            ],
            id="leases",
        )

    def show(self, figures: Figures, view: View) -> None:
        rows = []
        for lease in figures.leases:
            if not fmt.matches(view.match, lease.kind):
                continue
            expired = lease.remaining is not None and lease.remaining < 0
            rows.append(
                (
                    str(lease.id),
                    [
                        right(str(lease.id)),
                        left(lease.kind),
                        right(str(lease.attempts)),
                        right("expired" if expired else fmt.age(lease.remaining), view.error if expired else ""),
                        left(lease.locked_by or "-"),
                    ],
                )
            )
        self.border_subtitle = "" if rows else "no job is running"
        fill(self.query_one(Table), rows)


class AttemptsPanel(Panel):
    TITLE = "attempts by status"

    def compose(self) -> ComposeResult:
        yield Table(
            [("status", "status", False), ("attempts", "attempts", True), ("jobs", "jobs", True)], id="attempts"
        )

    def show(self, figures: Figures, view: View) -> None:
        fill(
            self.query_one(Table),
            [
                (f"{status}\x00{n}", [left(status, status_style(status, view)), right(str(n)), right(fmt.count(count))])
                for status, n, count in figures.attempts
            ],
        )
