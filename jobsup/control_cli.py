"""`jobsup cancel`, `jobsup pause`, `jobsup resume`, `jobsup retry`: thin commands over jobsup.control."""

from __future__ import annotations

import argparse
import json

from .control import JobAction
from .errors import EXIT_OK

# Lines of a text answer about single jobs; past these, a count (--json lists every job).
SHOWN = 50


def _jobs(n: int) -> str:
    return f"{n} job{'' if n == 1 else 's'}"


def _line(a: JobAction) -> str:
    if a.action == "cancelled":
        return f"job {a.id} ({a.kind}): cancelled (was {a.was})"
    if a.action == "requested":
        return f"job {a.id} ({a.kind}): cancel requested; {a.note}"
    if a.action == "retried":
        return f"job {a.id} ({a.kind}): retried: {a.note}"
    return f"job {a.id} ({a.kind}): not changed: {a.note}"


def _print(actions: list[JobAction], summary: str, as_json: bool, counts: dict[str, int]) -> None:
    if as_json:
        print(json.dumps({**counts, "jobs": [a.to_json() for a in actions]}))
        return
    for action in actions[:SHOWN]:
        print(_line(action))
    if len(actions) > SHOWN:
        print(f"... and {_jobs(len(actions) - SHOWN)} more (--json lists them all)")
    print(summary)


def _count(actions: list[JobAction], action: str) -> int:
    return sum(1 for a in actions if a.action == action)


def cmd_cancel(args: argparse.Namespace) -> int:
    from .control import cancel
    from .options import connect

    with connect(args) as conn:
        actions = cancel(conn, ids=args.id, kind=args.kind, queue=args.queue)
    counts = {name: _count(actions, name) for name in ("cancelled", "requested", "unchanged")}
    if not actions and args.kind is not None:
        scope = f"kind {args.kind}" + (f" in queue {args.queue}" if args.queue else "")
        summary = f"no queued or running job of {scope}: nothing cancelled"
    else:
        summary = (f"cancelled {_jobs(counts['cancelled'])}; cancel requested for {counts['requested']} "
                   f"running; {counts['unchanged']} not changed")
    _print(actions, summary, args.json, counts)
    return EXIT_OK


def cmd_retry(args: argparse.Namespace) -> int:
    from .control import retry
    from .options import connect

    with connect(args) as conn:
        actions = retry(conn, args.id)
    counts = {name: _count(actions, name) for name in ("retried", "unchanged")}
    _print(actions, f"retried {_jobs(counts['retried'])} now; {counts['unchanged']} not changed", args.json, counts)
    return EXIT_OK


def _pause_or_resume(args: argparse.Namespace, pausing: bool) -> int:
    from .control import pause, resume
    from .options import connect

    with connect(args) as conn:
        changed = pause(conn, args.queue) if pausing else resume(conn, args.queue)
    verb = "paused" if pausing else "resumed"
    if args.json:
        print(json.dumps({"queue": args.queue, "paused": pausing, "changed": changed}))
    elif changed:
        print(f"{verb} queue {args.queue}" + (": no supervisor claims from it; running jobs finish"
                                               if pausing else ": supervisors claim from it again"))
    else:
        print(f"queue {args.queue} was {'paused already' if pausing else 'not paused'}: nothing changed")
    return EXIT_OK


def _ids(parser: argparse.ArgumentParser, required: bool) -> None:
    from .options import positive_int

    parser.add_argument("--id", type=positive_int, action="extend", nargs="+", metavar="N", required=required,
                        help="these jobs: --id 2 76906, or --id 2 --id 76906")


def configure(sub: argparse._SubParsersAction, db: argparse.ArgumentParser) -> None:
    """Add cancel, pause, resume and retry to the `jobsup` command's subparsers."""
    p = sub.add_parser("cancel", parents=[db], help="cancel jobs: queued at once, running ones stopped",
                       description="Cancel jobs by --id, or every queued and running job of --kind (in "
                                   "--queue). A queued or scheduled job becomes cancelled at once; a "
                                   "running one's supervisor stops its worker (SIGTERM, then SIGKILL after "
                                   "the kill grace) and records it cancelled; a finished job is reported, "
                                   "not changed.")
    _ids(p, required=False)
    p.add_argument("--kind", help="every queued and running job of this kind")
    p.add_argument("--queue", help="with --kind: only in this queue")
    p.add_argument("--json", action="store_true",
                   help='one JSON object: counts ("cancelled", "requested", "unchanged") and "jobs"')
    p.set_defaults(run=cmd_cancel)

    for name, pausing in (("pause", True), ("resume", False)):
        p = sub.add_parser(name, parents=[db],
                           help="stop claiming from a queue on every supervisor" if pausing
                           else "claim from a paused queue again")
        p.add_argument("queue", metavar="QUEUE")
        p.add_argument("--json", action="store_true", help='one JSON object: {"queue", "paused", "changed"}')
        p.set_defaults(run=lambda args, pausing=pausing: _pause_or_resume(args, pausing))

    p = sub.add_parser("retry", parents=[db], help="run a job waiting for its retry now",
                       description="A job waiting for its backoff (queued, its run_at in the future, "
                                   "attempted before) is due now; the others are reported as they are.")
    _ids(p, required=True)
    p.add_argument("--json", action="store_true", help='one JSON object: counts ("retried", "unchanged") and "jobs"')
    p.set_defaults(run=cmd_retry)
