"""What limits cost: one supervisor of --procs 8 on a real PostgreSQL, draining no-op jobs.

    .venv/bin/python -m benchmarks.bench_limits [--dsn DSN] [--runs 4] [--limit 64] [--kinds noop,sleep_1ms]
        [--only limited,backlog,claim] [--backlog 1000000] [--json PATH]

  - limited: 20,000 jobs of each of --kinds (the bench app's: noop does nothing, sleep_1ms sleeps 1 ms)
    without a limit, then with a concurrency limit of --limit (64), in alternating order, one pair per
    run; the ratio of each pair, and how long the jobs were held from claim to outcome (median), which
    times the jobs/s is how many the drain held at once: what a concurrency limit counts.
  - backlog: the same drain of no-op jobs without, then with --backlog jobs of another kind throttled at
    its limit of 2 (both slots held by jobs that never end), then without again (the backlog deleted):
    the drain rate with the backlog over the median of the runs around it.
  - claim: the claim of limited jobs alone, on one connection set up as a supervisor's (a custom plan
    per statement): 1, 10 and 100 jobs of a kind with 200,000 ready and room for all of them, 15 times
    each per run, before the supervisor starts; median milliseconds.

The cost of limits to kinds that have none, against the release before them, is
benchmarks/bench_beside.py run beside that release (docs/performance.md).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import scratch
from benchmarks.bench_supervisor import bench_parser
from jobsup import client
from jobsup.db import lifecycle
from jobsup.db.sql import STATEMENTS as SQL
from jobsup.ops import bench, limits

NOOP_JOBS = 20_000
CLAIM_KIND = "claim_bench"  # no handler in the bench app: the supervisor leaves its jobs alone
CLAIM_READY = 200_000
HOLDER = "bench-limits:holder"  # the locked_by of the jobs that hold the backlog kind's slots


def start_supervisor(dsn: str, procs: int) -> tuple[subprocess.Popen, psutil.Process]:
    log = tempfile.NamedTemporaryFile("w+", prefix="jobsup-bench-limits-", suffix=".log", delete=False)
    process = subprocess.Popen(
        [sys.executable, "-m", "jobsup", "start", "--dsn", dsn, "--procs", str(procs), "--app", bench.APP],
        env={**os.environ, "JOBSUP_BENCH_DSN": dsn},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    with psycopg.connect(dsn, autocommit=True) as conn:

        def all_idle() -> bool:
            row = conn.execute(SQL["bench_workers"]).fetchone()
            return row is not None and len(row[0]) == procs and all(w["state"] == "idle" for w in row[0])

        bench.wait(all_idle, 60, "the workers")
    return process, psutil.Process(process.pid)


def drain_rate(conn: psycopg.Connection, sup: psutil.Process, kind: str = "noop") -> float:
    rate, _, _ = bench.throughput(conn, kind, NOOP_JOBS, sup)
    return rate


def drain_and_hold(conn: psycopg.Connection, sup: psutil.Process, kind: str) -> tuple[float, float]:
    """Jobs/s of a drain of `kind`, and the median time its jobs were held, from claim to outcome write
    (seconds): what a concurrency limit counts. Their product is how many the drain held at once."""
    row = conn.execute("SELECT coalesce(max(id), 0) FROM jobsup.jobs").fetchone()
    assert row is not None
    rate = drain_rate(conn, sup, kind)
    held = conn.execute(
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM done_at - started_at))"
        " FROM jobsup.jobs WHERE kind = %s AND id > %s",
        [kind, row[0]],
    ).fetchone()
    assert held is not None
    return rate, float(held[0])


def limited_vs_unlimited(
    conn: psycopg.Connection, sup: psutil.Process, runs: int, limit: int, kind: str = "noop"
) -> dict[str, float]:
    ratios, unlimited, limited = [], [], []
    holds: dict[bool, list[float]] = {False: [], True: []}
    for number in range(runs):
        pair = {}
        for with_limit in (False, True) if number % 2 == 0 else (True, False):
            limits.set_limits(conn, kind, "bench", concurrency=limit if with_limit else None)
            time.sleep(0.5)  # the supervisor hears the NOTIFY
            pair[with_limit], held = drain_and_hold(conn, sup, kind)
            holds[with_limit].append(held)
        limits.set_limits(conn, kind, "bench", concurrency=None)
        unlimited.append(pair[False])
        limited.append(pair[True])
        ratios.append(pair[True] / pair[False])
        print(
            f"pair {number + 1}: {kind} unlimited {pair[False]:,.0f}/s (each held {holds[False][-1] * 1000:.1f} ms, "
            f"{pair[False] * holds[False][-1]:.0f} at once), limited to {limit} {pair[True]:,.0f}/s (held "
            f"{holds[True][-1] * 1000:.1f} ms, {pair[True] * holds[True][-1]:.0f} at once)",
            flush=True,
        )
    return {
        f"{kind}_unlimited_per_s": statistics.median(unlimited),
        f"{kind}_limited_{limit}_per_s": statistics.median(limited),
        f"{kind}_limited_{limit}_vs_unlimited": statistics.median(ratios),
        f"{kind}_unlimited_held_ms": statistics.median(holds[False]) * 1000,
        f"{kind}_limited_{limit}_held_ms": statistics.median(holds[True]) * 1000,
    }


def with_backlog(conn: psycopg.Connection, sup: psutil.Process, runs: int, backlog: int) -> dict[str, float]:
    before = [drain_rate(conn, sup) for _ in range(runs)]
    print("without a backlog: " + ", ".join(f"{r:,.0f}/s" for r in before), flush=True)
    limits.set_limits(conn, "sleep_1ms", "bench", concurrency=2)
    held = client.enqueue_many(conn, [{"kind": "sleep_1ms"}] * 2)
    conn.execute(
        "SELECT set_config('jobsup.claim_protocol', '8', false)"  # a claim's, as the schema asks
    )
    conn.execute(
        "UPDATE jobsup.jobs SET status = 'running', attempts = 1, locked_by = %s, started_at = now(),"
        " locked_until = now() + interval '1 day' WHERE id = ANY(%s)",
        [HOLDER, held],
    )
    started = time.perf_counter()
    for offset in range(0, backlog, 50_000):
        with conn.transaction():
            client.enqueue_many(conn, [{"kind": "sleep_1ms"}] * min(50_000, backlog - offset))
    conn.execute("VACUUM ANALYZE jobsup.jobs")
    print(f"{backlog:,} sleep_1ms jobs throttled at a limit of 2, in {time.perf_counter() - started:.0f} s", flush=True)
    during = [drain_rate(conn, sup) for _ in range(runs)]
    print("with the backlog: " + ", ".join(f"{r:,.0f}/s" for r in during), flush=True)
    throttled = conn.execute("SELECT count(*) FROM jobsup.jobs WHERE kind = 'sleep_1ms' AND status = 'queued'")
    assert throttled.fetchone()[0] == backlog  # nothing of it ran: the limit held
    conn.execute("DELETE FROM jobsup.jobs WHERE kind = 'sleep_1ms'")
    limits.set_limits(conn, "sleep_1ms", "bench", concurrency=None)
    conn.execute("VACUUM ANALYZE jobsup.jobs")
    after = [drain_rate(conn, sup) for _ in range(runs)]
    print("without it again: " + ", ".join(f"{r:,.0f}/s" for r in after), flush=True)
    baseline = statistics.median(before + after)
    return {
        "noop_without_backlog_per_s": baseline,
        "noop_with_backlog_per_s": statistics.median(during),
        "with_backlog_vs_without": statistics.median(during) / baseline,
    }


def claim_times(conn: psycopg.Connection, runs: int) -> dict[str, float]:
    """claim_limited of 1, 10 and 100 jobs of a kind with CLAIM_READY ready and room for all: median ms."""
    limits.set_limits(conn, CLAIM_KIND, "bench", concurrency=1_000_000)
    conn.execute("INSERT INTO jobsup.jobs (kind) SELECT %s FROM generate_series(1, %s)", [CLAIM_KIND, CLAIM_READY])
    conn.execute("VACUUM ANALYZE jobsup.jobs")
    times: dict[int, list[float]] = {1: [], 10: [], 100: []}
    with psycopg.connect(conn.info.dsn, autocommit=True, options="-c plan_cache_mode=force_custom_plan") as claimer:
        for _ in range(runs):
            for want, took in times.items():
                for _ in range(15):
                    started = time.perf_counter()
                    jobs, _ = lifecycle.claim_limited(claimer, [CLAIM_KIND], ["default"], want, "bench-limits", 30)
                    took.append(time.perf_counter() - started)
                    assert len(jobs) == want
    conn.execute("DELETE FROM jobsup.jobs WHERE kind = %s", [CLAIM_KIND])
    limits.set_limits(conn, CLAIM_KIND, "bench", concurrency=None)
    medians = {want: statistics.median(took) * 1000 for want, took in times.items()}
    print(
        f"claim of limited jobs, {CLAIM_READY:,} ready: "
        + ", ".join(f"{want} in {ms:.2f} ms" for want, ms in medians.items()),
        flush=True,
    )
    return {f"claim_{want}_ms": ms for want, ms in medians.items()}


def main() -> int:
    parser = bench_parser(__doc__, 4)
    parser.add_argument(
        "--backlog", type=int, default=1_000_000, help="jobs throttled by the limit (default 1,000,000)"
    )
    parser.add_argument("--only", default="limited,backlog", help="comma-separated subset of limited,backlog,claim")
    parser.add_argument("--limit", type=int, default=64, help="the concurrency limit of the limited runs (default 64)")
    parser.add_argument(
        "--kinds", default="noop,sleep_1ms", help="the kinds the limited runs drain (default noop,sleep_1ms)"
    )
    args = parser.parse_args()
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if not kinds or set(kinds) - {"noop", "sleep_1ms"}:
        print(f"bench_limits: --kinds takes noop and sleep_1ms, not {args.kinds!r}", file=sys.stderr)
        return 2
    figures: dict[str, float] = {}
    with scratch.empty(args.dsn, "jobsup-bench-limits-") as dsn, psycopg.connect(dsn, autocommit=True) as conn:
        if "claim" in args.only:  # before the supervisor starts: nothing else on the server
            figures.update(claim_times(conn, args.runs))
        if "limited" in args.only or "backlog" in args.only:
            process, sup = start_supervisor(dsn, args.procs)
            try:
                if "limited" in args.only:
                    for kind in kinds:
                        figures.update(limited_vs_unlimited(conn, sup, args.runs, args.limit, kind))
                if "backlog" in args.only:
                    figures.update(with_backlog(conn, sup, max(2, args.runs // 2), args.backlog))
            finally:
                process.terminate()
                process.wait(60)
    for name, value in figures.items():
        print(f"{name}: {value:,.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
