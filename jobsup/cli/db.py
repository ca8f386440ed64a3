"""`jobsup db start|url|stop`: the embedded PostgreSQL of --data-dir."""

from __future__ import annotations

import argparse
import sys

from jobsup.db import embedded
from jobsup.errors import EXIT_FAILURE, EXIT_OK, BadInput

HELP = "the embedded PostgreSQL: start, url, stop"
# Its --help offers --data-dir alone: --dsn names a server of the user's own, which this never touches.
EMBEDDED_ONLY = True


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["start", "url", "stop"])
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.dsn:
        raise BadInput(
            f"jobsup db {args.action} manages the embedded PostgreSQL of --data-dir; "
            "--dsn names a server of your own, which it does not touch"
        )
    data_dir = embedded.data_dir_from(args.data_dir)
    if args.action == "start":
        print(embedded.ensure_running(data_dir))
    elif args.action == "url":
        running = embedded.running_dsn(data_dir)
        if running is None:
            print(f"no embedded PostgreSQL is running in {data_dir} (jobsup db start)", file=sys.stderr)
            return EXIT_FAILURE
        print(running)
    elif args.action == "stop":
        print(
            f"stopped the embedded PostgreSQL in {data_dir}"
            if embedded.stop(data_dir)
            else f"no embedded PostgreSQL was running in {data_dir}"
        )
    return EXIT_OK
