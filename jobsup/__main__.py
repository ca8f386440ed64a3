"""`python -m jobsup` and the `jobsup` command (pyproject's entry point is `main` here, not in jobsup.cli, so
that a Ctrl-C while the CLI's modules are still importing exits quietly with 130, not a traceback)."""

import sys

EXIT_INTERRUPTED = 130  # errors.EXIT_INTERRUPTED, not imported: this module must need nothing


def main() -> int:
    try:
        from jobsup.cli import main as cli_main
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
