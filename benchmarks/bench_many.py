"""Many supervisors against one: 4 supervisors of 2 processes beside 1 of 8, in the same run.

    .venv/bin/python -m benchmarks.bench_many [--dsn DSN] [--rounds 3] [--jobs 20000]

Each round runs both layouts one after the other (alternating which goes first) on 20,000 no-op jobs
enqueued in one transaction, jobs/s from its commit to the last done, and prints the medians and their
ratio. On a machine of two cores this shows that the claim does not contend between supervisors, not
that more hosts go faster.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import scratch  # noqa: E402
from jobsup import benchmark  # noqa: E402
from jobsup.sql import STATEMENTS as SQL  # noqa: E402

LAYOUTS = {"1x8": (1, 8), "4x2": (4, 2)}


def layout_run(dsn: str, supervisors: int, procs: int, jobs: int) -> float:
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(SQL["bench_clear"])
    conn.execute("DELETE FROM jobsup.supervisors")
    log = tempfile.TemporaryFile("w+")
    started = [subprocess.Popen([sys.executable, "-m", "jobsup", "start", "--dsn", dsn, "--procs", str(procs),
                                 "--app", benchmark.APP], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
               for _ in range(supervisors)]
    try:
        def all_idle() -> bool:
            rows = conn.execute(SQL["bench_workers"]).fetchall()
            workers = [w for (ws,) in rows for w in ws]
            return len(rows) == supervisors and len(workers) == supervisors * procs and \
                all(w["state"] == "idle" for w in workers)

        benchmark.wait(all_idle, 120, "the workers")
        benchmark.enqueue_bulk(conn, "noop", jobs)
        begun = time.perf_counter()
        benchmark.wait(lambda: benchmark.done_of(conn, "noop") >= jobs, 300, f"{jobs} jobs")
        return jobs / (time.perf_counter() - begun)
    finally:
        for process in started:
            process.terminate()
        for process in started:
            process.wait(60)
        conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="server to use (default: an embedded one in a temporary directory)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=20_000)
    args = parser.parse_args()
    results: dict[str, list[float]] = {name: [] for name in LAYOUTS}
    with scratch.database(args.dsn, "jobsup_bench_many") as dsn:
        for number in range(args.rounds):
            order = list(LAYOUTS) if number % 2 == 0 else list(reversed(LAYOUTS))
            for name in order:
                results[name].append(layout_run(dsn, *LAYOUTS[name], args.jobs))
            print(f"round {number + 1}: " + ", ".join(f"{n} {results[n][-1]:,.0f} jobs/s" for n in LAYOUTS),
                  flush=True)
    medians = {name: statistics.median(values) for name, values in results.items()}
    print(f"\n{args.jobs:,} no-op jobs, median of {args.rounds} rounds ({os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.1f}):")
    for name, value in medians.items():
        print(f"  {name:<4} {value:>10,.0f} jobs/s")
    print(f"  4x2 / 1x8: {medians['4x2'] / medians['1x8']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
