"""What the console's health line and a whole `jobsup doctor` cost, with an empty jobs table and a full one.

    python -m benchmarks.bench_doctor [--dsn DSN] [--done N] [--calls N] [--sessions N]

Without --dsn it starts its own embedded PostgreSQL in a temporary directory under /tmp and removes it
at the end. It opens --sessions idle connections (pg_stat_activity is what the health line reads, so
its cost follows the number of sessions), times --calls health lines and a few doctor runs on an empty
jobs table, loads --done finished jobs, and times them again: the health line reads no table, so the
two should match. Figures are medians: wall (what the caller waits, one round trip over the Unix
socket) and, for the health line, the server's execution time (EXPLAIN ANALYZE).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import psycopg

from benchmarks import scratch
from jobsup.db.sql import STATEMENTS as SQL
from jobsup.ops.doctor import run_checks
from jobsup.ops.health import health_warning


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def measure(conn: psycopg.Connection, calls: int) -> tuple[float, float, float]:
    """Medians in ms: the health line's wall time and server time, and one doctor run's wall time."""
    health_warning(conn)  # warm: the first call plans the statement and loads the catalogs
    wall = []
    for _ in range(calls):
        started = time.perf_counter()
        health_warning(conn)
        wall.append(time.perf_counter() - started)
    server = [
        conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {SQL['health']}").fetchone()[0][0]["Execution Time"]
        for _ in range(max(5, calls // 10))
    ]
    doctor = []
    for _ in range(5):
        started = time.perf_counter()
        run_checks(conn)
        doctor.append(time.perf_counter() - started)
    return _median_ms(wall), statistics.median(server), _median_ms(doctor)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_doctor", description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", help="a scratch database to fill (default: an embedded server of its own)")
    parser.add_argument("--done", type=int, default=1_000_000, help="finished jobs to load (default 1,000,000)")
    parser.add_argument("--calls", type=int, default=200, help="health lines timed per measurement (default 200)")
    parser.add_argument("--sessions", type=int, default=50, help="idle sessions open meanwhile (default 50)")
    args = parser.parse_args(argv)

    idle: list[psycopg.Connection] = []
    with scratch.empty(args.dsn, "jd") as dsn:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                idle = [psycopg.connect(dsn, autocommit=True) for _ in range(args.sessions)]
                print(
                    f"load average {open('/proc/loadavg').read().split()[0]}; {args.sessions} idle sessions; "
                    f"medians of {args.calls} health lines and 5 doctor runs"
                )
                rows = [("empty jobs table", *measure(conn, args.calls))]
                conn.execute(
                    """
                    INSERT INTO jobsup.jobs (kind, status, attempts, done_at)
                    SELECT 'email', 'done', 1, now() FROM generate_series(1, %s)""",
                    (args.done,),
                )
                conn.execute("VACUUM ANALYZE jobsup.jobs")
                rows.append((f"{args.done:,} done jobs", *measure(conn, args.calls)))
        finally:
            for idle_conn in idle:
                idle_conn.close()
    print(f"{'':<22}{'health wall':>14}{'health server':>16}{'doctor wall':>14}")
    for label, wall, server, doctor in rows:
        print(f"{label:<22}{wall:>11.2f} ms{server:>13.2f} ms{doctor:>11.1f} ms")
    print(f"health line, full / empty: {rows[1][1] / rows[0][1]:.2f}x wall, {rows[1][2] / rows[0][2]:.2f}x server")
    return 0


if __name__ == "__main__":
    sys.exit(main())
