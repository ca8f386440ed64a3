"""What the control commands (cancel, retry, pause, resume, requeue-dead, limit) share: how they print
what they did, and the row each writes in the audit."""

from __future__ import annotations

import argparse
import json

import psycopg

from jobsup.cli.options import connect, positive_int
from jobsup.errors import EXIT_OK
from jobsup.ops.control import JobAction

# Lines of a text answer about single jobs; past these, a count (--json lists every job).
SHOWN = 50


# The role the audit gives a command: whoever runs it has the database's credentials.
COMMAND_ROLE = "command"


def audit(
    conn: psycopg.Connection, action: str, target: str, job_ids: list[int] | tuple[()] = (), detail: str = ""
) -> None:
    """The audit's row of a command's action, once it has committed: by `user@host`."""
    from jobsup.ops.audit import record
    from jobsup.ops.control import operator

    record(conn, who=operator(), role=COMMAND_ROLE, action=action, target=target, job_ids=job_ids, detail=detail)


def jobs(n: int) -> str:
    return f"{n} job{'' if n == 1 else 's'}"


def _line(a: JobAction) -> str:
    if a.action == "cancelled":
        return f"job {a.id} ({a.kind}): cancelled (was {a.was})"
    if a.action == "requested":
        return f"job {a.id} ({a.kind}): cancel requested; {a.note}"
    if a.action == "retried":
        return f"job {a.id} ({a.kind}): retried: {a.note}"
    return f"job {a.id} ({a.kind}): not changed: {a.note}"


def counts(actions: list[JobAction], names: tuple[str, ...]) -> dict[str, int]:
    return {name: sum(1 for a in actions if a.action == name) for name in names}


def print_actions(actions: list[JobAction], summary: str, as_json: bool, counted: dict[str, int]) -> None:
    if as_json:
        print(json.dumps({**counted, "jobs": [a.to_json() for a in actions]}))
        return
    for action in actions[:SHOWN]:
        print(_line(action))
    if len(actions) > SHOWN:
        print(f"... and {jobs(len(actions) - SHOWN)} more (--json lists them all)")
    print(summary)


def add_ids(parser: argparse.ArgumentParser, required: bool) -> None:
    parser.add_argument(
        "--id",
        type=positive_int,
        action="extend",
        nargs="+",
        metavar="N",
        required=required,
        help="these jobs: --id 2 76906, or --id 2 --id 76906",
    )


def configure_pausing(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queue", metavar="QUEUE")
    parser.add_argument("--json", action="store_true", help='one JSON object: {"queue", "paused", "changed"}')


def pause_or_resume(args: argparse.Namespace, pausing: bool) -> int:
    from jobsup.ops.control import pause, resume

    verb = "paused" if pausing else "resumed"
    with connect(args) as conn:
        changed = pause(conn, args.queue) if pausing else resume(conn, args.queue)
        audit(conn, "pause" if pausing else "resume", f"queue {args.queue}", detail=verb if changed else "unchanged")
    if args.json:
        print(json.dumps({"queue": args.queue, "paused": pausing, "changed": changed}))
    elif changed:
        print(
            f"{verb} queue {args.queue}"
            + (
                ": no supervisor claims from it; running jobs finish"
                if pausing
                else ": supervisors claim from it again"
            )
        )
    else:
        print(f"queue {args.queue} was {'paused already' if pausing else 'not paused'}: nothing changed")
    return EXIT_OK
