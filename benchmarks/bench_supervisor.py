"""The supervisor benchmark: `jobsup start --procs 8` on a real PostgreSQL, beside plain SQL.

    .venv/bin/python -m benchmarks.bench_supervisor [--dsn DSN] [--runs 3] [--procs 8] [--json PATH]

Each run measures, through one supervisor started with default flags (jobsup/benchmark.py, the code
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

from benchmarks import scratch  # noqa: E402
from jobsup import benchmark  # noqa: E402
from jobsup.sql import STATEMENTS as SQL  # noqa: E402

PLAIN_JOBS = 20_000
PLAIN_BATCH = 100


def _plain_worker(dsn: str, barrier, results) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        barrier.wait()
        handled = 0
        while True:
            ids = [r[0] for r in conn.execute(
                "UPDATE bench_plain SET status = 'running', attempts = attempts + 1 WHERE id IN ("
                " SELECT id FROM bench_plain WHERE status = 'queued' ORDER BY id LIMIT %s"
                " FOR UPDATE SKIP LOCKED) RETURNING id", (PLAIN_BATCH,), prepare=True).fetchall()]
            if not ids:
                break
            conn.execute("UPDATE bench_plain SET status = 'done' WHERE id = ANY(%s)", (ids,), prepare=True)
            handled += len(ids)
        results.put(handled)


def plain_sql(dsn: str, procs: int) -> float:
    """Claim-plus-complete in plain SQL, `procs` processes in batches of PLAIN_BATCH: jobs/s."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_plain")
        conn.execute("CREATE TABLE bench_plain (id bigserial PRIMARY KEY, kind text, payload jsonb,"
                     " status text, attempts int DEFAULT 0)")
        conn.execute("CREATE INDEX ON bench_plain (id) WHERE status = 'queued'")
        conn.execute("INSERT INTO bench_plain (kind, payload, status) "
                     "SELECT 'noop', '{}', 'queued' FROM generate_series(1, %s)", (PLAIN_JOBS,))
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
    """The supervisor's figures (jobsup.benchmark, as `jobsup bench` measures them), then plain SQL."""
    figures = benchmark.one_run(dsn, procs, connect=lambda d: psycopg.connect(d, autocommit=True))
    plain = plain_sql(dsn, procs)
    return {**figures, "plain_sql_claim_complete_b100_per_s": plain,
            "noop_vs_plain_sql": figures["noop_jobs_per_s"] / plain}


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
    ("plain_sql_claim_complete_b100_per_s", "plain SQL claim+complete, 8 procs, batch 100",
     "{:,.0f} jobs/s", ""),
    ("noop_vs_plain_sql", "no-op through jobsup / plain SQL", "{:.2f}", ""),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="server to use (default: an embedded one in a temporary directory)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()

    with scratch.database(args.dsn, "jobsup_bench_supervisor") as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(SQL["bench_pickup_table"])
        runs = []
        for number in range(1, args.runs + 1):
            runs.append(one_run(dsn, args.procs))
            print(f"run {number}: " + ", ".join(f"{k}={v:.4g}" for k, v in runs[-1].items()), flush=True)
    medians = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    print(f"\njobsup start --procs {args.procs}, median of {args.runs} runs "
          f"({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}):")
    for key, label, fmt, target in ROWS:
        print(f"  {label:<46} {fmt.format(medians[key]):>18}   {target}")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs, "median": medians}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
