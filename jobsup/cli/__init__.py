"""The `jobsup` command: one module per command, named as the command is typed (`requeue-dead` is
`requeue_dead.py`). Each module has HELP, `configure(parser)` and `run(args) -> exit code`; it parses,
calls one function of jobsup.ops, jobsup.db or the supervisor, and prints. `options` holds the argument
types every command shares, and `actions` what the control commands print; no command module imports
another.

May import: everything in jobsup. Nothing else in jobsup imports this package but `jobsup.__main__`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

import psycopg

from jobsup.cli import options
from jobsup.db import dsn as dsns
from jobsup.errors import EXIT_FAILURE, EXIT_INTERRUPTED, JobsupError, first_line

# In the order `jobsup --help` lists them.
COMMANDS = (
    "migrate",
    "enqueue",
    "stats",
    "requeue-dead",
    "db",
    "prune",
    "start",
    "top",
    "doctor",
    "cron",
    "bench",
    "cancel",
    "pause",
    "resume",
    "retry",
    "check",
    "metrics",
)


def build_parser() -> argparse.ArgumentParser:
    from jobsup import __version__

    db = options.database_options()
    parser = options.Parser(
        prog="jobsup", description="A PostgreSQL job queue with a process supervisor and a console."
    )
    parser.add_argument("--version", action="version", version=f"jobsup {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=options.Parser)
    sub.required = True
    for name in COMMANDS:
        module = importlib.import_module(f"jobsup.cli.{name.replace('-', '_')}")
        module.configure(sub.add_parser(name, parents=[db], help=module.HELP))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # What main needs is imported with this module, which jobsup.__main__ imports inside its own
    # KeyboardInterrupt handler: a Ctrl-C while psycopg loads exits 130 quietly too.
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except JobsupError as exc:
        print(f"jobsup: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except psycopg.Error as exc:
        print(f"jobsup: database error: {dsns.redact(first_line(exc))}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
