"""`jobsup stats`: counts by status and kind, workflows, latency and run time per kind, the oldest ready
job, the kinds with limits, dead jobs, expiring leases and attempts; rich tables, or one JSON object."""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from jobsup.cli.options import connect, positive_int
from jobsup.durations import format_age
from jobsup.durations import format_seconds as ms
from jobsup.errors import EXIT_OK
from jobsup.ops.latency import WINDOWS, window_label
from jobsup.ops.snapshot import COUNT_COLUMNS, KIND_COLUMNS, Snapshot, snapshot

HELP = (
    "counts by status and kind, workflows, latency and run time per kind, oldest ready job, limits, dead jobs, "
    "expiring leases, attempts"
)


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    p.add_argument("--dead", type=positive_int, default=10, metavar="N", help="dead jobs to list (default 10)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        snap = snapshot(conn, dead_limit=args.dead)
    if args.json:
        print(json.dumps(snap.to_json(), indent=2, default=str))
    else:
        print_snapshot(snap)
    return EXIT_OK


def show(console: Console, table: Table) -> None:
    """Print `table`, without its box and with one space between columns when the box would cut a
    column's words: the jobs by kind of a schema with waiting jobs has nine counts, which need 87
    columns boxed and 67 without, beside the longest kind."""
    unbounded = console.options.update(max_width=10_000)
    if Measurement.get(console, unbounded, table).minimum > console.width:
        table.box = None
        table.padding = (0, 1, 0, 0)
        table.pad_edge = False
    console.print(table)


def print_snapshot(snap: Snapshot, console: Console | None = None) -> None:
    console = console or Console()
    total = snap.total
    # The waiting column only while a job waits for its parents: without it the table fits 80 columns
    # with its box.
    columns = KIND_COLUMNS if total.waiting else COUNT_COLUMNS
    kinds = Table(title="jobs by kind", title_justify="left")
    kinds.add_column("kind", overflow="fold")  # a kind too long for the terminal wraps, never cut
    for name in columns:
        kinds.add_column(name, justify="right")
    for counts in snap.kinds:  # not `row`, the name of the dict rows below
        kinds.add_row(counts.kind, *(f"{getattr(counts, name):,}" for name in columns))
    kinds.add_row("total", *(f"{getattr(total, name):,}" for name in columns), style="bold")
    show(console, kinds)
    print_workflows(snap, console)

    if snap.paused_queues:  # control: `jobsup pause`
        paused = Table(title="paused queues (no supervisor claims from them)", title_justify="left")
        for name in ("queue", "paused at", "by"):
            paused.add_column(name)
        for row in snap.paused_queues:
            paused.add_row(row["queue"], row["paused_at"].strftime("%Y-%m-%d %H:%M:%S"), row["paused_by"] or "")
        show(console, paused)

    oldest = Table(title="oldest ready job", title_justify="left")
    oldest.add_column("queue")
    oldest.add_column("age", justify="right")
    for queue, age in snap.oldest_ready.items():
        oldest.add_row(queue, format_age(age))
    if not snap.oldest_ready:
        oldest.add_row("(no ready jobs)", "-")
    show(console, oldest)
    print_limits(snap, console)

    dead = Table(title=f"dead jobs (newest {len(snap.dead_jobs)} of {total.dead:,})", title_justify="left")
    for name in ("id", "kind", "attempts", "died", "last error"):
        dead.add_column(name, justify="right" if name in ("id", "attempts") else "left")
    for row in snap.dead_jobs:
        died = row["done_at"].strftime("%Y-%m-%d %H:%M:%S") if row["done_at"] else "-"
        dead.add_row(
            str(row["id"]),
            row["kind"],
            f"{row['attempts']}/{row['max_attempts']}",
            died,
            (row["last_error"] or "").splitlines()[0][:100] if row["last_error"] else "",
        )
    show(console, dead)

    print_latency(snap, console)
    print_leases_and_attempts(snap, console)


def print_workflows(snap: Snapshot, console: Console) -> None:
    """The workflows, when there is one: open, and finished as long as retention keeps them."""
    w = snap.workflows
    if not (w.open or w.done or w.failed):
        return
    table = Table(title="workflows", title_justify="left")  # done and failed: those retention keeps
    for name in ("open", "done", "failed"):
        table.add_column(name, justify="right")
    table.add_row(f"{w.open:,}", f"{w.done:,}", f"{w.failed:,}")
    show(console, table)


def print_limits(snap: Snapshot, console: Console) -> None:
    """The kinds with a limit in force, when there is one: what they hold, what they throttle, for how long."""
    if not snap.limits:
        return
    title = "limits (held: running; throttled: ready, held back by the limits; startable: ready, waiting for a worker)"
    table = Table(title=title, title_justify="left")
    table.add_column("kind")
    table.add_column("limits")
    table.add_column("held", justify="right")
    table.add_column("throttled", justify="right")
    table.add_column("startable", justify="right")
    table.add_column("oldest", justify="right")
    table.add_column("set by")
    for k in snap.limits:
        held = f"{k.held:,}" + (f" of {k.limits.concurrency:,}" if k.limits.concurrency is not None else "")
        by = k.set_by or ("the app" if k.declared is not None else "-")
        table.add_row(
            k.kind, str(k.limits), held, k.throttled_text, f"{k.startable:,}", format_age(k.throttled_age), by
        )
    show(console, table)


def print_latency(snap: Snapshot, console: Console) -> None:
    for window in WINDOWS:
        table = Table(title=f"latency and run time, last {window_label(window)}", title_justify="left")
        table.add_column("kind")
        table.add_column("jobs", justify="right")
        for name in ("latency p50", "p95", "p99", "run time p50", "p95", "p99"):
            table.add_column(name, justify="right")
        for k in snap.latency:
            lat, run = k.get("queue_latency", window), k.get("run_time", window)
            if not run.count and not lat.count:
                continue
            mark = " ↑ rising" if k.rising and window == WINDOWS[0] else ""
            table.add_row(
                k.kind + mark,
                f"{run.count:,}",
                ms(lat.p50),
                ms(lat.p95),
                ms(lat.p99),
                ms(run.p50),
                ms(run.p95),
                ms(run.p99),
            )
        if not table.row_count:
            table.add_row("(no job finished)", *["-"] * 7)
        show(console, table)


def print_leases_and_attempts(snap: Snapshot, console: Console) -> None:
    leases = Table(title="leases expiring soonest", title_justify="left")
    for name in ("id", "kind", "attempts", "held by", "expires in"):
        leases.add_column(name, justify="right" if name in ("id", "attempts", "expires in") else "left")
    for row in snap.expiring_leases:
        remaining = row["remaining"]
        left = "expired" if remaining is not None and remaining < 0 else format_age(remaining)
        leases.add_row(str(row["id"]), row["kind"], str(row["attempts"]), row["locked_by"] or "-", left)
    if not snap.expiring_leases:
        leases.add_row("(no running job)", "", "", "", "")
    show(console, leases)

    attempts = Table(title="attempts, live and dead jobs", title_justify="left")
    attempts.add_column("status")
    attempts.add_column("attempts", justify="right")
    attempts.add_column("jobs", justify="right")
    for row in snap.attempts:
        attempts.add_row(row["status"], str(row["attempts"]), f"{row['count']:,}")
    if not snap.attempts:
        attempts.add_row("(no live or dead job)", "", "")
    show(console, attempts)
