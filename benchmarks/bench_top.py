"""What one refresh of `jobsup top` costs the database with a million finished jobs in the table.

    python -m benchmarks.bench_top [--dsn DSN] [--done N] [--refreshes N]

Without --dsn it starts its own embedded PostgreSQL in a short temporary directory under /tmp (the Unix
socket lives there, and its path must stay under ~100 bytes) and stops and removes it at the end. It
fills the jobs table with --done finished jobs (generate_series, with matching per-kind totals) beside a
realistic live part: ready, scheduled and running jobs, dead jobs, two supervisors with workers and some
reaper events, and full latency histograms (5 kinds, both metrics, 40 buckets each, every
row the pruner keeps). Then it times --refreshes refreshes of the console's Source, twice: right after the
load, before any ANALYZE (a table that just grew), and after VACUUM ANALYZE. The latency statement is
also timed alone before the finished jobs are loaded and after: reading percentiles costs the same
with a million finished jobs as with none.

Two figures per refresh:
  wall      what the console waits: one pipelined round trip over the Unix socket plus building the figures
  database  the sum of the server's execution times of the refresh's statements (EXPLAIN ANALYZE)
The target is a database time under 20 ms; both are printed as medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

import psycopg

from benchmarks import scratch
from jobsup.db.sql import STATEMENTS as SQL
from jobsup.monitor.source import Source, _statements

TARGET_MS = 20.0
KINDS = ("email", "report", "resize", "webhook", "sms")


def load(conn: psycopg.Connection, done: int) -> None:
    conn.execute(
        """
        INSERT INTO jobsup.jobs (queue, kind, payload, status, attempts, created_at, started_at, done_at, run_at)
        SELECT 'default', (ARRAY['email','report','resize','webhook','sms'])[1 + mod(i, 5)], jsonb_build_object('n', i),
               'done', 1, now() - interval '1 day', now() - interval '1 day', now() - mod(i, 86400) * interval '1 s',
               now() - interval '1 day'
        FROM generate_series(1, %s) AS i""",
        (done,),
    )
    conn.execute("""
        INSERT INTO jobsup.kind_totals (kind, slot, done, failed, dead)
        SELECT kind, 0, count(*), 0, 0 FROM jobsup.jobs GROUP BY kind""")
    # The live part: 2,000 ready, 300 scheduled, 40 running, 500 dead over three errors.
    conn.execute("""
        INSERT INTO jobsup.jobs (queue, kind, status, run_at)
        SELECT (ARRAY['default','reports'])[1 + mod(i, 2)],
               (ARRAY['email','report','resize','webhook','sms'])[1 + mod(i, 5)],
               'queued', now() - mod(i, 300) * interval '1 s'
        FROM generate_series(1, 2000) AS i""")
    conn.execute("""
        INSERT INTO jobsup.jobs (kind, status, run_at)
        SELECT 'email', 'queued', now() + mod(i, 3600) * interval '1 s' FROM generate_series(1, 300) AS i""")
    conn.execute("""
        INSERT INTO jobsup.jobs (kind, status, attempts, locked_by, locked_until, started_at)
        SELECT 'report', 'running', 1, 'bench-sup', now() + interval '30 s', now() FROM generate_series(1, 40)""")
    conn.execute("""
        INSERT INTO jobsup.jobs (kind, status, attempts, max_attempts, done_at, last_error, errors)
        SELECT (ARRAY['email','resize','webhook'])[1 + mod(i, 3)], 'dead', 3, 3, now() - i * interval '1 s',
               (ARRAY['SMTP timeout','worker exited with code -9','HTTP 502 from hook'])[1 + mod(i, 3)],
               '[{"attempt": 3, "error": "x"}]'
        FROM generate_series(1, 500) AS i""")
    conn.execute("""
        UPDATE jobsup.kind_totals t SET dead = d.n, failed = d.n * 3
        FROM (SELECT kind, count(*) AS n FROM jobsup.jobs WHERE status = 'dead' GROUP BY kind) d
        WHERE t.kind = d.kind""")
    workers = json.dumps(
        [
            {
                "pid": 1000 + i,
                "state": "busy" if i % 2 else "idle",
                "job_id": i,
                "kind": "report",
                "rss": 50 << 20,
                "cpu": 10.0,
                "jobs_done": 100,
                "restarts": 0,
            }
            for i in range(8)
        ]
    )
    for n in range(2):
        conn.execute(
            "INSERT INTO jobsup.supervisors (id, host, pid, version, queues, procs, workers) "
            "VALUES (%s, 'bench', %s, '0', '{default,reports}', 8, %s)",
            (f"bench-{n}", 100 + n, workers),
        )
    conn.execute("""
        INSERT INTO jobsup.events (at, action, supervisor, count, job_ids, detail)
        SELECT now() - i * interval '37 s', 'reaped', 'bench-0', 2, ARRAY[i, i + 1]::bigint[],
               '{"from": ["bench-9"], "dead": 0}'
        FROM generate_series(1, 1000) AS i""")


def load_latency(conn: psycopg.Connection) -> None:
    """As many rows as the pruner keeps (12 periods of 1 and of 10 minutes) for each kind and metric,
    each with 40 buckets, more than most kinds fill."""
    conn.execute(
        """
        INSERT INTO jobsup.latency (period, minute, kind, metric, buckets, counts)
        SELECT p, date_bin(make_interval(mins => p), now(), TIMESTAMPTZ '2000-01-01 00:00:00+00')
                  - m * p * interval '1 minute', k, metric,
               ARRAY(SELECT 180 + 2 * b FROM generate_series(0, 39) AS b),
               ARRAY(SELECT (1 + mod(b * 7 + m, 50))::bigint FROM generate_series(0, 39) AS b)
        FROM generate_series(0, 11) AS m, unnest(ARRAY[1, 10]) AS p, unnest(%s::text[]) AS k,
             unnest(ARRAY['queue_latency', 'run_time']) AS metric""",
        (list(KINDS),),
    )


def statement_ms(conn: psycopg.Connection, name: str, runs: int) -> float:
    """The median server time (planning and execution) of one statement."""
    times = []
    for _ in range(runs):
        plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + SQL[name]).fetchone()[0]
        times.append(plan[0]["Planning Time"] + plan[0]["Execution Time"])
    return statistics.median(times)


def database_ms(conn: psycopg.Connection) -> float:
    """The server's execution time of one refresh's statements, summed."""
    total = 0.0
    for name, params in _statements(None, 30):
        plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + SQL[name], params).fetchone()[0]
        total += plan[0]["Planning Time"] + plan[0]["Execution Time"]
    return total


async def wall_ms(dsn: str, refreshes: int) -> list[float]:
    source = Source(dsn)
    try:
        await source.refresh()  # connect outside the timing
        times = []
        for _ in range(refreshes):
            started = time.perf_counter()
            await source.refresh()
            times.append((time.perf_counter() - started) * 1000)
        return times
    finally:
        await source.close()


def measure(dsn: str, refreshes: int, label: str) -> float:
    with psycopg.connect(dsn, autocommit=True) as conn:
        db = statistics.median(database_ms(conn) for _ in range(refreshes))
    wall = statistics.median(asyncio.run(wall_ms(dsn, refreshes)))
    print(f"  {label:<28} database {db:6.2f} ms   wall {wall:6.2f} ms   (medians of {refreshes})")
    return db


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_top", description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", help="a scratch database to fill (default: an embedded server of its own)")
    parser.add_argument("--done", type=int, default=1_000_000, help="finished jobs to load (default 1,000,000)")
    parser.add_argument("--refreshes", type=int, default=20, help="refreshes timed per measurement (default 20)")
    args = parser.parse_args(argv)

    with scratch.empty(args.dsn, "jt") as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            load_latency(conn)
            empty = statement_ms(conn, "latency_read", args.refreshes)
            started = time.perf_counter()
            load(conn, args.done)
            full = statement_ms(conn, "latency_read", args.refreshes)
            print(
                f"latency_read ({len(KINDS)} kinds, 40 buckets each): {empty:.2f} ms with no finished "
                f"job, {full:.2f} ms with {args.done:,} (medians of {args.refreshes})"
            )
            print(
                f"loaded {args.done:,} done jobs and a live part in {time.perf_counter() - started:.1f}s; "
                "one refresh of jobsup top costs:"
            )
        first = measure(dsn, args.refreshes, "just loaded, no ANALYZE")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE jobsup.jobs")
        second = measure(dsn, args.refreshes, "after VACUUM ANALYZE")
        worst = max(first, second)
        verdict = "under" if worst < TARGET_MS else "OVER"
        print(f"database time {worst:.2f} ms: {verdict} the {TARGET_MS:g} ms target")
        return 0 if worst < TARGET_MS else 1


if __name__ == "__main__":
    sys.exit(main())
