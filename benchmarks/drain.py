"""Draining a deep backlog: `jobsup start` against plain SQL at the same depth, same run.

For each depth, three drains of the same number of no-op jobs, each from a table loaded in one INSERT,
VACUUM ANALYZEd and checkpointed:
  - jobsup: a supervisor started with default flags after the load;
  - twin: plain SQL claim + fenced complete, batches of 100, on a twin of jobsup.jobs (bench_queue's);
  - minimal: the same on the least a queue needs (bench_queue's minimal table).
The plain drains run in --procs processes, one connection each (a supervisor claims on one connection
and completes on another). Each figure is the steady rate from the first completion to the last, and
the PostgreSQL server's CPU (every postgres process: backends, autovacuum, writers) over the same
window, per job. Watching the drain costs the same at every depth: the supervisor's progress is read
from the per-kind totals (16 rows at most), the plain drains need no watching (their processes stop
when nothing is left), and jobsup's first and last completion come from done_at after the drain.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import psycopg

from .bench_queue import PLAIN_SCHEMA, _step_plain, _step_twin

ROOT = Path(__file__).resolve().parent.parent
DEPTHS = (20_000, 200_000, 1_000_000)
BATCH = 100
SIDES = ("jobsup", "twin", "minimal")
LOAD = {
    "jobsup": "INSERT INTO jobsup.jobs (kind) SELECT 'noop' FROM generate_series(1, %s)",
    "twin": "INSERT INTO bench_plain.twin (kind) SELECT 'noop' FROM generate_series(1, %s)",
    "minimal": "INSERT INTO bench_plain.jobs (kind, payload) SELECT 'noop', '{}' FROM generate_series(1, %s)",
}
RESET = "TRUNCATE jobsup.jobs, jobsup.kind_totals, jobsup.events, bench_plain.jobs, bench_plain.twin"


class ServerCPU:
    """CPU seconds of every process of a PostgreSQL server on this machine: the postmaster's own, its
    live children's, and those of children that already exited (the postmaster reaps them)."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.postmaster: psutil.Process | None
        try:
            backend = psutil.Process(conn.execute("SELECT pg_backend_pid()").fetchone()[0])
            self.postmaster = backend.parent()
        except (psutil.Error, TypeError):
            self.postmaster = None  # the server runs elsewhere: no figure

    def seconds(self) -> float | None:
        if self.postmaster is None:
            return None
        own = self.postmaster.cpu_times()
        total = own.user + own.system + own.children_user + own.children_system
        for child in self.postmaster.children():
            try:
                times = child.cpu_times()
                total += times.user + times.system
            except psutil.Error:
                pass  # exited between the listing and the reading: counted by the next reading's reaped
        return total


def prepare(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(PLAIN_SCHEMA.encode())


def load(conn: psycopg.Connection, side: str, depth: int) -> None:
    conn.execute(RESET)
    conn.execute(LOAD[side], (depth,))
    conn.execute("VACUUM ANALYZE jobsup.jobs, jobsup.kind_totals, bench_plain.jobs, bench_plain.twin")
    conn.execute("CHECKPOINT")


def drain_jobsup(conn: psycopg.Connection, dsn: str, depth: int, procs: int, cpu: ServerCPU) -> dict[str, Any]:
    env = {**os.environ, "JOBSUP_BENCH_DSN": dsn, "PYTHONPATH": str(ROOT)}
    log = tempfile.NamedTemporaryFile("w+", prefix="jobsup-drain-", suffix=".log", delete=False)
    done = "SELECT coalesce(sum(done), 0) FROM jobsup.kind_totals WHERE kind = 'noop'"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jobsup",
            "start",
            "--dsn",
            dsn,
            "--procs",
            str(procs),
            "--app",
            "jobsup.ops.bench_app:app",
        ],
        cwd=ROOT,
        env=env,
        stderr=log,
    )
    try:
        sup = psutil.Process(process.pid)
        _wait(lambda: conn.execute(done).fetchone()[0] > 0, 120, "the first completion", process, log.name)
        cpu0, sup0 = cpu.seconds(), sum(sup.cpu_times()[:2])
        _wait(lambda: conn.execute(done).fetchone()[0] >= depth, 3600, "the drain", process, log.name, 0.05)
        cpu1, sup1 = cpu.seconds(), sum(sup.cpu_times()[:2])
    finally:
        process.terminate()
        process.wait(60)
    first, last, count = conn.execute(
        "SELECT min(done_at), max(done_at), count(*) FROM jobsup.jobs WHERE status = 'done'"
    ).fetchone()
    assert count == depth, (count, depth)
    os.unlink(log.name)
    # The supervisor's own CPU (not its workers'): its one thread claims, hands out and writes every job.
    return {
        **_figures(depth, (last - first).total_seconds(), cpu0, cpu1),
        "supervisor_cpu_us_per_job": (sup1 - sup0) / depth * 1e6,
    }


def _wait(condition, timeout: float, what: str, process: subprocess.Popen, log: str, interval: float = 0.005) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"bench: gave up waiting for {what}; the supervisor's log is {log}")
        time.sleep(interval)


def _plain_worker(dsn: str, side: str, barrier: Any, results: Any) -> None:
    step = _step_twin if side == "twin" else _step_plain
    with psycopg.connect(dsn, autocommit=True) as conn:
        locked_by = f"bench-{os.getpid()}"
        barrier.wait()
        count, first, last = 0, None, None
        while got := step(conn, BATCH, locked_by):
            last = time.perf_counter()
            first = first or last
            count += got
        results.put((count, first, last))


def drain_plain(dsn: str, side: str, depth: int, procs: int, cpu: ServerCPU) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(procs + 1), ctx.Queue()
    workers = [ctx.Process(target=_plain_worker, args=(dsn, side, barrier, results)) for _ in range(procs)]
    for w in workers:
        w.start()
    barrier.wait(timeout=120)
    cpu0 = cpu.seconds()
    got = [results.get(timeout=3600) for _ in workers]
    cpu1 = cpu.seconds()
    for w in workers:
        w.join()
    count = sum(g[0] for g in got)
    assert count == depth, (side, count, depth)
    first = min(g[1] for g in got if g[1] is not None)
    last = max(g[2] for g in got if g[2] is not None)
    return _figures(depth, last - first, cpu0, cpu1)


def _figures(depth: int, seconds: float, cpu0: float | None, cpu1: float | None) -> dict[str, Any]:
    return {
        "jobs_per_s": depth / seconds,
        "pg_cpu_us_per_job": None if cpu0 is None or cpu1 is None else (cpu1 - cpu0) / depth * 1e6,
    }


def one_run(dsn: str, depths: list[int], procs: int, run: int) -> dict[str, dict[str, dict[str, Any]]]:
    """{depth: {side: figures}} for one run; the sides take turns going first from run to run."""
    figures: dict[str, dict[str, dict[str, Any]]] = {}
    order = SIDES[run % 3 :] + SIDES[: run % 3]
    with psycopg.connect(dsn, autocommit=True) as conn:
        cpu = ServerCPU(conn)
        for depth in depths:
            for side in order:
                load(conn, side, depth)
                if side == "jobsup":
                    result = drain_jobsup(conn, dsn, depth, procs, cpu)
                else:
                    result = drain_plain(dsn, side, depth, procs, cpu)
                result["load"] = os.getloadavg()[0]
                figures.setdefault(str(depth), {})[side] = result
                own = result.get("supervisor_cpu_us_per_job")
                print(
                    f"  drain {depth:>9,} {side:<8} {result['jobs_per_s']:>9,.0f} jobs/s  "
                    f"{_us(result['pg_cpu_us_per_job'])} PostgreSQL CPU/job"
                    + (f", {_us(own)} supervisor CPU/job" if own is not None else "")
                    + f"  load {result['load']:.1f}",
                    file=sys.stderr,
                    flush=True,
                )
    return figures


def _us(value: float | None) -> str:
    return "   n/a" if value is None else f"{value:>5.0f} µs"


def summary(runs: list[dict[str, dict[str, dict[str, Any]]]], depths: list[int]) -> dict[str, Any]:
    """Medians over the runs, and the ratios the drain is judged by, each the median of per-run ratios
    (both halves of a ratio ran under the same load)."""
    import statistics

    def med(values: list[float | None]) -> float | None:
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    out: dict[str, Any] = {}
    base = str(depths[0])
    for depth in map(str, depths):
        row: dict[str, Any] = {}
        for side in SIDES:
            row[f"{side}_jobs_per_s"] = med([r[depth][side]["jobs_per_s"] for r in runs])
            row[f"{side}_pg_cpu_us_per_job"] = med([r[depth][side]["pg_cpu_us_per_job"] for r in runs])
        row["supervisor_cpu_us_per_job"] = med([r[depth]["jobsup"]["supervisor_cpu_us_per_job"] for r in runs])
        row["vs_shallowest"] = med([r[depth]["jobsup"]["jobs_per_s"] / r[base]["jobsup"]["jobs_per_s"] for r in runs])
        row["vs_twin"] = med([r[depth]["jobsup"]["jobs_per_s"] / r[depth]["twin"]["jobs_per_s"] for r in runs])
        row["vs_minimal"] = med([r[depth]["jobsup"]["jobs_per_s"] / r[depth]["minimal"]["jobs_per_s"] for r in runs])
        out[depth] = row
    return out


def print_summary(rows: dict[str, Any], runs: int) -> None:
    print(
        f"\ndeep backlog drain, steady rate first → last completion, median of {runs} run(s); "
        "ratios are medians of per-run ratios"
    )
    print("(jobs/s, then PostgreSQL's CPU per job; 'sup' is the supervisor process's own CPU per job)")
    header = (
        f"{'backlog':>10} {'jobsup':>9} {'cpu':>7} {'sup':>7} {'twin':>9} {'cpu':>7} {'minimal':>9}"
        f" {'cpu':>7} {'vs first depth':>15} {'vs twin':>8} {'vs minimal':>11}"
    )
    print(header)
    print("-" * len(header))
    for depth, r in rows.items():
        print(
            f"{int(depth):>10,} {r['jobsup_jobs_per_s']:>9,.0f} {_us(r['jobsup_pg_cpu_us_per_job']):>7}"
            f" {_us(r['supervisor_cpu_us_per_job']):>7}"
            f" {r['twin_jobs_per_s']:>9,.0f} {_us(r['twin_pg_cpu_us_per_job']):>7}"
            f" {r['minimal_jobs_per_s']:>9,.0f} {_us(r['minimal_pg_cpu_us_per_job']):>7}"
            f" {r['vs_shallowest']:>15.2f} {r['vs_twin']:>8.2f} {r['vs_minimal']:>11.2f}"
        )
