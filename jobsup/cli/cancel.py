"""`jobsup cancel`: queued jobs at once; running ones stopped by their supervisor."""

from __future__ import annotations

import argparse

from jobsup.cli.actions import add_ids, counts, jobs, print_actions
from jobsup.cli.options import connect
from jobsup.errors import EXIT_OK

HELP = "cancel jobs: queued at once, running ones stopped"


def configure(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Cancel jobs by --id, or every queued and running job of --kind (in --queue). A queued "
        "or scheduled job becomes cancelled at once; a running one's supervisor stops its "
        "worker (SIGTERM, then SIGKILL after the kill grace) and records it cancelled; a "
        "finished job is reported, not changed."
    )
    add_ids(p, required=False)
    p.add_argument("--kind", help="every queued and running job of this kind")
    p.add_argument("--queue", help="with --kind: only in this queue")
    p.add_argument(
        "--json", action="store_true", help='one JSON object: counts ("cancelled", "requested", "unchanged") and "jobs"'
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from jobsup.ops.control import cancel

    with connect(args) as conn:
        actions = cancel(conn, ids=args.id, kind=args.kind, queue=args.queue)
    counted = counts(actions, ("cancelled", "requested", "unchanged"))
    if not actions and args.kind is not None:
        scope = f"kind {args.kind}" + (f" in queue {args.queue}" if args.queue else "")
        summary = f"no queued or running job of {scope}: nothing cancelled"
    else:
        summary = (
            f"cancelled {jobs(counted['cancelled'])}; cancel requested for {counted['requested']} "
            f"running; {counted['unchanged']} not changed"
        )
    print_actions(actions, summary, args.json, counted)
    return EXIT_OK
