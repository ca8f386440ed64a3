"""`jobsup explain ID`: why a job is not running, or why it is where it is."""

from __future__ import annotations

import argparse
import json

from jobsup.cli.options import connect, job_id
from jobsup.errors import EXIT_OK

HELP = "say why a job is not running (or where it is)"

# Job ids are bigint, past the integer range of options.positive_int.


def configure(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Say what holds job ID, from the database: finished, running, waiting for its parents (the "
        "unfinished ones by id), scheduled or waiting for its retry, its queue paused, a limit of its "
        "kind or key at its concurrency or rate, no live supervisor that serves its queue or runs its "
        "kind, every worker that could run it busy (it waits for a worker, not a limit); else it is "
        "ready to start."
    )
    p.add_argument("id", type=job_id, metavar="ID", help="the job's id")
    p.add_argument(
        "--json",
        action="store_true",
        help='one JSON object: "id", "kind", "status", "reason" (a stable code), "text" and "details"',
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from jobsup.ops.explain import explain

    with connect(args) as conn:
        answer = explain(conn, args.id)
    if args.json:
        print(json.dumps(answer.to_json()))
    else:
        first, *rest = answer.text.splitlines()
        print(f"job {answer.id} ({answer.kind}, {answer.status}): {first}")
        for line in rest:
            print(f"  {line}")
        details = answer.details
        if details.get("meta"):
            print(f"  meta: {json.dumps(details['meta'], separators=(',', ':'), ensure_ascii=False)}")
        if details.get("trace_id"):
            print(f"  trace: {details['trace_id']}")
    return EXIT_OK
