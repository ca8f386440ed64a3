"""`jobsup requeue-dead`: queue dead jobs again, attempts reset: all, or those of a kind, error or id."""

from __future__ import annotations

import argparse
import json

from jobsup.cli.actions import audit
from jobsup.cli.options import connect, positive_int
from jobsup.errors import EXIT_OK

HELP = "queue dead jobs again, attempts reset"


def configure(p: argparse.ArgumentParser) -> None:
    p.description = "Requeue every dead job, or those of --kind / --error / --id."
    p.add_argument("--kind", help="only dead jobs of this kind")
    p.add_argument("--error", help="only dead jobs whose last error is exactly this")
    p.add_argument(
        "--id",
        type=positive_int,
        action="extend",
        nargs="+",
        metavar="N",
        help="only these jobs: --id 2 76906, or --id 2 --id 76906",
    )
    p.add_argument("--json", action="store_true", help='one JSON object: {"requeued": N, "ids": [...]}')
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from jobsup.ops.control import requeue_dead

    scope = " and ".join(
        filter(
            None,
            [
                f"kind {args.kind}" if args.kind else "",
                f"error {args.error!r}" if args.error else "",
                f"ids {', '.join(map(str, args.id))}" if args.id else "",
            ],
        )
    )
    with connect(args) as conn:
        ids = requeue_dead(conn, ids=args.id or None, kind=args.kind, error=args.error)
        said = f"requeued {len(ids)} dead job{'s' if len(ids) != 1 else ''}" + (f" ({scope})" if scope else "")
        audit(conn, "requeue", scope or "every dead job", ids, said)
    if args.json:
        print(json.dumps({"requeued": len(ids), "ids": ids}))
        return EXIT_OK
    print(said)
    return EXIT_OK
