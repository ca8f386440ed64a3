"""`jobsup cron`: list the schedules; `cron run NAME`, `cron pause NAME`, `cron resume NAME`."""

from __future__ import annotations

import argparse
import json
from datetime import datetime

from jobsup.durations import format_age
from jobsup.errors import EXIT_OK

HELP = "schedules: list, run, pause, resume"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "List the schedules the apps declare (app.every): expression, time zone, next and "
        "last fire and the status of the last fire's job. `cron run NAME` enqueues one "
        "job of it now; `cron pause NAME` and `cron resume NAME` stop and restart its "
        "fires on every supervisor."
    )
    parser.add_argument("action", nargs="?", choices=["list", "run", "pause", "resume"], default="list")
    parser.add_argument("name", nargs="?", metavar="NAME")
    parser.add_argument("--json", action="store_true", help="one JSON object per schedule, in a list")
    parser.set_defaults(run=run)


def _when(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "-"
    seconds = (moment - now).total_seconds()
    relative = f"in {format_age(seconds)}" if seconds >= 0 else f"{format_age(-seconds)} ago"
    return f"{moment.astimezone():%m-%d %H:%M:%S} ({relative})"


def run(args: argparse.Namespace) -> int:
    from jobsup.cli.options import connect
    from jobsup.errors import BadInput
    from jobsup.ops import schedules

    if args.action == "list":
        if args.name:
            raise BadInput("jobsup cron lists every schedule; to act on one: jobsup cron run|pause|resume NAME")
        with connect(args) as conn:
            rows = schedules.list_schedules(conn)
        if args.json:
            print(json.dumps([row.to_json() for row in rows], indent=2))
            return EXIT_OK
        from rich.console import Console
        from rich.table import Table

        if not rows:
            print("no schedules: declare them with app.every(...) and start a supervisor")
            return EXIT_OK
        table = Table(box=None, header_style="bold")
        for column in ("name", "kind", "expression", "tz", "state", "next fire", "last fire", "last job"):
            table.add_column(column)
        for r in rows:
            job = f"{r.last_job_id} {r.last_status or 'gone'}" if r.last_job_id else "-"
            table.add_row(
                r.name,
                r.kind,
                r.expression,
                r.tz,
                r.state,
                "-" if r.paused else _when(r.next_fire, r.now),
                _when(r.last_fire, r.now),
                job,
            )
        Console().print(table)
        return EXIT_OK
    if not args.name:
        raise BadInput(f"jobsup cron {args.action} needs the NAME of a schedule")
    if args.json:
        raise BadInput(f"--json is for listing; jobsup cron {args.action} prints one line")
    with connect(args) as conn:
        if args.action == "run":
            job_id = schedules.run_now(conn, args.name)
            print(f"enqueued 1 job of schedule {args.name}: job {job_id}")
        else:
            paused = args.action == "pause"
            changed = schedules.set_paused(conn, args.name, paused)
            done = "paused" if paused else "resumed"
            print(
                f"{done} schedule {args.name}"
                if changed
                else f"schedule {args.name} was already {done} (nothing changed)"
            )
    return EXIT_OK
