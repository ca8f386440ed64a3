"""Flags of `jobsup top` (textual is imported only when the command runs)."""

from __future__ import annotations

import argparse
import os

from jobsup.errors import EXIT_OK
from jobsup.monitor.figures import DEFAULT_REFRESH, DEFAULT_WARN_AGE, STALE_AFTER


def _env(name: str, default: object) -> object:
    return os.environ.get(f"JOBSUP_TOP_{name.upper()}", default)


HELP = "the live console"


def configure(parser: argparse.ArgumentParser) -> None:
    from jobsup.cli.options import duration as _duration
    from jobsup.cli.options import truthy

    parser.description = (
        "The live console: counts by status and kind, queue ages, throughput, dead jobs "
        "(requeue them with r and R), reaper activity, supervisors and their workers. "
        "With no --dsn it opens the embedded database that `jobsup start` uses."
    )
    parser.add_argument(
        "--refresh",
        type=_duration,
        default=_env("refresh", DEFAULT_REFRESH),
        help=f"time between refreshes (env JOBSUP_TOP_REFRESH; default {DEFAULT_REFRESH:g}s)",
    )
    parser.add_argument(
        "--warn-age",
        type=_duration,
        default=_env("warn_age", DEFAULT_WARN_AGE),
        help="an oldest ready job older than this is shown as a warning "
        f"(env JOBSUP_TOP_WARN_AGE; default {DEFAULT_WARN_AGE:g}s)",
    )
    parser.add_argument(
        "--stale-after",
        type=_duration,
        default=_env("stale_after", STALE_AFTER),
        help="a supervisor whose heartbeat is older than this is shown as stale "
        f"(env JOBSUP_TOP_STALE_AFTER; default {STALE_AFTER:g}s)",
    )
    parser.add_argument(
        "--max-xmin-age",
        type=_duration,
        default=_env("max_xmin_age", 300.0),
        help="a snapshot or transaction holding back vacuum longer than this is the header's "
        "health warning, as for `jobsup doctor` (env JOBSUP_TOP_MAX_XMIN_AGE; default 5m; "
        "0 turns it off)",
    )
    parser.add_argument(
        "--read-only",
        action="store_true",
        default=truthy(_env("read_only", "")),
        help="hide and refuse every action that changes data (env JOBSUP_TOP_READ_ONLY=1)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from jobsup.db import dsn as dsns
    from jobsup.db.migrate import require_schema
    from jobsup.errors import BadInput

    refresh = float(args.refresh)
    if refresh <= 0:
        raise BadInput("--refresh must be more than 0")
    dsn = dsns.resolve(args.dsn, args.data_dir)
    # One clear message and a non-zero exit for a bad DSN or a missing schema, before the screen opens.
    with dsns.connect(dsn) as conn:
        require_schema(conn)

    from jobsup.monitor.app import TopApp
    from jobsup.monitor.source import Source
    from jobsup.ops.doctor import Thresholds

    source = Source(dsn, read_only=args.read_only, thresholds=Thresholds(max_xmin_age=float(args.max_xmin_age)))
    TopApp(
        source,
        refresh=refresh,
        warn_age=float(args.warn_age),
        stale_after=float(args.stale_after),
        read_only=args.read_only,
    ).run()
    return EXIT_OK
