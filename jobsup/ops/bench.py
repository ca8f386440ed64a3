"""The supervisor's measurements, shared by `jobsup bench` and benchmarks/bench_supervisor.py so their
figures come from the same code: `jobsup start` in a subprocess on the bench app, then bulk enqueue,
no-op and 1 ms throughput, and pickup latency.

Every figure is this machine's view: jobs/s from the enqueue's commit to the last done, and pickup from
the enqueuer's commit returning to the handler starting (both clocks are this machine's).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil
import psycopg

from jobsup import client
from jobsup.db.sql import STATEMENTS as SQL
from jobsup.db.sql import one_row
from jobsup.errors import JobsupError

APP = "jobsup.ops.bench_app:app"
# Jobs that wait 100 ms and share their worker processes, run by a supervisor of their own.
WAIT_APP = "jobsup.ops.bench_app:wait_app"


@dataclass(frozen=True)
class Sizes:
    noop_jobs: int = 20_000
    sleep_jobs: int = 5_000
    pickup_jobs: int = 200
    pickup_gap: float = 0.020  # seconds between two pickup jobs: an idle system, not a burst
    pickup_warmup: int = 30  # unmeasured, so every connection has connected and every worker is warm
    wait_jobs: int = 5_000  # jobs that each await asyncio.sleep(0.1), sharing the processes


class BenchFailed(JobsupError):
    pass


def wait(condition: Callable[[], object], timeout: float, what: str, interval: float = 0.005) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise BenchFailed(f"bench: gave up waiting for {what}")
        time.sleep(interval)


def done_of(conn: psycopg.Connection, kind: str) -> int:
    return one_row(conn.execute(SQL["bench_done_of_kind"], {"kind": kind}).fetchone(), "bench_done_of_kind")[0]


def enqueue_bulk(conn: psycopg.Connection, kind: str, count: int) -> float:
    """Enqueue `count` jobs in one transaction; the seconds it took."""
    started = time.perf_counter()
    with conn.transaction():
        client.enqueue_many(conn, [{"kind": kind}] * count)
    return time.perf_counter() - started


def throughput(conn: psycopg.Connection, kind: str, count: int, sup: psutil.Process) -> tuple[float, float, float]:
    """Jobs/s for `count` jobs of `kind`, the supervisor's CPU seconds per second meanwhile, and the
    bulk enqueue's jobs/s."""
    before = done_of(conn, kind)
    cpu0 = sum(sup.cpu_times()[:2])
    enqueue_took = enqueue_bulk(conn, kind, count)
    started = time.perf_counter()
    wait(lambda: done_of(conn, kind) >= before + count, 300, f"{count} {kind} jobs")
    elapsed = time.perf_counter() - started
    return count / elapsed, (sum(sup.cpu_times()[:2]) - cpu0) / elapsed, count / enqueue_took


def pickup(dsn: str, sizes: Sizes, connect: Callable[[str], psycopg.Connection]) -> list[float]:
    """Milliseconds from each commit to its handler's start, sorted."""
    committed: dict[int, float] = {}
    with connect(dsn) as conn:
        conn.autocommit = False

        def count() -> int:
            return one_row(conn.execute(SQL["bench_pickup_count"]).fetchone(), "bench_pickup_count")[0]

        conn.execute(SQL["bench_pickup_clear"])  # the rows of an earlier run
        conn.commit()
        for _ in range(sizes.pickup_warmup):
            client.enqueue(conn, "pickup")
            conn.commit()
            time.sleep(sizes.pickup_gap)
        wait(lambda: count() == sizes.pickup_warmup, 60, "warm-up pickups")
        conn.execute(SQL["bench_pickup_clear"])
        conn.commit()
        for _ in range(sizes.pickup_jobs):
            job_id = client.enqueue(conn, "pickup")
            assert job_id is not None  # None only for a duplicate unique_key, and these jobs have none
            conn.commit()
            committed[job_id] = time.time()
            time.sleep(sizes.pickup_gap)
        wait(lambda: count() == sizes.pickup_jobs, 60, "pickups")
        started: dict[int, float] = dict(conn.execute(SQL["bench_pickup_times"]).fetchall())
        conn.commit()
    return sorted((started[i] - committed[i]) * 1000 for i in committed)


def percentile(values: list[float], p: float) -> float:
    """
    >>> percentile([1.0, 2.0, 3.0, 4.0], 50), percentile([1.0, 2.0, 3.0, 4.0], 99)
    (3.0, 4.0)
    """
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def one_run(
    dsn: str,
    procs: int,
    *,
    sizes: Sizes = Sizes(),
    start_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    connect: Callable[[str], psycopg.Connection],
    step: Callable[[str], None] = lambda _: None,
) -> dict[str, float]:
    """One supervisor with `procs` workers on `dsn` (migrated, with jobsup.bench_pickup): its figures.
    `step(name)` is called as each measurement begins, for a progress bar."""
    conn = connect(dsn)
    conn.execute(SQL["bench_clear"])
    env = {**os.environ, **(env or {}), "JOBSUP_BENCH_DSN": dsn}
    log = tempfile.NamedTemporaryFile("w+", prefix="jobsup-bench-", suffix=".log", delete=False)
    step("starting the supervisor")
    process = subprocess.Popen(
        [sys.executable, "-m", "jobsup", "start", "--dsn", dsn, "--procs", str(procs), "--app", APP, *start_args],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    failed = True
    try:
        sup = psutil.Process(process.pid)

        def all_idle() -> bool:
            if process.poll() is not None:
                raise BenchFailed(f"bench: the supervisor exited {process.returncode}: see {log.name}")
            row = conn.execute(SQL["bench_workers"]).fetchone()
            return row is not None and len(row[0]) == procs and all(w["state"] == "idle" for w in row[0])

        wait(all_idle, 60, "the workers")
        # Latency first, on an idle system: after the throughput runs, autovacuum of their dead rows
        # would compete with it.
        step("pickup latency")
        latencies = pickup(dsn, sizes, connect)
        step("no-op jobs")
        noop, cpu, enqueue_rate = throughput(conn, "noop", sizes.noop_jobs, sup)
        step("1 ms jobs")
        sleep, _, _ = throughput(conn, "sleep_1ms", sizes.sleep_jobs, sup)
        workers = one_row(conn.execute(SQL["bench_workers"]).fetchone(), "bench_workers")[0]  # all_idle saw the row
        rss = statistics.median(w["rss"] for w in workers) / 2**20
        process.terminate()
        process.wait(60)
        step("100 ms jobs that wait")  # the supervisor above removed its row as it stopped
        process = subprocess.Popen(
            [sys.executable, "-m", "jobsup", "start", "--dsn", dsn, "--procs", str(procs), "--app", WAIT_APP]
            + list(start_args),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait(all_idle, 60, "the workers of jobs that wait")
        waiting, _, _ = throughput(conn, "wait_100ms", sizes.wait_jobs, psutil.Process(process.pid))
        failed = False
    finally:
        process.terminate()
        process.wait(60)
        conn.close()
        log.close()
        if failed:
            print(f"bench: the supervisor's log is {log.name}", file=sys.stderr)
        else:
            os.unlink(log.name)
    return {
        "enqueue_jobs_per_s": enqueue_rate,
        "noop_jobs_per_s": noop,
        "sleep_1ms_jobs_per_s": sleep,
        "wait_100ms_jobs_per_s": waiting,
        "pickup_p50_ms": percentile(latencies, 50),
        "pickup_p95_ms": percentile(latencies, 95),
        "pickup_p99_ms": percentile(latencies, 99),
        "supervisor_cpu_of_one_core": cpu,
        "supervisor_cpu_of_machine": cpu / (os.cpu_count() or 1),
        "rss_per_worker_mb": rss,
    }
