"""`jobsup bench`: how fast jobsup is on the database it is pointed at, leaving nothing behind.

The queue's SQL names the schema `jobsup` everywhere, so the bench cannot move to a schema of another
name without SQL of its own. It runs either in the target database's `jobsup` schema, which it creates
and then drops (so only where there is none yet), or with --database NAME in a scratch database it
creates on the same server and drops afterwards. The measurements are jobsup/ops/bench.py's, the code
behind benchmarks/bench_supervisor.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import conninfo, sql

from jobsup.db import dsn as dsns
from jobsup.db.sql import STATEMENTS as SQL
from jobsup.db.sql import one_row
from jobsup.errors import EXIT_OK, BadInput
from jobsup.ops import bench as benchmark

# Default runs: one takes about 15 s on a 2-core machine, so the default stays under a minute.
RUNS = 1
PROCS = min(8, os.cpu_count() or 2)
STEPS = ("starting the supervisor", "pickup latency", "no-op jobs", "1 ms jobs")
ROWS = [  # (figure, label, format)
    ("enqueue_jobs_per_s", "bulk enqueue (20,000 in one transaction)", "{:,.0f} jobs/s"),
    ("noop_jobs_per_s", "no-op jobs (20,000)", "{:,.0f} jobs/s"),
    ("sleep_1ms_jobs_per_s", "1 ms jobs (5,000)", "{:,.0f} jobs/s"),
    ("pickup_p50_ms", "pickup latency p50", "{:.2f} ms"),
    ("pickup_p95_ms", "pickup latency p95", "{:.2f} ms"),
    ("pickup_p99_ms", "pickup latency p99", "{:.2f} ms"),
    ("supervisor_cpu_of_one_core", "supervisor CPU (no-op run)", "{:.0%} of a core"),
    ("rss_per_worker_mb", "RSS per worker", "{:.1f} MB"),
]


HELP = "measure jobsup on this database"


def configure(parser: argparse.ArgumentParser) -> None:
    from jobsup.cli.options import positive_int as _positive_int

    parser.description = (
        "Measure jobsup on this database: bulk enqueue, no-op and 1 ms throughput through "
        "`jobsup start --procs N`, and pickup latency. It works in a jobsup schema it "
        "creates and drops (refused where one exists), or with --database in a scratch "
        "database it creates and drops; nothing is left behind."
    )
    parser.add_argument(
        "--procs", type=_positive_int, default=PROCS, help=f"worker processes of the supervisor (default {PROCS})"
    )
    parser.add_argument(
        "--runs",
        type=_positive_int,
        default=RUNS,
        help=f"runs; figures are their medians (default {RUNS}, about 15 s each)",
    )
    parser.add_argument(
        "--database",
        metavar="NAME",
        help="bench in a scratch database of this name, created on the same server and "
        "dropped afterwards (it must not exist)",
    )
    parser.add_argument(
        "--pooler",
        default=None,
        choices=dsns.POOLERS,
        help="what the DSN leads to, as for jobsup start (env JOBSUP_POOLER; default none)",
    )
    parser.add_argument("--listen-dsn", help="as for jobsup start: a direct connection for LISTEN")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.set_defaults(run=run)


@contextmanager
def place(server_dsn: str, database: str | None, connect) -> Iterator[tuple[str, str]]:
    """Where to bench: yields (dsn, what was made there); removes it afterwards."""
    if database:
        name = sql.Identifier(database)
        with connect(server_dsn) as admin:
            if admin.execute(SQL["bench_database_exists"], {"name": database}).fetchone()[0]:
                raise BadInput(
                    f"database {database!r} exists: --database names a scratch database that "
                    "jobsup bench creates and drops"
                )
            admin.execute(sql.SQL(SQL["bench_create_database"]).format(name=name))
        try:
            dsn = conninfo.make_conninfo(server_dsn, dbname=database)
            with connect(dsn) as conn:
                _install(conn)
            yield dsn, f"database {database}"
        finally:
            with connect(server_dsn) as admin:
                admin.execute(sql.SQL(SQL["bench_drop_database"]).format(name=name))
        return
    with connect(server_dsn) as conn:
        if conn.execute(SQL["bench_schema_exists"]).fetchone()[0]:
            jobs = _jobs_held(conn)
            where = dsns.redact(server_dsn)
            if jobs:
                raise BadInput(
                    f"the jobsup schema of {where} holds {jobs} job{'s' if jobs != 1 else ''}: "
                    "jobsup bench will not run among them; use --database NAME for a scratch database "
                    "(nothing touched)"
                )
            raise BadInput(
                f"{where} has a jobsup schema already: jobsup bench only runs in one it creates "
                "and drops; use --database NAME for a scratch database (nothing touched)"
            )
        _install(conn)
    try:
        yield server_dsn, "schema jobsup"
    finally:
        with connect(server_dsn) as conn:
            conn.execute(SQL["bench_drop_schema"])


def _jobs_held(conn: psycopg.Connection) -> int:
    try:
        return one_row(conn.execute(SQL["bench_jobs_held"]).fetchone(), "bench_jobs_held")[0]
    except psycopg.errors.UndefinedTable:
        return 0


def _install(conn: psycopg.Connection) -> None:
    from jobsup.db.migrate import migrate

    migrate(conn)
    conn.execute(SQL["bench_pickup_table"])


def run(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    mode = dsns.pooler(args.pooler)
    server = dsns.resolve(args.dsn, args.data_dir)
    if args.listen_dsn:
        dsns.check(args.listen_dsn)

    def connect(dsn: str) -> psycopg.Connection:
        return dsns.connect(dsn, prepare_threshold=dsns.prepare_threshold(mode))

    runs: list[dict[str, float]] = []
    started = time.perf_counter()
    progress = Progress(
        TextColumn("{task.description:<28}"),
        BarColumn(),
        TimeElapsedColumn(),
        transient=True,
        disable=not sys.stderr.isatty(),
    )
    with place(server, args.database, connect) as (dsn, made), progress:
        task = progress.add_task("preparing", total=len(STEPS) * args.runs)
        for number in range(1, args.runs + 1):
            seen: list[str] = []

            # This run's list and number, bound as defaults rather than read from the loop when called.
            def step(name: str, seen: list[str] = seen, number: int = number) -> None:
                if seen:
                    progress.advance(task)
                seen.append(name)
                progress.update(task, description=f"run {number}/{args.runs}: {name}")

            start_args: tuple[str, ...] = ("--pooler", mode)
            if args.listen_dsn:
                listen = args.listen_dsn
                if args.database:
                    listen = conninfo.make_conninfo(listen, dbname=args.database)
                start_args += ("--listen-dsn", listen)
            runs.append(
                benchmark.one_run(
                    dsn, args.procs, start_args=start_args, connect=connect, env={"JOBSUP_POOLER": mode}, step=step
                )
            )
            progress.advance(task)
    medians = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    took = time.perf_counter() - started
    load = os.getloadavg()[0]
    if args.json:
        print(
            json.dumps(
                {
                    "procs": args.procs,
                    "runs": args.runs,
                    "pooler": mode,
                    "seconds": round(took, 1),
                    "load_average": load,
                    "median": medians,
                    "each_run": runs,
                },
                indent=2,
            )
        )
        return EXIT_OK
    print(
        f"jobsup bench: {dsns.redact(dsn)}, --procs {args.procs}, "
        f"{'median of ' + str(args.runs) + ' runs' if args.runs > 1 else '1 run'}, "
        f"{os.cpu_count()} cores, load {load:.1f}"
    )
    for key, label, fmt in ROWS:
        print(f"  {label:<42} {fmt.format(medians[key]):>16}")
    print(f"created {made} for the bench and dropped it again ({took:.0f}s)")
    return EXIT_OK
