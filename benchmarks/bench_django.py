"""The Django backend beside jobsup's own API, in one run: enqueue, and no-op throughput.

    .venv/bin/python -m benchmarks.bench_django [--dsn DSN] [--runs 5] [--procs 8]

Each run measures, alternating which goes first:
  - 2,000 enqueues one by one, a transaction each: `noop.enqueue()` through jobsup.django.JobsupBackend
    (Django's connection, autocommit) against `jobsup.enqueue(conn, "noop")` on a psycopg connection;
  - the same 2,000 inside one transaction (`atomic()` against `conn.transaction()`): the cost per call
    without the commit;
  - 20,000 no-op jobs through `jobsup start --procs 8`: the Django task `noop` (`--django`) against the
    plain handler `noop` of jobsup/ops/bench_app.py (`--app`), each from the enqueue's commit to the last
    done. Both are enqueued in one statement, the Django ones with the payload the backend writes.
Figures are medians over the runs; the machine is shared and noisy, so each ratio is within a run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jobsup import client
from jobsup.ops.bench import done_of, wait

from .bench_supervisor import bench_args, run_all
from .scratch import database as bench_database

ENQUEUES = 2_000
NOOP_JOBS = 20_000
SETTINGS = "benchmarks.bench_django_settings"
TASK_KIND = "benchmarks.bench_django_tasks.noop"
TASK_PAYLOAD = {"args": [], "kwargs": {}, "backend": "default"}


def enqueue_rates(conn: psycopg.Connection) -> dict[str, float]:
    from django.db import transaction

    from benchmarks.bench_django_tasks import noop

    def timed(run) -> float:
        started = time.perf_counter()
        run()
        return ENQUEUES / (time.perf_counter() - started)

    def backend_each() -> None:
        for _ in range(ENQUEUES):
            noop.enqueue()

    def jobsup_each() -> None:
        for _ in range(ENQUEUES):
            client.enqueue(conn, "noop")

    def backend_atomic() -> None:
        with transaction.atomic():
            backend_each()

    def jobsup_transaction() -> None:
        with conn.transaction():
            jobsup_each()

    return {
        "enqueue_backend_per_s": timed(backend_each),
        "enqueue_jobsup_per_s": timed(jobsup_each),
        "enqueue_atomic_backend_per_s": timed(backend_atomic),
        "enqueue_transaction_jobsup_per_s": timed(jobsup_transaction),
    }


def noop_rate(dsn: str, conn: psycopg.Connection, procs: int, django: bool) -> float:
    kind = TASK_KIND if django else "noop"
    mode = ["--django", SETTINGS] if django else ["--app", "jobsup.ops.bench_app:app"]
    env = {**os.environ, "JOBSUP_DSN": dsn, "PYTHONPATH": str(ROOT)}
    log = tempfile.NamedTemporaryFile("w+", prefix="jobsup-bench-django-", suffix=".log", delete=False)
    process = subprocess.Popen(
        [sys.executable, "-m", "jobsup", "start", "--dsn", dsn, "--procs", str(procs), *mode],
        cwd=ROOT,
        env=env,
        stderr=log,
    )
    try:

        def all_idle() -> bool:
            row = conn.execute("SELECT workers FROM jobsup.supervisors").fetchone()
            return bool(row) and len(row[0]) == procs and all(w["state"] == "idle" for w in row[0])

        wait(all_idle, 120, "the workers")
        before = done_of(conn, kind)
        with conn.transaction():
            client.enqueue_many(conn, [{"kind": kind, "payload": TASK_PAYLOAD if django else None}] * NOOP_JOBS)
        started = time.perf_counter()
        wait(lambda: done_of(conn, kind) >= before + NOOP_JOBS, 600, f"{NOOP_JOBS} {kind} jobs")
        return NOOP_JOBS / (time.perf_counter() - started)
    except BaseException:
        print(f"bench: the supervisor's log is {log.name}", file=sys.stderr)
        raise
    finally:
        process.terminate()
        process.wait(60)
        wait(
            lambda: conn.execute("SELECT count(*) FROM jobsup.supervisors").fetchone()[0] == 0,
            30,
            "the supervisor's row to go",
        )


def one_run(dsn: str, procs: int, number: int) -> dict[str, float]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE jobsup.jobs, jobsup.kind_totals, jobsup.events")
        figures = enqueue_rates(conn)
        conn.execute("TRUNCATE jobsup.jobs, jobsup.kind_totals")
        conn.execute("VACUUM ANALYZE jobsup.jobs")
        order = [True, False] if number % 2 else [False, True]  # which goes first alternates
        for django in order:
            figures["noop_django_per_s" if django else "noop_plain_per_s"] = noop_rate(dsn, conn, procs, django)
    figures["enqueue_ratio"] = figures["enqueue_backend_per_s"] / figures["enqueue_jobsup_per_s"]
    figures["enqueue_atomic_ratio"] = (
        figures["enqueue_atomic_backend_per_s"] / figures["enqueue_transaction_jobsup_per_s"]
    )
    figures["noop_ratio"] = figures["noop_django_per_s"] / figures["noop_plain_per_s"]
    return figures


ROWS = [
    ("enqueue, a transaction each", "enqueue_backend_per_s", "enqueue_jobsup_per_s", "enqueue_ratio"),
    (
        "enqueue, 2,000 in one transaction",
        "enqueue_atomic_backend_per_s",
        "enqueue_transaction_jobsup_per_s",
        "enqueue_atomic_ratio",
    ),
    ("20,000 no-op jobs, jobsup start --procs 8", "noop_django_per_s", "noop_plain_per_s", "noop_ratio"),
]


def main() -> int:
    args = bench_args(__doc__, 5)
    with bench_database(args.dsn, "jobsup_bench_django") as dsn:
        os.environ["JOBSUP_DSN"] = dsn
        os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
        import django

        django.setup()
        runs, medians = run_all(lambda number: one_run(dsn, args.procs, number), args.runs)
        print(
            f"\nDjango {django.get_version()}, median of {args.runs} runs "
            f"({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}):"
        )
        print(f"  {'':<44} {'Django backend':>15} {'jobsup':>10} {'ratio':>6}")
        for label, ours, theirs, ratio in ROWS:
            print(f"  {label:<44} {medians[ours]:>11,.0f} /s {medians[theirs]:>8,.0f} /s {medians[ratio]:>6.2f}")
        if args.json:
            Path(args.json).write_text(json.dumps({"runs": runs, "median": medians}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
