"""Cancel of a running job: from `jobsup cancel` returning to the job's worker process gone.

    .venv/bin/python -m benchmarks.bench_cancel [--dsn DSN] [--cancels 20] [--json PATH]

One `jobsup start --procs 2 --app tests.apps.control:app` on a fresh database. Each round enqueues a job
that sleeps for an hour, waits until it runs (its handler records its pid), runs `jobsup cancel --id N`
as an operator would, and measures from the command's exit to the worker's pid gone (polled every
millisecond), and to the row written `cancelled`. The command's own start (a Python process) takes far
longer than the cancel, so the worker is usually gone before the command has exited: a second set of
rounds cancels through jobsup.ops.control.cancel in this process and measures from its commit. As a
baseline from the same run: the pickup of each round's job, from the enqueue's commit to its handler
starting (the same path: a NOTIFY heard by the supervisor, which acts on it). Figures are p50 and max.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil
import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.server import fresh_database
from jobsup import client
from jobsup.db.migrate import migrate
from jobsup.ops.control import cancel


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait(condition, timeout: float, interval: float = 0.001):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise SystemExit("timed out")


def run(dsn: str, cancels: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JOBSUP_RECORD_DSN": dsn}
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn)
        conn.execute(
            "CREATE TABLE calls (job_id bigint, attempt int, pid int, at timestamptz DEFAULT clock_timestamp())"
        )
        sup = subprocess.Popen(
            [sys.executable, "-m", "jobsup", "start", "--dsn", dsn, "--app", "tests.apps.control:app", "--procs", "2"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            kill_ms, written_ms, pickup_ms, api_ms = [], [], [], []
            # wait() calls its lambda before the loop moves on; each binds this round's job_id and pid
            # as a default all the same, so none reads a later round's.
            for _ in range(cancels + 1):  # the first round warms the supervisor up and is not counted
                job_id = client.enqueue(conn, "sleep", {"seconds": 3600})
                pid = wait(
                    lambda job_id=job_id: conn.execute("SELECT pid FROM calls WHERE job_id = %s", (job_id,)).fetchone(),
                    60,
                )[0]
                cancel(conn, ids=[job_id])
                committed = time.monotonic()
                wait(lambda pid=pid: gone(pid), 30)
                api_ms.append((time.monotonic() - committed) * 1000)
            for _ in range(cancels + 1):
                job_id = client.enqueue(conn, "sleep", {"seconds": 3600})
                enqueued = time.time()
                pid, at = wait(
                    lambda job_id=job_id: conn.execute(
                        "SELECT pid, at FROM calls WHERE job_id = %s", (job_id,)
                    ).fetchone(),
                    60,
                )
                result = subprocess.run(
                    [sys.executable, "-m", "jobsup", "cancel", "--id", str(job_id), "--dsn", dsn],
                    cwd=ROOT,
                    env=env,
                    capture_output=True,
                    text=True,
                )
                returned = time.monotonic()
                assert result.returncode == 0, result.stderr
                wait(lambda pid=pid: gone(pid), 30)
                killed = time.monotonic()
                wait(
                    lambda job_id=job_id: conn.execute(
                        "SELECT status = 'cancelled' FROM jobsup.jobs WHERE id = %s", (job_id,)
                    ).fetchone()[0],
                    30,
                )
                written = time.monotonic()
                kill_ms.append((killed - returned) * 1000)
                written_ms.append((written - returned) * 1000)
                pickup_ms.append((at.timestamp() - enqueued) * 1000)
            kill_ms, written_ms, pickup_ms, api_ms = kill_ms[1:], written_ms[1:], pickup_ms[1:], api_ms[1:]
        finally:
            sup.terminate()
            sup.wait(60)
    with open("/proc/loadavg") as handle:
        load = handle.read().split()[0]
    return {
        "cancels": cancels,
        "worker_gone_p50_ms": statistics.median(kill_ms),
        "worker_gone_max_ms": max(kill_ms),
        "cancelled_written_p50_ms": statistics.median(written_ms),
        "api_worker_gone_p50_ms": statistics.median(api_ms),
        "api_worker_gone_max_ms": max(api_ms),
        "pickup_p50_ms": statistics.median(pickup_ms),
        "loadavg": load,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", help="a PostgreSQL server to use (default: an embedded one of its own)")
    parser.add_argument("--cancels", type=int, default=20)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    with fresh_database(args.dsn, f"jobsup_bench_cancel_{os.getpid()}") as dsn:
        r = run(dsn, args.cancels)
    print(
        f"{r['cancels']} cancels of a running job: worker gone p50 {r['worker_gone_p50_ms']:.1f} ms "
        f"(max {r['worker_gone_max_ms']:.1f}) after `jobsup cancel` returned, row written cancelled p50 "
        f"{r['cancelled_written_p50_ms']:.1f} ms; through jobsup.ops.control.cancel, worker gone p50 "
        f"{r['api_worker_gone_p50_ms']:.1f} ms (max {r['api_worker_gone_max_ms']:.1f}) after its commit; "
        f"baseline pickup of a job p50 {r['pickup_p50_ms']:.1f} ms; load average {r['loadavg']}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2))


if __name__ == "__main__":
    main()
