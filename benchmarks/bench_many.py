"""Many supervisors against one: 4 supervisors of 2 processes beside 1 of 8, in the same run.

    .venv/bin/python -m benchmarks.bench_many [--dsn DSN] [--rounds 5] [--jobs 20000]

Each round runs both layouts one after the other (alternating which goes first) on 20,000 no-op jobs
enqueued in one transaction, jobs/s from its commit to the last done, and prints the medians and their
ratio. On a machine of two cores this shows that the claim does not contend between supervisors, not
that more hosts go faster.

Beside the rate it prints the CPU each job cost: jobsup's processes (the supervisors and their
workers) and, on a server on this machine, every PostgreSQL process. On a shared machine the rates of
one round swing with the other load, while the CPU per job barely moves; when the machine is busy, a
layout's rate follows its CPU per job.
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

import psutil
import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import scratch
from benchmarks.drain import ServerCPU
from jobsup.db.sql import STATEMENTS as SQL
from jobsup.ops import bench as benchmark

LAYOUTS = {"1x8": (1, 8), "4x2": (4, 2)}


def _cpu(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        try:
            total += sum(process.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


def layout_run(dsn: str, supervisors: int, procs: int, jobs: int) -> tuple[float, float, float | None]:
    """jobs/s, and the CPU µs per job of jobsup's processes and of the server (None: not on this machine)."""
    conn = psycopg.connect(dsn, autocommit=True)
    server = ServerCPU(conn)
    conn.execute(SQL["bench_clear"])
    conn.execute("DELETE FROM jobsup.supervisors")
    log = tempfile.TemporaryFile("w+")
    started = [
        subprocess.Popen(
            [sys.executable, "-m", "jobsup", "start", "--dsn", dsn, "--procs", str(procs), "--app", benchmark.APP],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        for _ in range(supervisors)
    ]
    try:

        def all_idle() -> bool:
            rows = conn.execute(SQL["bench_workers"]).fetchall()
            workers = [w for (ws,) in rows for w in ws]
            return (
                len(rows) == supervisors
                and len(workers) == supervisors * procs
                and all(w["state"] == "idle" for w in workers)
            )

        benchmark.wait(all_idle, 120, "the workers")
        ours = [psutil.Process(p.pid) for p in started]
        ours += [child for process in ours for child in process.children(recursive=True)]
        ours0, server0 = _cpu(ours), server.seconds()
        benchmark.enqueue_bulk(conn, "noop", jobs)
        begun = time.perf_counter()
        benchmark.wait(lambda: benchmark.done_of(conn, "noop") >= jobs, 300, f"{jobs} jobs")
        rate = jobs / (time.perf_counter() - begun)
        ours1, server1 = _cpu(ours), server.seconds()
        server_us = None if server0 is None or server1 is None else (server1 - server0) / jobs * 1e6
        return rate, (ours1 - ours0) / jobs * 1e6, server_us
    finally:
        for process in started:
            process.terminate()
        for process in started:
            process.wait(60)
        conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="server to use (default: an embedded one in a temporary directory)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=20_000)
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float, float | None]]] = {name: [] for name in LAYOUTS}
    with scratch.database(args.dsn, "jobsup_bench_many") as dsn:
        for number in range(args.rounds):
            order = list(LAYOUTS) if number % 2 == 0 else list(reversed(LAYOUTS))
            for name in order:
                results[name].append(layout_run(dsn, *LAYOUTS[name], args.jobs))
            print(
                f"round {number + 1} (load {os.getloadavg()[0]:.1f}): "
                + ", ".join(
                    f"{n} {results[n][-1][0]:,.0f} jobs/s, {_cpu_per_job(*results[n][-1][1:])}" for n in LAYOUTS
                ),
                flush=True,
            )

    def median(name: str, figure: int) -> float | None:
        values = [r[figure] for r in results[name] if r[figure] is not None]
        return statistics.median(values) if values else None

    print(
        f"\n{args.jobs:,} no-op jobs, median of {args.rounds} rounds ({os.cpu_count()} cores, "
        f"load {os.getloadavg()[0]:.1f}):"
    )
    for name in LAYOUTS:
        print(f"  {name:<4} {median(name, 0):>10,.0f} jobs/s   {_cpu_per_job(median(name, 1), median(name, 2))}")
    print(
        f"  4x2 / 1x8: {median('4x2', 0) / median('1x8', 0):.2f} (rate), "
        f"{_total(median('1x8', 1), median('1x8', 2)) / _total(median('4x2', 1), median('4x2', 2)):.2f} "
        f"(1x8's CPU per job / 4x2's)"
    )
    return 0


def _total(ours: float | None, server: float | None) -> float:
    return (ours or 0.0) + (server or 0.0)


def _cpu_per_job(ours: float | None, server: float | None) -> str:
    text = f"CPU/job {ours:.0f} µs jobsup"
    return text + (f" + {server:.0f} µs PostgreSQL" if server is not None else "")


if __name__ == "__main__":
    sys.exit(main())
