"""`jobsup bench`: how fast jobsup is on the database it is pointed at, leaving nothing behind.

The queue's SQL names the schema `jobsup` everywhere, so the bench cannot move to a schema of another
name without SQL of its own. It runs in the target database's `jobsup` schema, which it creates and
then drops, only where there is none yet. Where there is one (right after the quick start, it holds
jobs), it runs in a scratch database it creates on the same server and drops afterwards, when the role
may create databases; with --database NAME it always does, under that name. A failure or Ctrl-C still
drops what it made. The measurements are jobsup/ops/bench.py's, the code behind
benchmarks/bench_supervisor.py.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

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
STEPS = ("starting the supervisor", "pickup latency", "no-op jobs", "1 ms jobs", "100 ms jobs that wait")
ROWS = [  # (figure, label, format)
    ("enqueue_jobs_per_s", "bulk enqueue (20,000 in one transaction)", "{:,.0f} jobs/s"),
    ("noop_jobs_per_s", "no-op jobs (20,000)", "{:,.0f} jobs/s"),
    ("sleep_1ms_jobs_per_s", "1 ms jobs (5,000)", "{:,.0f} jobs/s"),
    ("wait_100ms_jobs_per_s", "100 ms async jobs, shared (5,000)", "{:,.0f} jobs/s"),
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
        "creates and drops where the database has none; where it has one, in a scratch "
        "database it creates and drops (the role needs CREATEDB), named by --database or "
        "by the bench. Nothing is left behind, also after a failure or Ctrl-C."
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
        "dropped afterwards (it must not exist); without it, the bench names one itself "
        "where the database has a jobsup schema",
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


# How the bench opens a connection to a DSN: with the prepare threshold of the pooler mode it runs under.
Connect = Callable[[str], psycopg.Connection]


@dataclass(frozen=True)
class Place:
    """Where the bench runs: its DSN, what it made there (for the last line), and the scratch database
    it runs in, if any (a --listen-dsn is pointed at it too)."""

    dsn: str
    made: str
    database: str | None = None


@contextmanager
def _uninterrupted() -> Iterator[None]:
    """Ctrl-C waits for the end of the block, then acts: a database the server created is always known
    to be ours, and a drop always runs to its end. The bench leaves nothing behind, interrupted or not."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught and callable(previous):
            previous(signal.SIGINT, None)  # Python's default handler raises KeyboardInterrupt here


@contextmanager
def _scratch_database(server_dsn: str, database: str, connect: Connect) -> Iterator[str]:
    """A database of this name, created, migrated, yielded as a DSN and dropped afterwards, whatever
    happens in between (a failure, Ctrl-C). psycopg.errors.InsufficientPrivilege when the role may not
    create databases: then nothing was made."""
    name = sql.Identifier(database)
    created = False
    try:
        with connect(server_dsn) as admin, _uninterrupted():
            admin.execute(sql.SQL(SQL["bench_create_database"]).format(name=name))
            created = True
        dsn = conninfo.make_conninfo(server_dsn, dbname=database)
        with connect(dsn) as conn:
            _install(conn)
        yield dsn
    finally:
        if created:
            with _uninterrupted(), connect(server_dsn) as admin:
                admin.execute(sql.SQL(SQL["bench_drop_database"]).format(name=name))


def scratch_name() -> str:
    """A database name of this run's own, so two benches on one server never meet."""
    return f"jobsup_bench_{os.getpid()}_{secrets.token_hex(3)}"


@contextmanager
def place(server_dsn: str, database: str | None, connect: Connect) -> Iterator[Place]:
    """Where to bench; removes what it made afterwards, also on a failure or Ctrl-C.

    --database NAME: that scratch database. Else the target's own jobsup schema when it has none (made
    and dropped). Else, where a jobsup schema exists (right after the quick start it holds jobs), a
    scratch database of a generated name, when the role may create one (CREATEDB or superuser): the
    bench never runs among the target's jobs. Only a role that may not is asked for another way.
    """
    if database:
        with connect(server_dsn) as admin:
            exists = admin.execute(SQL["bench_database_exists"], {"name": database}).fetchone()
            if one_row(exists, "bench_database_exists")[0]:
                raise BadInput(
                    f"database {database!r} exists: --database names a scratch database that "
                    "jobsup bench creates and drops"
                )
        with _scratch_database(server_dsn, database, connect) as dsn:
            yield Place(dsn, f"database {database}", database)
        return
    with connect(server_dsn) as conn:
        schema_exists = one_row(conn.execute(SQL["bench_schema_exists"]).fetchone(), "bench_schema_exists")[0]
    if schema_exists:
        name = scratch_name()
        with ExitStack() as stack:
            try:
                dsn = stack.enter_context(_scratch_database(server_dsn, name, connect))
            except psycopg.errors.InsufficientPrivilege:
                raise _may_not_create(server_dsn, connect) from None
            yield Place(dsn, f"database {name}", name)
        return
    try:
        with connect(server_dsn) as conn:
            _install(conn)
        yield Place(server_dsn, "schema jobsup")
    finally:
        # No schema was there before: whatever is there now is the bench's, even a migration cut short.
        with _uninterrupted(), connect(server_dsn) as conn:
            if one_row(conn.execute(SQL["bench_schema_exists"]).fetchone(), "bench_schema_exists")[0]:
                conn.execute(SQL["bench_drop_schema"])


def _may_not_create(server_dsn: str, connect: Connect) -> BadInput:
    """The refusal where a jobsup schema exists and the role may not create a scratch database."""
    where = dsns.redact(server_dsn)
    with connect(server_dsn) as conn:
        jobs = _jobs_held(conn)
    holds = f"holds {jobs} job{'s' if jobs != 1 else ''}" if jobs else "exists"
    return BadInput(
        f"the jobsup schema of {where} {holds} and this role may not create a scratch database "
        "(it needs CREATEDB): jobsup bench will not run in it; run it as a role that may (it makes one "
        "itself, or use --database NAME), or point --dsn at a database without a jobsup schema (nothing touched)"
    )


def _jobs_held(conn: psycopg.Connection) -> int:
    """The jobs of an existing schema, or 0 where they cannot be counted (no table, no privilege):
    only the refusal's wording depends on it."""
    try:
        return one_row(conn.execute(SQL["bench_jobs_held"]).fetchone(), "bench_jobs_held")[0]
    except (psycopg.errors.UndefinedTable, psycopg.errors.InsufficientPrivilege):
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
    with place(server, args.database, connect) as where, progress:
        dsn = where.dsn
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
                if where.database:
                    listen = conninfo.make_conninfo(listen, dbname=where.database)
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
    print(f"created {where.made} for the bench and dropped it again ({took:.0f}s)")
    return EXIT_OK
