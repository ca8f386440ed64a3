"""`jobsup retry`: a job waiting for its backoff runs now."""

from __future__ import annotations

import argparse

from jobsup.cli.actions import add_ids, audit, counts, jobs, print_actions
from jobsup.cli.options import connect
from jobsup.errors import EXIT_OK

HELP = "run a job waiting for its retry now"


def configure(p: argparse.ArgumentParser) -> None:
    p.description = (
        "A job waiting for its backoff (queued, its run_at in the future, attempted before) is "
        "due now; the others are reported as they are."
    )
    add_ids(p, required=True)
    p.add_argument("--json", action="store_true", help='one JSON object: counts ("retried", "unchanged") and "jobs"')
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from jobsup.ops.control import retry

    with connect(args) as conn:
        actions = retry(conn, args.id)
        counted = counts(actions, ("retried", "unchanged"))
        summary = f"retried {jobs(counted['retried'])} now; {counted['unchanged']} not changed"
        target = ", ".join(f"job {i}" for i in args.id[:5]) + (" ..." if len(args.id) > 5 else "")
        audit(conn, "retry", target, [a.id for a in actions if a.action == "retried"], summary)
    print_actions(actions, summary, args.json, counted)
    return EXIT_OK
