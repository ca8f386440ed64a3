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
import os
import select
import sys
import time
from collections.abc import Sequence
from types import ModuleType

import psycopg

from jobsup.cli import options
from jobsup.db import dsn as dsns
from jobsup.errors import EXIT_BROKEN_PIPE, EXIT_FAILURE, EXIT_INTERRUPTED, JobsupError, first_line

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
    "limit",
    "explain",
    "workflow",
    "web",
)


def load_commands(names: Sequence[str]) -> list[ModuleType]:
    """The modules of the commands `names`, imported (the entry point imports them all before it lets a
    Ctrl-C become a KeyboardInterrupt)."""
    return [importlib.import_module(f"jobsup.cli.{name.replace('-', '_')}") for name in names]


def build_parser() -> argparse.ArgumentParser:
    from jobsup import __version__

    db, embedded_only = options.database_options(), options.database_options(dsn=False)
    parser = options.Parser(
        prog="jobsup", description="A PostgreSQL job queue with a process supervisor and a console."
    )
    parser.add_argument("--version", action="version", version=f"jobsup {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=options.Parser)
    sub.required = True
    for name, module in zip(COMMANDS, load_commands(COMMANDS), strict=True):
        parent = embedded_only if getattr(module, "EMBEDDED_ONLY", False) else db
        module.configure(sub.add_parser(name, parents=[parent], help=module.HELP))
    return parser


def _is_devnull(stream: object) -> bool:
    try:
        fd = stream.fileno()  # type: ignore[attr-defined]
        here, null = os.fstat(fd), os.stat(os.devnull)
    except (AttributeError, OSError, ValueError):
        return False
    return (here.st_dev, here.st_ino) == (null.st_dev, null.st_ino)


def _reader_gone(stream: object) -> bool:
    """Whether the pipe or socket `stream` writes to has lost its reader: poll reports an error or a
    hang-up on the writing end. True where that cannot be asked (no poll on Windows)."""
    try:
        poller = select.poll()
        poller.register(stream.fileno(), select.POLLOUT)  # type: ignore[attr-defined]
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return True


def main(argv: Sequence[str] | None = None, started: float | None = None) -> int:
    """Run the command `argv` (sys.argv's by default); its exit status. `started`: when the command
    began, by time.perf_counter (the entry point's first line), for the commands that report their time."""
    # The standard output of every command, its --help included, goes through here once: a closed pipe
    # is handled in one place, not by each print.
    stdout_was_devnull = _is_devnull(sys.stdout)
    try:
        try:
            return _main(argv, time.perf_counter() if started is None else started)
        finally:
            # Flushed here, where a broken pipe can still be caught: the interpreter's own flush at
            # exit would print "Exception ignored ... BrokenPipeError" and exit 120.
            if sys.stdout is not None:
                sys.stdout.flush()
    except BrokenPipeError:
        if not _reader_gone(sys.stdout):
            raise  # another pipe broke (a worker's, a socket's): a fault to show, not a reader that left
        # Python's recipe (library/signal, "Note on SIGPIPE"): what is still buffered goes to
        # os.devnull, so the final flush at exit does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except SystemExit as exc:
        # rich's Console (stats, cron) handles a broken pipe itself: it points stdout at os.devnull and
        # raises SystemExit(1). That is the same closed pipe, with the same status as any other.
        if exc.code == 1 and not stdout_was_devnull and _is_devnull(sys.stdout):
            return EXIT_BROKEN_PIPE
        raise


def _main(argv: Sequence[str] | None, started: float) -> int:
    # jobsup.__main__ imports this package and every command's module while a Ctrl-C ends the process
    # with 130 at once; from then on it is a KeyboardInterrupt, caught here from the parse on.
    try:
        args = build_parser().parse_args(argv)
        args.started = started
        return int(args.run(args))
    except JobsupError as exc:
        print(f"jobsup: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except psycopg.Error as exc:
        print(f"jobsup: database error: {dsns.redact(first_line(exc))}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
