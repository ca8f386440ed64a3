"""The supervisor benchmark: `jobsup start --procs 8` on a real PostgreSQL, beside plain SQL.

    .venv/bin/python -m benchmarks.bench_supervisor [--dsn DSN] [--runs 3] [--procs 8] [--json PATH]
        [--only basic,drain,metrics] [--depths 20000,200000,1000000] [--drain-runs N]

Each run measures, through one supervisor started with default flags (jobsup/ops/bench.py, the code
`jobsup bench` runs too):
  - 20,000 no-op jobs enqueued in one transaction: its jobs/s, then jobs/s from its commit to the last done;
  - 5,000 jobs that sleep 1 ms: the same;
  - pickup latency at low load: 200 jobs enqueued one at a time, 20 ms apart, into an idle system
    (after 30 unmeasured ones), from the enqueuer's commit returning to the handler starting (both
    clocks are this machine's);
  - the supervisor's own CPU during the no-op run, as a share of one core and of the machine;
  - RSS per worker, as the supervisor's heartbeat reports it.
and, in the same run, plain SQL claim-plus-complete by 8 processes in batches of 100 (the ceiling a
queue on this server cannot beat). Figures are medians over the runs; the machine is shared and noisy.

`--only metrics` runs the same measurements in pairs, one supervisor without --metrics-port
and one with it, scraped every second over HTTP meanwhile (Prometheus scrapes every 15 s by default),
alternating in each run, and prints the ratio of their no-op throughput.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import drain, scratch
from jobsup.db.sql import STATEMENTS as SQL
from jobsup.ops import bench as benchmark

PLAIN_JOBS = 20_000
PLAIN_BATCH = 100


def _plain_worker(dsn: str, barrier, results) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        barrier.wait()
        handled = 0
        while True:
            ids = [
                r[0]
                for r in conn.execute(
                    "UPDATE bench_plain SET status = 'running', attempts = attempts + 1 WHERE id IN ("
                    " SELECT id FROM bench_plain WHERE status = 'queued' ORDER BY id LIMIT %s"
                    " FOR UPDATE SKIP LOCKED) RETURNING id",
                    (PLAIN_BATCH,),
                    prepare=True,
                ).fetchall()
            ]
            if not ids:
                break
            conn.execute("UPDATE bench_plain SET status = 'done' WHERE id = ANY(%s)", (ids,), prepare=True)
            handled += len(ids)
        results.put(handled)


def plain_sql(dsn: str, procs: int) -> float:
    """Claim-plus-complete in plain SQL, `procs` processes in batches of PLAIN_BATCH: jobs/s."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_plain")
        conn.execute(
            "CREATE TABLE bench_plain (id bigserial PRIMARY KEY, kind text, payload jsonb,"
            " status text, attempts int DEFAULT 0)"
        )
        conn.execute("CREATE INDEX ON bench_plain (id) WHERE status = 'queued'")
        conn.execute(
            "INSERT INTO bench_plain (kind, payload, status) SELECT 'noop', '{}', 'queued' FROM generate_series(1, %s)",
            (PLAIN_JOBS,),
        )
        conn.execute("VACUUM ANALYZE bench_plain")
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(procs + 1), ctx.Queue()
    workers = [ctx.Process(target=_plain_worker, args=(dsn, barrier, results)) for _ in range(procs)]
    for w in workers:
        w.start()
    barrier.wait()
    started = time.perf_counter()
    handled = sum(results.get(timeout=300) for _ in workers)
    elapsed = time.perf_counter() - started
    for w in workers:
        w.join()
    assert handled == PLAIN_JOBS
    return handled / elapsed


def one_run(dsn: str, procs: int) -> dict[str, float]:
    """The supervisor's figures (jobsup.ops.bench, as `jobsup bench` measures them), then plain SQL."""
    figures = benchmark.one_run(dsn, procs, connect=lambda d: psycopg.connect(d, autocommit=True))
    plain = plain_sql(dsn, procs)
    return {
        **figures,
        "plain_sql_claim_complete_b100_per_s": plain,
        "noop_vs_plain_sql": figures["noop_jobs_per_s"] / plain,
    }


ROWS = [
    ("enqueue_jobs_per_s", "bulk enqueue of the 20,000 (one transaction)", "{:,.0f} jobs/s", ""),
    ("noop_jobs_per_s", "20,000 no-op jobs", "{:,.0f} jobs/s", ">= 10,000"),
    ("sleep_1ms_jobs_per_s", "5,000 jobs of 1 ms", "{:,.0f} jobs/s", ">= 6,000 (limit 8,000)"),
    ("pickup_p50_ms", "pickup p50", "{:.2f} ms", "< 2 ms"),
    ("pickup_p95_ms", "pickup p95", "{:.2f} ms", ""),
    ("pickup_p99_ms", "pickup p99", "{:.2f} ms", "< 5 ms"),
    ("supervisor_cpu_of_one_core", "supervisor CPU (no-op run)", "{:.0%} of a core", ""),
    ("supervisor_cpu_of_machine", "  of the machine", "{:.0%}", ""),
    ("rss_per_worker_mb", "RSS per worker", "{:.1f} MB", ""),
    ("plain_sql_claim_complete_b100_per_s", "plain SQL claim+complete, 8 procs, batch 100", "{:,.0f} jobs/s", ""),
    ("noop_vs_plain_sql", "no-op through jobsup / plain SQL", "{:.2f}", ""),
]


def bench_args(doc: str, runs: int) -> argparse.Namespace:
    """The flags every benchmark takes, parsed."""
    return bench_parser(doc, runs).parse_args()


def bench_parser(doc: str, runs: int) -> argparse.ArgumentParser:
    """The flags every benchmark takes: --dsn, --runs, --procs, --json."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--dsn", help="server to use (default: an embedded one in a temporary directory)")
    parser.add_argument("--runs", type=int, default=runs)
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--json", help="also write the figures to this file")
    return parser


def run_all(one_run, count: int) -> tuple[list[dict[str, float]], dict[str, float]]:
    """`one_run(number)` `count` times, printing each run's figures; the runs and their medians."""
    runs = []
    for number in range(1, count + 1):
        runs.append(one_run(number))
        print(f"run {number}: " + ", ".join(f"{k}={v:.4g}" for k, v in runs[-1].items()), flush=True)
    return runs, {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def metrics_pair(dsn: str, procs: int, number: int) -> dict[str, float]:
    """One run without --metrics-port and one with it (and a scrape a second), in alternating order."""
    import socket
    import threading
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    stop = threading.Event()
    scrapes = []

    def scrape() -> None:
        while not stop.wait(1.0):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                    scrapes.append(len(response.read()))
            except OSError:
                pass  # the supervisor is starting or gone

    figures = {}
    for with_metrics in (False, True) if number % 2 else (True, False):
        args: tuple[str, ...] = ("--metrics-port", str(port), "--metrics-host", "127.0.0.1") if with_metrics else ()
        scraper = threading.Thread(target=scrape, daemon=True) if with_metrics else None
        if scraper:
            scraper.start()
        run = benchmark.one_run(dsn, procs, start_args=args, connect=lambda d: psycopg.connect(d, autocommit=True))
        if scraper:
            stop.set()
            scraper.join()
        figures[with_metrics] = run
    without, with_ = figures[False], figures[True]
    return {
        "noop_without_metrics": without["noop_jobs_per_s"],
        "noop_with_metrics": with_["noop_jobs_per_s"],
        "noop_ratio": with_["noop_jobs_per_s"] / without["noop_jobs_per_s"],
        "sleep_1ms_ratio": with_["sleep_1ms_jobs_per_s"] / without["sleep_1ms_jobs_per_s"],
        "pickup_p50_without_ms": without["pickup_p50_ms"],
        "pickup_p50_with_ms": with_["pickup_p50_ms"],
        # The supervisor's CPU per no-op job: less swayed than throughput by what else the machine runs.
        "cpu_per_job_ratio": (with_["supervisor_cpu_of_one_core"] / with_["noop_jobs_per_s"])
        / (without["supervisor_cpu_of_one_core"] / without["noop_jobs_per_s"]),
        "scrapes": float(len(scrapes)),
    }


def main() -> int:
    parser = bench_parser(__doc__, 3)
    parser.add_argument(
        "--only", default="basic,drain", help="comma-separated subset of basic,drain,metrics (default basic,drain)"
    )
    parser.add_argument(
        "--depths",
        default="20000,200000",
        help="backlog depths of the drain runs (default 20000,200000; the deep-drain table's are "
        "20000,200000,1000000); the first is the baseline of the ratios",
    )
    parser.add_argument("--drain-runs", type=int, help="runs of the drains (default: --runs)")
    args = parser.parse_args()
    only = set(args.only.split(","))
    depths = [int(d) for d in args.depths.split(",") if d.strip()]

    with scratch.database(args.dsn, "jobsup_bench_supervisor") as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(SQL["bench_pickup_table"])
        report: dict = {}
        if "basic" in only:
            runs, medians = run_all(lambda number: one_run(dsn, args.procs), args.runs)
            print(
                f"\njobsup start --procs {args.procs}, median of {args.runs} runs "
                f"({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}):"
            )
            for key, label, fmt, target in ROWS:
                print(f"  {label:<46} {fmt.format(medians[key]):>18}   {target}")
            report.update(runs=runs, median=medians)
        if "metrics" in only:
            runs, medians = run_all(lambda number: metrics_pair(dsn, args.procs, number), args.runs)
            print(
                f"\n--metrics-port against none, median of {args.runs} paired runs "
                f"({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}):"
            )
            print(
                f"  no-op jobs/s without {medians['noop_without_metrics']:,.0f}, "
                f"with {medians['noop_with_metrics']:,.0f}: "
                f"ratio {medians['noop_ratio']:.3f} (1 ms jobs: {medians['sleep_1ms_ratio']:.3f}); pickup p50 "
                f"{medians['pickup_p50_without_ms']:.2f} / {medians['pickup_p50_with_ms']:.2f} ms; "
                f"supervisor CPU per no-op job, with / without: {medians['cpu_per_job_ratio']:.3f}"
            )
            report.update(metrics_runs=runs, metrics=medians)
        if "drain" in only and depths:
            drain.prepare(dsn)
            drain_runs = []
            for number in range(args.drain_runs or args.runs):
                drain_runs.append(drain.one_run(dsn, depths, args.procs, number))
            rows = drain.summary(drain_runs, depths)
            drain.print_summary(rows, len(drain_runs))
            print(f"({os.cpu_count()} cores, load average now {' '.join(map(str, os.getloadavg()))})")
            report.update(drain_runs=drain_runs, drain=rows)
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
