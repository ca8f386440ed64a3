"""`jobsup stats`: a snapshot as rich tables."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from .durations import format_age
from .visibility import Snapshot

_COLUMNS = ("ready", "scheduled", "running", "done", "failed", "dead", "cancelled")


def print_snapshot(snap: Snapshot, console: Console | None = None) -> None:
    console = console or Console()
    kinds = Table(title="jobs by kind", title_justify="left")
    kinds.add_column("kind")
    for name in _COLUMNS:
        kinds.add_column(name, justify="right")
    for row in snap.kinds:
        kinds.add_row(row.kind, *(f"{getattr(row, name):,}" for name in _COLUMNS))
    total = snap.total
    kinds.add_row("total", *(f"{getattr(total, name):,}" for name in _COLUMNS), style="bold")
    console.print(kinds)

    if snap.paused_queues:  # control: `jobsup pause`
        paused = Table(title="paused queues (no supervisor claims from them)", title_justify="left")
        for name in ("queue", "paused at", "by"):
            paused.add_column(name)
        for row in snap.paused_queues:
            paused.add_row(row["queue"], row["paused_at"].strftime("%Y-%m-%d %H:%M:%S"), row["paused_by"] or "")
        console.print(paused)

    oldest = Table(title="oldest ready job", title_justify="left")
    oldest.add_column("queue")
    oldest.add_column("age", justify="right")
    for queue, age in snap.oldest_ready.items():
        oldest.add_row(queue, format_age(age))
    if not snap.oldest_ready:
        oldest.add_row("(no ready jobs)", "-")
    console.print(oldest)

    dead = Table(title=f"dead jobs (newest {len(snap.dead_jobs)} of {total.dead:,})", title_justify="left")
    for name in ("id", "kind", "attempts", "died", "last error"):
        dead.add_column(name, justify="right" if name in ("id", "attempts") else "left")
    for row in snap.dead_jobs:
        died = row["done_at"].strftime("%Y-%m-%d %H:%M:%S") if row["done_at"] else "-"
        dead.add_row(str(row["id"]), row["kind"], f"{row['attempts']}/{row['max_attempts']}", died,
                     (row["last_error"] or "").splitlines()[0][:100] if row["last_error"] else "")
    console.print(dead)
