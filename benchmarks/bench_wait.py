"""Jobs that wait: handlers declared shared=True, many at once in each worker process.

    .venv/bin/python -m benchmarks.bench_wait [--dsn DSN] [--procs 2] [--jobs 50000] [--capacity 500]
        [--sync-jobs 10000] [--sync-capacity 50] [--noop-jobs 20000] [--crash-every 1000] [--json PATH]

In one run, on one database:
  - noop: the no-op rate of today's default, one job per process (`--procs`, the bench app), the
    ceiling any supervisor of these processes reaches;
  - async: --jobs jobs that each `await asyncio.sleep(0.1)`, at --procs with --capacity per process.
    Its rate over the steady-state window (from 20% to 80% of the jobs done) against the target,
    min(capacity x procs / 0.1 s, the no-op rate); the PSS (RSS where the kernel gives none) of the
    whole tree, supervisor, fork server and workers, at its most while ~capacity x procs jobs are in
    flight; the CPU seconds per job of that tree;
  - sync: --sync-jobs jobs that each `time.sleep(0.1)` in the workers' threads (--sync-capacity),
    against capacity x procs / 0.1 s;
  - crash: the async jobs again with one in --crash-every segfaulting, against the same stream without
    crashes: the share of its rate kept, and whether any innocent job ended dead;
  - mixed: --noop-jobs no-op jobs drained by an app that also has a shared kind (each class claimed in
    a statement of its own), against the no-op rate of the app of alone jobs alone.
"""

from __future__ import annotations

import argparse
import json
import os
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
from jobsup import client
from jobsup.ops import bench

WAIT_APP = "jobsup.ops.bench_app:wait_app"
MIXED_APP = "jobsup.ops.bench_app:mixed_app"
WAIT = 0.1  # seconds each job waits


def tree(process: psutil.Process) -> list[psutil.Process]:
    try:
        return [process, *process.children(recursive=True)]
    except psutil.Error:
        return [process]


def memory_mb(processes: list[psutil.Process]) -> float:
    total = 0
    for p in processes:
        try:
            info = p.memory_full_info()
            total += getattr(info, "pss", 0) or info.rss
        except psutil.Error:
            pass
    return total / 2**20


def cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for p in processes:
        try:
            times = p.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
        except psutil.Error:
            pass
    return total


def start(dsn: str, app: str, *args: str) -> tuple[subprocess.Popen, psutil.Process]:
    log = tempfile.NamedTemporaryFile("w+", prefix="jobsup-bench-wait-", suffix=".log", delete=False)
    process = subprocess.Popen(
        [sys.executable, "-m", "jobsup", "start", "--dsn", dsn, "--app", app, *args],
        env={**os.environ, "JOBSUP_BENCH_DSN": dsn},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        bench.wait(
            lambda: conn.execute("SELECT count(*) FROM jobsup.supervisors").fetchone()[0] > 0, 60, "the supervisor"
        )
    return process, psutil.Process(process.pid)


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    process.wait(60)


def counts(conn: psycopg.Connection, kind: str) -> tuple[int, int]:
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE status IN ('done', 'dead')), count(*) FILTER (WHERE status = 'running')"
        " FROM jobsup.jobs WHERE kind = %s",
        [kind],
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def drain(
    conn: psycopg.Connection, sup: psutil.Process, kind: str, jobs: int, payloads: list[dict] | None = None
) -> dict[str, float]:
    """Enqueue `jobs` of `kind` at once and time them: jobs/s over the steady-state window, the tree's
    most memory while it ran, and its CPU per job."""
    conn.execute("DELETE FROM jobsup.jobs WHERE kind = %s", [kind])
    with conn.transaction():
        client.enqueue_many(
            conn, [{"kind": kind, "payload": p} for p in payloads] if payloads else [{"kind": kind}] * jobs
        )
    processes = tree(sup)
    cpu0 = cpu_seconds(processes)
    samples: list[tuple[float, int]] = []
    most_memory, most_running = 0.0, 0
    started = time.perf_counter()
    while True:
        done, running = counts(conn, kind)
        now = time.perf_counter()
        samples.append((now, done))
        most_running = max(most_running, running)
        if running >= most_running * 0.9:  # the tree's memory while the most jobs are in flight
            most_memory = max(most_memory, memory_mb(tree(sup)))
        if done >= jobs:
            break
        if now - started > 600:
            raise SystemExit(f"bench_wait: {kind}: {done} of {jobs} done after 10 minutes")
        time.sleep(0.2)
    cpu = cpu_seconds(tree(sup)) - cpu0
    low = next(t for t, d in samples if d >= jobs * 0.2)
    low_done = next(d for t, d in samples if t >= low)
    high, high_done = next((t, d) for t, d in samples if d >= jobs * 0.8)
    rate = (high_done - low_done) / (high - low) if high > low else jobs / (samples[-1][0] - started)
    return {"per_s": rate, "memory_mb": most_memory, "in_flight": most_running, "cpu_ms_per_job": cpu / jobs * 1000}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", help="a server to make the scratch database on (default: an embedded one)")
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--capacity", type=int, default=500)
    parser.add_argument("--sync-jobs", type=int, default=10_000)
    parser.add_argument("--sync-capacity", type=int, default=50)
    parser.add_argument("--noop-jobs", type=int, default=20_000)
    parser.add_argument("--crash-every", type=int, default=1000, help="0: no crash run")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    figures: dict[str, float] = {}
    with scratch.database(args.dsn, "jobsup_bench_wait") as dsn, psycopg.connect(dsn, autocommit=True) as conn:
        process, sup = start(dsn, bench.APP, "--procs", str(args.procs))
        try:
            noop, _, _ = bench.throughput(conn, "noop", args.noop_jobs, sup)
        finally:
            stop(process)
        figures["noop_per_s"] = noop
        print(f"no-op, one job per process, --procs {args.procs}: {noop:,.0f} jobs/s", flush=True)

        process, sup = start(dsn, WAIT_APP, "--procs", str(args.procs), "--capacity", str(args.capacity))
        try:
            run = drain(conn, sup, "wait_100ms", args.jobs)
            target = min(args.capacity * args.procs / WAIT, noop)
            figures.update({f"async_{k}": v for k, v in run.items()})
            figures["async_of_target"] = run["per_s"] / target
            print(
                f"async, await sleep(0.1), --procs {args.procs} --capacity {args.capacity}: "
                f"{run['per_s']:,.0f} jobs/s (steady state) = {run['per_s'] / target:.2f} of the target "
                f"{target:,.0f}/s; tree {run['memory_mb']:.0f} MB with {run['in_flight']} in flight; "
                f"{run['cpu_ms_per_job']:.3f} ms CPU a job",
                flush=True,
            )
            if args.crash_every:
                payloads: list[dict] = [{} for _ in range(args.jobs)]
                for i in range(args.crash_every // 2, args.jobs, args.crash_every):
                    payloads[i] = {"crash": True}
                crashed = drain(conn, sup, "wait_100ms", args.jobs, payloads)
                innocent_dead = conn.execute(
                    "SELECT count(*) FROM jobsup.jobs WHERE kind = 'wait_100ms' AND status = 'dead'"
                    " AND NOT coalesce(payload ? 'crash', false)"
                ).fetchone()[0]
                figures["crash_per_s"] = crashed["per_s"]
                figures["crash_of_clean"] = crashed["per_s"] / run["per_s"]
                figures["crash_innocent_dead"] = innocent_dead
                print(
                    f"async with one in {args.crash_every} segfaulting: {crashed['per_s']:,.0f} jobs/s = "
                    f"{crashed['per_s'] / run['per_s']:.2f} of the same without crashes; "
                    f"innocent jobs dead: {innocent_dead}",
                    flush=True,
                )
        finally:
            stop(process)

        process, sup = start(dsn, WAIT_APP, "--procs", str(args.procs), "--capacity", str(args.sync_capacity))
        try:
            run = drain(conn, sup, "wait_100ms_sync", args.sync_jobs)
            target = args.sync_capacity * args.procs / WAIT
            figures.update({f"sync_{k}": v for k, v in run.items()})
            figures["sync_of_target"] = run["per_s"] / target
            print(
                f"sync, time.sleep(0.1) in threads, --capacity {args.sync_capacity}: {run['per_s']:,.0f} jobs/s = "
                f"{run['per_s'] / target:.2f} of the target {target:,.0f}/s; tree {run['memory_mb']:.0f} MB; "
                f"{run['cpu_ms_per_job']:.3f} ms CPU a job",
                flush=True,
            )
        finally:
            stop(process)

        process, sup = start(dsn, MIXED_APP, "--procs", str(args.procs))
        try:
            mixed, _, _ = bench.throughput(conn, "noop", args.noop_jobs, sup)
            figures["mixed_noop_per_s"] = mixed
            figures["mixed_of_noop"] = mixed / noop
            print(
                f"no-op, by an app that also has a shared kind: {mixed:,.0f} jobs/s = {mixed / noop:.2f} of the "
                "no-op rate",
                flush=True,
            )
        finally:
            stop(process)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
