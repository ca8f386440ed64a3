"""`jobsup migrate`: create or upgrade the schema, under an advisory lock, safe to run twice."""

from __future__ import annotations

import argparse

from jobsup.cli.options import connect
from jobsup.errors import EXIT_OK

HELP = "create or upgrade the jobsup schema"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from jobsup.db.migrate import LATEST, migrate

    with connect(args, check_schema=False) as conn:
        applied = migrate(conn)
    if applied:
        for m in applied:
            print(f"applied migration {m.version:04d}_{m.name}")
    else:
        print(f"schema up to date (version {LATEST})")
    return EXIT_OK
