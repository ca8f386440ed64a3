"""The schedule benchmark: fire latency of a `1s` schedule with three supervisors on a real PostgreSQL.

    .venv/bin/python -m benchmarks.bench_cron [--dsn DSN] [--runs 3] [--fires 60] [--json PATH]

Each run starts three `jobsup start --procs 2 --app tests.apps.cron:app` (whose `tick` schedule fires
every second) on a fresh database and measures, for `--fires` fires after three unmeasured ones, the
time from the scheduled fire time to the handler starting (both clocks are this machine's). As a
baseline in the same run, one delayed job is enqueued for the middle of each second (run_at = x.5 s),
and the same time is measured for it: what the queue itself takes from a known run_at to a handler.
Figures are medians over the runs of each run's p50 and p99; the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import psycopg
from psycopg import conninfo

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jobsup import client
from jobsup.db import embedded
from jobsup.db.migrate import migrate

WARMUP = 3  # fires not measured: the supervisors are still starting
SUPERVISORS = 3


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def one_run(server_dsn: str, fires: int) -> dict[str, float]:
    name = f"jobsup_bench_cron_{os.getpid()}"
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {name}")
    dsn = conninfo.make_conninfo(server_dsn, dbname=name)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JOBSUP_RECORD_DSN": dsn, "CRON_APP_INTERVAL": "1s"}
    procs: list[subprocess.Popen] = []
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate(conn)
            conn.execute("CREATE TABLE cron_calls (job_id bigint, fire_at timestamptz, started timestamptz)")
            for _ in range(SUPERVISORS):
                procs.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "jobsup",
                            "start",
                            "--dsn",
                            dsn,
                            "--app",
                            "tests.apps.cron:app",
                            "--procs",
                            "2",
                        ],
                        cwd=ROOT,
                        env=env,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
            # The baseline: a delayed job for the middle of each second to come.
            (now,) = conn.execute("SELECT date_trunc('second', now())").fetchone()
            for n in range(1, fires + WARMUP + 30):
                at = now + timedelta(seconds=n + 0.5)
                client.enqueue(conn, "tick", {"fire_at": at.isoformat()}, run_at=at)
            deadline = time.monotonic() + fires + 120
            first = None
            measured: list[tuple] = []
            while time.monotonic() < deadline:
                rows = conn.execute(
                    "SELECT c.fire_at, extract(epoch FROM c.started - c.fire_at)::float8, j.payload ? 'schedule'"
                    " FROM cron_calls c JOIN jobsup.jobs j ON j.id = c.job_id ORDER BY c.fire_at"
                ).fetchall()
                scheduled = [r for r in rows if r[2]]
                if first is None and scheduled:
                    first = scheduled[0][0]
                measured = [r for r in scheduled if first is not None and r[0] >= first + timedelta(seconds=WARMUP)]
                if len(measured) >= fires:
                    break
                time.sleep(0.5)
            else:
                raise SystemExit(f"only {len(measured)} of {fires} fires ran within the deadline")
            measured = measured[:fires]
            window = (measured[0][0], measured[-1][0])
            baseline = [r for r in rows if not r[2] and window[0] <= r[0] <= window[1]]
            fire_ms = [r[1] * 1000 for r in measured]
            base_ms = [r[1] * 1000 for r in baseline]
            (count, distinct) = conn.execute(
                "SELECT count(*), count(DISTINCT payload->>'fire_at') FROM jobsup.jobs"
                " WHERE payload->>'schedule' = 'tick'"
            ).fetchone()
            return {
                "fire_p50_ms": percentile(fire_ms, 50),
                "fire_p99_ms": percentile(fire_ms, 99),
                "fire_max_ms": max(fire_ms),
                "delayed_p50_ms": percentile(base_ms, 50),
                "delayed_p99_ms": percentile(base_ms, 99),
                "fires": len(fire_ms),
                "duplicates": count - distinct,
            }
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", help="a PostgreSQL server to use (default: an embedded one of its own)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--fires", type=int, default=60)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    data_dir = None
    dsn = args.dsn
    if dsn is None:
        data_dir = Path(tempfile.mkdtemp(prefix="jobsup-bench-cron-")) / "pgdata"
        dsn = embedded.ensure_running(data_dir)
    try:
        runs = []
        for n in range(args.runs):
            result = one_run(dsn, args.fires)
            runs.append(result)
            print(
                f"run {n + 1}: fire p50 {result['fire_p50_ms']:.1f} ms, p99 {result['fire_p99_ms']:.1f} ms "
                f"(max {result['fire_max_ms']:.1f}); delayed job p50 {result['delayed_p50_ms']:.1f} ms, "
                f"p99 {result['delayed_p99_ms']:.1f} ms; {result['fires']} fires, "
                f"{result['duplicates']} enqueued twice",
                flush=True,
            )
        summary = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        summary["ratio_p50_fire_to_delayed"] = summary["fire_p50_ms"] / summary["delayed_p50_ms"]
        with open("/proc/loadavg") as handle:
            summary["loadavg"] = handle.read().split()[0]
        print(
            f"median of {args.runs} runs ({SUPERVISORS} supervisors, {args.fires} fires of a 1s schedule each): "
            f"fire latency p50 {summary['fire_p50_ms']:.1f} ms, p99 {summary['fire_p99_ms']:.1f} ms; "
            f"a delayed job's p50 {summary['delayed_p50_ms']:.1f} ms, p99 {summary['delayed_p99_ms']:.1f} ms "
            f"(fire/delayed p50 x{summary['ratio_p50_fire_to_delayed']:.2f}); load average {summary['loadavg']}"
        )
        if args.json:
            Path(args.json).write_text(json.dumps({"runs": runs, "median": summary}, indent=2))
    finally:
        if data_dir is not None:
            embedded.stop(data_dir)
            shutil.rmtree(data_dir.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
