"""`jobsup check`: flags, then one line per threshold crossed; exit 1 if any."""

from __future__ import annotations

import argparse
import json
import os

from jobsup.ops.check import MAX_OLDEST_AGE, MAX_UNSERVED_AGE, Limits, check, shown

HELP = (
    "alert checks: oldest ready job, dead jobs, reaping, unserved kinds, throttled kinds; exit 1 when a threshold "
    "is crossed"
)


def configure(parser: argparse.ArgumentParser) -> None:
    from jobsup.cli.options import count, duration, truthy

    parser.description = (
        "Check the alerts: the age of the oldest ready job per queue, the number of dead "
        "jobs, the jobs the reapers returned in the last minute, ready jobs that no live "
        "supervisor can run (their kind handled by no app that serves their queue), and how long "
        "ready jobs of a limited kind have waited for its limits (throttled). One "
        "line per threshold crossed and exit 1 if any is; otherwise one ok line and exit "
        "0. A paused queue's line says it is paused. Each threshold also comes "
        "from its JOBSUP_CHECK_* variable."
    )
    env = os.environ.get
    parser.add_argument(
        "--max-oldest-age",
        type=duration,
        metavar="D",
        default=env("JOBSUP_CHECK_MAX_OLDEST_AGE", MAX_OLDEST_AGE),
        help="alert when a queue's oldest ready job waited longer; 0 for never (env "
        f"JOBSUP_CHECK_MAX_OLDEST_AGE; default {shown(MAX_OLDEST_AGE)})",
    )
    parser.add_argument(
        "--max-dead",
        type=count,
        metavar="N",
        default=env("JOBSUP_CHECK_MAX_DEAD"),
        help="alert when more jobs are dead (env JOBSUP_CHECK_MAX_DEAD; default: not checked)",
    )
    parser.add_argument(
        "--max-reaped-per-min",
        type=count,
        metavar="N",
        default=env("JOBSUP_CHECK_MAX_REAPED_PER_MIN"),
        help="alert when the reapers returned more jobs in the last minute, all queues "
        "(env JOBSUP_CHECK_MAX_REAPED_PER_MIN; default: not checked)",
    )
    parser.add_argument(
        "--max-unserved-age",
        type=duration,
        metavar="D",
        default=env("JOBSUP_CHECK_MAX_UNSERVED_AGE", MAX_UNSERVED_AGE),
        help="alert when ready jobs that no live supervisor can run waited longer; 0 for never (env "
        f"JOBSUP_CHECK_MAX_UNSERVED_AGE; default {shown(MAX_UNSERVED_AGE)})",
    )
    parser.add_argument(
        "--max-throttled-age",
        type=duration,
        metavar="D",
        default=env("JOBSUP_CHECK_MAX_THROTTLED_AGE"),
        help="alert when the oldest ready job of a limited kind waited longer for its limits (throttled), "
        "whatever its queue; 0 for never (env JOBSUP_CHECK_MAX_THROTTLED_AGE; default: not checked)",
    )
    parser.add_argument(
        "--skip-paused",
        action="store_true",
        default=truthy(env("JOBSUP_CHECK_SKIP_PAUSED")),
        help="leave paused queues out of --max-oldest-age (env JOBSUP_CHECK_SKIP_PAUSED=1)",
    )
    parser.add_argument("--queue", metavar="Q", help="only this queue's oldest job, dead jobs and unserved jobs")
    parser.add_argument("--json", action="store_true", help="one JSON object: ok, crossed, and the figures")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from jobsup.cli.options import connect

    limits = Limits(
        max_oldest_age=args.max_oldest_age,
        max_dead=args.max_dead,
        max_reaped_per_min=args.max_reaped_per_min,
        max_unserved_age=args.max_unserved_age,
        max_throttled_age=args.max_throttled_age,
        queue=args.queue,
        skip_paused=args.skip_paused,
    )
    with connect(args) as conn:
        result = check(conn, limits)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        for crossed in result.crossed:
            print(crossed.message)
        if not result.crossed:
            print(result.summary())
    return result.exit_code
