"""The soak benchmark: a supervisor at full speed on no-op jobs for minutes, with retention.

    .venv/bin/python -m benchmarks.bench_soak [--dsn DSN] [--duration 10m] [--keep-done 60s]
        [--keep-dead 60s] [--procs 8] [--backlog 50000] [--hold-snapshot 3m:2m] [--json PATH]

One `jobsup start --procs 8 --app jobsup.ops.bench_app:app --keep-done 60s` on a database of its own,
an enqueuer that keeps --backlog jobs waiting (plain SQL INSERTs of 5,000 no-op jobs), and per minute:
  - jobs/s done (from the per-kind totals);
  - the claim's latency, p50 and p99: a probe connection runs the supervisor's own claim statement
    (100 jobs of the same queue, the same ready index and the same dead entries) every 200 ms in a
    transaction it rolls back, and times it;
  - live rows and dead tuples of jobsup.jobs (the statistics collector's, so a little behind) and how
    many autovacuums it has had;
  - the size of every jobsup table with its indexes, and their total;
  - CPU seconds per 1,000 jobs of the supervisor, its workers and the PostgreSQL server (autovacuum
    included): the work each job costs, which the machine's other load moves far less than jobs/s.
--hold-snapshot AT:FOR opens `BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1` at AT and holds it for
FOR: vacuum can remove no row deleted after it began, as with a forgotten `idle in transaction` session.

At the end it checks that the queue holds up over time: the last minute's throughput is at least 90% of the second
minute's, the total size at the end at most twice the size at minute 2, and with a held snapshot, the
minute starting one minute after it ended within 10% of the minute before it began. Exit 1 if not.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil
import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.server import fresh_database
from jobsup.db import lifecycle
from jobsup.db.migrate import migrate
from jobsup.durations import parse_duration

DATABASE = "jobsup_bench_soak"
ENQUEUE_CHUNK = 5000
PROBE_EVERY = 0.2
PROBE_LIMIT = 100  # the supervisor's default --batch
ENQUEUE = "INSERT INTO jobsup.jobs (kind) SELECT 'noop' FROM generate_series(1, %(n)s)"
DONE = "SELECT coalesce(sum(done), 0)::bigint FROM jobsup.kind_totals"
TABLE_STATS = """
SELECT n_live_tup, n_dead_tup, autovacuum_count + vacuum_count
FROM pg_stat_user_tables WHERE schemaname = 'jobsup' AND relname = 'jobs'
"""
SIZES = """
SELECT c.relname, pg_total_relation_size(c.oid)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'jobsup' AND c.relkind = 'r' ORDER BY c.relname
"""
# What migration 0002 sets per table, for --table-defaults.
_VACUUM = [
    "autovacuum_vacuum_scale_factor",
    "autovacuum_vacuum_threshold",
    "autovacuum_vacuum_cost_delay",
    "fillfactor",
]
TABLE_OPTIONS = {
    "jobs": [
        *_VACUUM,
        "autovacuum_vacuum_insert_scale_factor",
        "autovacuum_vacuum_insert_threshold",
        "autovacuum_analyze_scale_factor",
    ],
    "kind_totals": _VACUUM,
    "supervisors": _VACUUM,
}


@dataclass
class Minute:
    minute: int
    jobs_per_s: float
    claim_p50_ms: float
    claim_p99_ms: float
    probes: int
    live_rows: int
    dead_tuples: int
    vacuums: int
    sizes: dict[str, int]
    total_bytes: int
    held: bool
    load: float
    cpu_ms_per_job: float


@dataclass
class Shared:
    stop: threading.Event = field(default_factory=threading.Event)
    claim_ms: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    enqueued: int = 0
    held: bool = False
    errors: list[str] = field(default_factory=list)


def enqueuer(dsn: str, backlog: int, shared: Shared) -> None:
    """Keeps about `backlog` jobs waiting: enqueued minus done, both known without counting the table."""
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not shared.stop.is_set():
                done = conn.execute(DONE).fetchone()[0]
                if shared.enqueued - done < backlog:
                    conn.execute(ENQUEUE, {"n": ENQUEUE_CHUNK})
                    shared.enqueued += ENQUEUE_CHUNK
                else:
                    time.sleep(0.01)
    except Exception as exc:  # a benchmark thread that dies must say so
        shared.errors.append(f"enqueuer: {exc}")


def prober(dsn: str, shared: Shared) -> None:
    try:
        with psycopg.connect(dsn, options="-c plan_cache_mode=force_custom_plan") as conn:
            while not shared.stop.is_set():
                started = time.perf_counter()
                # From the head of the index, with no claim keys: a claim's worst case.
                lifecycle.claim(conn, ["default"], PROBE_LIMIT, "soak-probe", 30.0)
                elapsed = (time.perf_counter() - started) * 1000
                conn.rollback()  # the jobs go back untouched
                with shared.lock:
                    shared.claim_ms.append(elapsed)
                shared.stop.wait(PROBE_EVERY)
    except Exception as exc:
        shared.errors.append(f"prober: {exc}")


def holder(dsn: str, at: float, hold: float, shared: Shared) -> None:
    if shared.stop.wait(at):
        return
    with psycopg.connect(dsn, application_name="bench_soak snapshot holder") as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT 1")
        shared.held = True
        print(f"  -- snapshot held from {at:g} s for {hold:g} s (pid {conn.info.backend_pid})", flush=True)
        shared.stop.wait(hold)
        conn.rollback()
        shared.held = False
        print("  -- snapshot released", flush=True)


def tree_cpu(roots: list[psutil.Process]) -> float:
    """CPU seconds of these processes and all their descendants (those still alive, and the ones they
    have waited for)."""
    total = 0.0
    for root in roots:
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for proc in procs:
            try:
                t = proc.cpu_times()
                total += t.user + t.system + (t.children_user + t.children_system if proc is root else 0)
            except psutil.Error:
                pass
    return total


def server_process(conn: psycopg.Connection) -> psutil.Process | None:
    """The postmaster, when the server runs on this machine (the embedded one does)."""
    try:
        return psutil.Process(conn.info.backend_pid).parent()
    except psutil.Error:
        return None


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


HEADER = (
    f"{'min':>3} {'jobs/s':>8} {'claim p50':>9} {'p99 ms':>7} {'live rows':>10} {'dead tup':>9} "
    f"{'vac':>4} {'jobs MB':>8} {'others kB':>9} {'total MB':>8} {'cpu ms/job':>10} {'load':>5}"
)


def line(m: Minute) -> str:
    others = (m.total_bytes - m.sizes.get("jobs", 0)) / 1024
    return (
        f"{m.minute:>3} {m.jobs_per_s:>8,.0f} {m.claim_p50_ms:>9.2f} {m.claim_p99_ms:>7.2f} "
        f"{m.live_rows:>10,} {m.dead_tuples:>9,} {m.vacuums:>4} {m.sizes.get('jobs', 0) / 2**20:>8.1f} "
        f"{others:>9.0f} {m.total_bytes / 2**20:>8.1f} {m.cpu_ms_per_job:>10.3f} {m.load:>5.1f}"
        + ("  held" if m.held else "")
    )


def soak(dsn: str, args: argparse.Namespace) -> list[Minute]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = tempfile.NamedTemporaryFile("w+", prefix="jobsup-soak-", suffix=".log", delete=False)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jobsup",
            "start",
            "--dsn",
            dsn,
            "--procs",
            str(args.procs),
            "--app",
            "jobsup.ops.bench_app:app",
            "--keep-done",
            str(args.keep_done),
            "--keep-dead",
            str(args.keep_dead),
            *(["--prune-interval", str(args.prune_interval)] if args.prune_interval else []),
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    shared = Shared()
    threads = [
        threading.Thread(target=enqueuer, args=(dsn, args.backlog, shared), daemon=True),
        threading.Thread(target=prober, args=(dsn, shared), daemon=True),
    ]
    if args.hold_snapshot:
        at, hold = args.hold_snapshot
        threads.append(threading.Thread(target=holder, args=(dsn, at, hold, shared), daemon=True))
    minutes: list[Minute] = []
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for thread in threads:
                thread.start()
            print(HEADER, flush=True)
            roots = [p for p in (psutil.Process(process.pid), server_process(conn)) if p is not None]
            started = time.monotonic()
            last_done, last_at = conn.execute(DONE).fetchone()[0], started
            last_cpu = tree_cpu(roots)
            for number in range(1, int(args.duration // args.minute) + 1):
                held = False
                while (now := time.monotonic()) < started + number * args.minute:
                    held |= shared.held
                    if process.poll() is not None or shared.errors:
                        raise SystemExit(
                            f"bench: stopped early: {shared.errors or 'the supervisor exited'} (its log: {log.name})"
                        )
                    time.sleep(min(0.5, started + number * args.minute - now))
                done = conn.execute(DONE).fetchone()[0]
                with shared.lock:
                    probes, shared.claim_ms = shared.claim_ms, []
                cpu = tree_cpu(roots)
                live, dead, vacuums = conn.execute(TABLE_STATS).fetchone()
                sizes = dict(conn.execute(SIZES).fetchall())
                minutes.append(
                    Minute(
                        number,
                        (done - last_done) / (now - last_at),
                        percentile(probes, 50),
                        percentile(probes, 99),
                        len(probes),
                        live,
                        dead,
                        vacuums,
                        sizes,
                        sum(sizes.values()),
                        held,
                        os.getloadavg()[0],
                        (cpu - last_cpu) / max(1, done - last_done) * 1000,
                    )
                )
                last_done, last_at, last_cpu = done, now, cpu
                print(line(minutes[-1]), flush=True)
    finally:
        shared.stop.set()
        process.terminate()
        process.wait(60)
        for thread in threads:
            thread.join(10)
    log.close()
    os.unlink(log.name)
    return minutes


def verdicts(minutes: list[Minute], hold: tuple[float, float] | None, minute: float) -> list[tuple[str, bool]]:
    found = []
    if len(minutes) >= 3:
        second, last = minutes[1], minutes[-1]
        ratio = last.jobs_per_s / second.jobs_per_s
        found.append((f"last minute's throughput / second minute's: {ratio:.2f} (>= 0.90)", ratio >= 0.9))
        growth = last.total_bytes / second.total_bytes
        found.append((f"total size at the end / at minute 2: {growth:.2f} (<= 2)", growth <= 2))
    if hold:
        at, held = hold
        before = int(at // minute)  # the minute that ended as the snapshot was taken
        after = int((at + held) // minute) + 2  # the minute that starts one minute after it ended
        if 1 <= before and after <= len(minutes):
            ratio = minutes[after - 1].jobs_per_s / minutes[before - 1].jobs_per_s
            found.append(
                (f"held snapshot: minute {after} / minute {before} throughput: {ratio:.2f} (>= 0.90)", ratio >= 0.9)
            )
    return found


def hold_spec(text: str) -> tuple[float, float]:
    at, _, hold = text.partition(":")
    return parse_duration(at), parse_duration(hold or "2m")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="server to use (default: an embedded one in a temporary directory)")
    parser.add_argument("--duration", type=parse_duration, default=600.0, help="default 10m")
    parser.add_argument("--minute", type=parse_duration, default=60.0, help="reporting period (default 60s)")
    parser.add_argument("--keep-done", default="60s", help="passed to jobsup start; 0 keeps forever")
    parser.add_argument("--keep-dead", default="60s")
    parser.add_argument("--prune-interval", help="passed to jobsup start (default: its own)")
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--backlog", type=int, default=50_000, help="jobs kept waiting (default 50000)")
    parser.add_argument(
        "--hold-snapshot",
        type=hold_spec,
        metavar="AT:FOR",
        help="hold a REPEATABLE READ snapshot from AT for FOR, e.g. 3m:2m",
    )
    parser.add_argument(
        "--table-defaults",
        action="store_true",
        help="reset the tables' autovacuum and fillfactor settings of migration 0002",
    )
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()

    with fresh_database(args.dsn, DATABASE) as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate(conn)
            if args.table_defaults:  # to measure what migration 0002's settings buy
                for table, options in TABLE_OPTIONS.items():
                    conn.execute(f"ALTER TABLE jobsup.{table} RESET ({', '.join(options)})")
            version = conn.execute("SHOW server_version").fetchone()[0]
        print(
            f"soak: {args.duration / 60:g} min, --procs {args.procs}, --keep-done {args.keep_done}, "
            f"--keep-dead {args.keep_dead}, backlog {args.backlog:,}, PostgreSQL {version}, "
            f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"
            + (f", snapshot held {args.hold_snapshot[0]:g}s+{args.hold_snapshot[1]:g}s" if args.hold_snapshot else "")
            + (", table settings reset" if args.table_defaults else ""),
            flush=True,
        )
        minutes = soak(dsn, args)
    results = verdicts(minutes, args.hold_snapshot, args.minute)
    for text, ok in results:
        print(f"{'ok  ' if ok else 'MISS'} {text}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "args": {k: v for k, v in vars(args).items() if k != "json"},
                    "minutes": [asdict(m) for m in minutes],
                    "verdicts": results,
                },
                indent=2,
            )
        )
    return 0 if all(ok for _, ok in results) else 1


if __name__ == "__main__":
    sys.exit(main())
