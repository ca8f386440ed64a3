"""`jobsup prune`: one pruning round from the command line, the same function the supervisors run."""

from __future__ import annotations

import argparse
import asyncio
import json
import os

from jobsup.durations import format_duration
from jobsup.errors import EXIT_OK
from jobsup.ops.prune import KEEP_DEAD, KEEP_DONE, Pruned, Retention, aprunable, aprune

HELP = "delete finished jobs and workflows past their window"


def configure(parser: argparse.ArgumentParser) -> None:
    from jobsup.cli.options import duration as _duration

    parser.description = (
        "Delete done jobs older than --keep-done, dead and cancelled jobs older than "
        "--keep-dead (by when they finished) and events older than 7 days, in batches, "
        "taking turns with the supervisors, which do the same every --prune-interval. "
        "A workflow's jobs go together with it: --keep-done after its last job finished, "
        "--keep-dead if one of them ended dead or cancelled."
    )
    for flag, default in (("--keep-done", KEEP_DONE), ("--keep-dead", KEEP_DEAD)):
        env = "JOBSUP_" + flag[2:].replace("-", "_").upper()
        parser.add_argument(
            flag,
            type=_duration,
            default=os.environ.get(env, default),
            metavar="D",
            help=f"0 keeps forever (env {env}; default {format_duration(default)})",
        )
    parser.add_argument("--dry-run", action="store_true", help="count what would be deleted, delete nothing")
    parser.add_argument("--json", action="store_true", help="one JSON object")
    parser.set_defaults(run=run)


def _said(pruned: Pruned) -> str:
    """
    >>> _said(Pruned(done=1200, dead=1, events=0, workflows=1))
    '1200 done jobs, 1 dead job, 0 events, 1 workflow'
    """

    def n(count: int, word: str) -> str:
        return f"{count} {word}" + ("" if count == 1 else "s")

    return ", ".join(
        (
            n(pruned.done, "done job"),
            n(pruned.dead, "dead job"),
            n(pruned.events, "event"),
            n(pruned.workflows, "workflow"),
        )
    )


def _window(seconds: float) -> str:
    return "forever" if seconds == 0 else format_duration(seconds)


async def _prune(dsn: str, retention: Retention, dry_run: bool) -> Pruned:
    from jobsup.db.dsn import aconnect

    conn = await aconnect(dsn)
    try:
        if dry_run:
            return await aprunable(conn, retention)
        return await aprune(conn, retention, wait=True)
    finally:
        await conn.close()


def run(args: argparse.Namespace) -> int:
    from jobsup.cli.options import connect
    from jobsup.db.dsn import resolve

    retention = Retention(keep_done=args.keep_done, keep_dead=args.keep_dead)
    with connect(args):  # the schema check, with its message
        pass
    pruned = asyncio.run(_prune(resolve(args.dsn, args.data_dir), retention, args.dry_run))
    if args.json:
        print(
            json.dumps(
                {
                    "dry_run": args.dry_run,
                    **pruned.to_json(),
                    "keep_done": retention.keep_done,
                    "keep_dead": retention.keep_dead,
                    "keep_events": retention.keep_events,
                }
            )
        )
    else:
        print(
            f"{'would delete' if args.dry_run else 'deleted'} {_said(pruned)} "
            f"(kept: done {_window(retention.keep_done)}, dead {_window(retention.keep_dead)}, "
            f"events {_window(retention.keep_events)})"
        )
    return EXIT_OK
