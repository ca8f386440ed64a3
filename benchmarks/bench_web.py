"""What the web console costs the database: per open page, and per page on a big table.

    python -m benchmarks.bench_web [--dsn DSN] [--only cost|speed] [--jobs N] [--dead N] [--ready N]
                                   [--kinds N] [--errors N] [--clients N] [--few N] [--seconds S]

cost   `jobsup web` (its shared refresh every second) with --few live clients, then --clients, each
       doing what an open overview does (poll live.json every second and read the page's <main> each
       time) while a job is enqueued every second, so every client receives every update. The figure
       is the transactions per second the database commits (pg_stat_database.xact_commit of the
       database) over --seconds: with 20 clients it must be no more than with 2, within a tolerance
       of 10 % plus 1 transaction a second (the enqueues, the statistics' own sampling and autovacuum
       land in both runs unevenly).
speed  --jobs jobs in the table (--dead dead across --errors errors and --kinds kinds, --ready ready,
       the rest done), `jobsup web --refresh 1ms` (so every request reads the figures anew, no cache):
       the median of 20 answers of the overview, the dead jobs and a dead job's page, each under 200 ms.

Without --dsn it starts its own embedded PostgreSQL in a temporary directory, removed at the end.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psycopg

from benchmarks import scratch
from jobsup import client

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench"
TOLERANCE = 0.10  # the share by which 20 clients may exceed 2 ...
SLACK = 1.0  # ... plus this many transactions a second
TARGET_MS = 200.0
SAMPLES = 20


@contextmanager
def web(dsn: str, *args: str) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobsup", "web", "--dsn", dsn, "--port", str(port), "--token", TOKEN, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split("serving ", 1)[1].strip()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                httpx.get(url.split("?")[0] + "healthz")
                break
            except httpx.TransportError:
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def commits(conn: psycopg.Connection) -> int:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").fetchone()[0]


def viewer(url: str, stop: threading.Event, seen: list[set[str]]) -> None:
    """One open overview: what jobsup.js does, every second."""
    versions: set[str] = set()
    seen.append(versions)
    base = url.split("?")[0]
    with httpx.Client(follow_redirects=True, timeout=10) as http:
        http.get(url)
        while not stop.wait(1.0):
            state = http.get(base + "live.json").json()
            versions.add(state.get("version", "?"))
            http.get(base, headers={"X-Jobsup-Fragment": "1"})


def cost(dsn: str, clients: int, seconds: float) -> tuple[float, int]:
    """Transactions committed per second with `clients` open overviews; the fewest updates a client saw."""
    with web(dsn) as url, psycopg.connect(dsn, autocommit=True) as conn:
        stop = threading.Event()
        seen: list[set[str]] = []
        threads = [threading.Thread(target=viewer, args=(url, stop, seen)) for _ in range(clients)]
        for t in threads:
            t.start()
        time.sleep(2)  # every client has its first page
        before, started = commits(conn), time.monotonic()
        while time.monotonic() - started < seconds:
            client.enqueue(conn, "email", {})  # an update each second, for every client to receive
            time.sleep(1.0)
        time.sleep(1.0)  # the statistics of the last second are flushed (PostgreSQL: at least every second)
        rate = (commits(conn) - before) / (time.monotonic() - started)
        stop.set()
        for t in threads:
            t.join()
    return rate, min(len(v) for v in seen)


def load(conn: psycopg.Connection, jobs: int, dead: int, ready: int, kinds: int, errors: int) -> int:
    done = jobs - dead - ready
    conn.execute(
        """INSERT INTO jobsup.jobs (kind, payload, status, attempts, created_at, started_at, done_at, run_at)
        SELECT 'kind' || mod(i, %(kinds)s), jsonb_build_object('n', i), 'done', 1, now() - interval '1 day',
               now() - interval '1 day', now() - mod(i, 86400) * interval '1 s', now() - interval '1 day'
        FROM generate_series(1, %(n)s) AS i""",
        {"n": done, "kinds": kinds},
    )
    conn.execute(
        """INSERT INTO jobsup.jobs (kind, payload, status, attempts, max_attempts, done_at, last_error, errors)
        SELECT 'kind' || mod(i, %(kinds)s), jsonb_build_object('n', i), 'dead', 3, 3, now() - i * interval '1 s',
               'error number ' || mod(i, %(errors)s),
               jsonb_build_array(jsonb_build_object(
                   'attempt', 3, 'at', now(), 'error', 'error number ' || mod(i, %(errors)s)))
        FROM generate_series(1, %(n)s) AS i""",
        {"n": dead, "kinds": kinds, "errors": errors},
    )
    conn.execute(
        """INSERT INTO jobsup.jobs (kind, payload, status, run_at)
        SELECT 'kind' || mod(i, %(kinds)s), '{}', 'queued', now() - mod(i, 600) * interval '1 s'
        FROM generate_series(1, %(n)s) AS i""",
        {"n": ready, "kinds": kinds},
    )
    conn.execute("""
        INSERT INTO jobsup.kind_totals (kind, slot, done, failed, dead)
        SELECT kind, 0, count(*) FILTER (WHERE status = 'done'), 3 * count(*) FILTER (WHERE status = 'dead'),
               count(*) FILTER (WHERE status = 'dead')
        FROM jobsup.jobs WHERE status IN ('done', 'dead') GROUP BY kind""")
    conn.execute("VACUUM ANALYZE jobsup.jobs")
    return conn.execute("SELECT id FROM jobsup.jobs WHERE status = 'dead' ORDER BY id DESC LIMIT 1").fetchone()[0]


def median_ms(http: httpx.Client, url: str) -> float:
    times = []
    for _ in range(SAMPLES):
        started = time.perf_counter()
        answer = http.get(url)
        times.append((time.perf_counter() - started) * 1000)
        assert answer.status_code == 200, (url, answer.status_code, answer.text[:300])
    return statistics.median(times)


def speed(dsn: str, args: argparse.Namespace) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        started = time.perf_counter()
        job_id = load(conn, args.jobs, args.dead, args.ready, args.kinds, args.errors)
        print(
            f"loaded {args.jobs:,} jobs ({args.dead:,} dead across {args.errors} errors and {args.kinds} kinds, "
            f"{args.ready:,} ready, the rest done) in {time.perf_counter() - started:.0f}s"
        )
    ok = True
    with web(dsn, "--refresh", "1ms") as url, httpx.Client(follow_redirects=True, timeout=30) as http:
        base = url.split("?")[0]
        http.get(url)
        for name, path in (("overview", ""), ("dead jobs", "dead"), ("a dead job's page", f"jobs/{job_id}")):
            ms = median_ms(http, base + path)
            ok = ok and ms < TARGET_MS
            verdict = "under" if ms < TARGET_MS else "OVER"
            print(f"{name}: {ms:.1f} ms (median of {SAMPLES}, no cache): {verdict} {TARGET_MS:g} ms")
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_web", description=__doc__.split("\n")[0])
    p.add_argument("--dsn", help="a scratch database server (default: an embedded server of its own)")
    p.add_argument("--only", choices=("cost", "speed"))
    p.add_argument("--jobs", type=int, default=1_000_000)
    p.add_argument("--dead", type=int, default=100_000)
    p.add_argument("--ready", type=int, default=10_000)
    p.add_argument("--kinds", type=int, default=200)
    p.add_argument("--errors", type=int, default=50)
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--few", type=int, default=2)
    p.add_argument("--seconds", type=float, default=20.0)
    args = p.parse_args(argv)
    ok = True
    if args.only in (None, "cost"):
        with scratch.database(args.dsn, "jobsup_bench_web_cost") as dsn:
            few, few_seen = cost(dsn, args.few, args.seconds)
            many, many_seen = cost(dsn, args.clients, args.seconds)
        limit = few * (1 + TOLERANCE) + SLACK
        held = many <= limit
        ok = ok and held
        print(
            f"transactions committed per second: {few:.2f} with {args.few} live clients, {many:.2f} with "
            f"{args.clients} (limit {limit:.2f}: {args.few}'s + {TOLERANCE:.0%} + {SLACK:g}/s): "
            f"{'held' if held else 'EXCEEDED'}; updates each client saw, at least: {few_seen} and {many_seen} "
            f"of {int(args.seconds)} enqueues"
        )
    if args.only in (None, "speed"):
        with scratch.database(args.dsn, "jobsup_bench_web_speed") as dsn:
            ok = speed(dsn, args) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
