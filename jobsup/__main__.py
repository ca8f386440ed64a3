"""`python -m jobsup` and the `jobsup` command (pyproject's entry point is `main` here, not in jobsup.cli, so
that a Ctrl-C while the CLI's modules are still importing exits quietly with 130, not a traceback).
Nothing but the command runs this module: importing it changes the process's SIGINT handler."""

import os
import signal
import sys
import time

STARTED = time.perf_counter()  # the command's clock starts here: the time a command reports is from now
EXIT_INTERRUPTED = 130  # errors.EXIT_INTERRUPTED, not imported: this module must need nothing


def _interrupted_while_loading(signum: int, frame: object) -> None:
    # Only imports are under way: nothing to undo or to report, and a KeyboardInterrupt raised inside
    # one (a class being made, a module half run) could land where no handler catches it.
    os._exit(EXIT_INTERRUPTED)


# From the first line of the command's own code, until its modules are loaded and it can act on a
# KeyboardInterrupt itself.
signal.signal(signal.SIGINT, _interrupted_while_loading)


def main() -> int:
    from jobsup.cli import COMMANDS, load_commands
    from jobsup.cli import main as cli_main

    load_commands(COMMANDS)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return cli_main(started=STARTED)
    except KeyboardInterrupt:  # outside a command's run: while the arguments are parsed, say
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
