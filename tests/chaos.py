"""The chaos run: three supervisors on one database while a stream of jobs comes in, and for the whole run
a random supervisor is SIGKILLed and restarted every few seconds, the supervisors' backends are
terminated, and once the PostgreSQL server itself is restarted. Then every job must be done, with a
handler run for each of its attempts (but those its dead supervisor had claimed and not yet started),
no two runs of one job overlapping unless the first one's supervisor was killed while it ran, and no
job lost.

    .venv/bin/python -m tests.chaos --seconds 120      # what `make chaos` runs

It runs on an embedded server of its own, in a temporary directory, since it restarts it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path

import psycopg

from jobsup import client
from jobsup.db import embedded
from jobsup.db.migrate import migrate

from .helpers import with_dbname
from .supervisor_helpers import Supervisor

SUPERVISORS = 3
PROCS = 2
# A lease short enough that a killed supervisor's jobs come back soon, long enough that a live one
# renews it through a server restart (renewed every third of it).
FLAGS = [
    "--lease",
    "6s",
    "--reap-interval",
    "500ms",
    "--heartbeat-interval",
    "500ms",
    "--poll-interval",
    "500ms",
    "--backoff-base",
    "20ms",
]
CHAOS_EVERY = (1.5, 3.5)  # seconds between two blows, at random
ENQUEUE_EVERY = 0.05
ENQUEUE_BATCH = 10
DRAIN_TIMEOUT = 120.0


@dataclass
class Counts:
    seconds: float = 0.0
    jobs: int = 0
    done: int = 0
    lost: int = 0  # enqueued, and not found at the end
    runs: int = 0
    attempts: int = 0
    jobs_runs_equal_attempts: int = 0
    attempts_claimed_by_killed_never_started: int = 0
    attempts_unexplained: int = 0  # an attempt with no run that no kill explains
    duplicate_runs_of_one_attempt: int = 0
    overlaps_after_kill: int = 0  # allowed: the first run's supervisor was killed while it ran
    overlaps_unexplained: int = 0
    supervisor_kills: int = 0
    backend_terminations: int = 0
    backends_terminated: int = 0
    server_restarts: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            self.jobs > 0
            and self.done == self.jobs
            and self.lost == 0
            and self.attempts_unexplained == 0
            and self.duplicate_runs_of_one_attempt == 0
            and self.overlaps_unexplained == 0
            and self.server_restarts >= 1
            and self.supervisor_kills >= 1
        )


class Chaos:
    def __init__(self, seconds: float, data_dir: Path, say=print) -> None:
        self.seconds = seconds
        self.data_dir = data_dir
        self.say = say
        server = embedded.ensure_running(data_dir)
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute("CREATE DATABASE chaos")
        self.dsn = with_dbname(server, "chaos")
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            migrate(conn)
            conn.execute(
                "CREATE TABLE chaos_runs (run uuid PRIMARY KEY, job_id bigint NOT NULL, attempt int NOT NULL,"
                " supervisor int NOT NULL, started timestamptz NOT NULL DEFAULT clock_timestamp(),"
                " finished timestamptz)"
            )
        self.supervisors: list[Supervisor] = []
        self.killed: set[int] = set()  # pids of supervisors SIGKILLed
        self.enqueued: list[int] = []
        self.stop_enqueue = threading.Event()
        self.counts = Counts()

    def start_supervisor(self) -> Supervisor:
        sup = Supervisor(
            self.dsn, *FLAGS, procs=PROCS, app="tests.apps.chaos:app", fast=False, env={"JOBSUP_CHAOS_DSN": self.dsn}
        )
        self.supervisors.append(sup)
        return sup

    def live(self) -> list[Supervisor]:
        return [s for s in self.supervisors if s.process.poll() is None and s.pid not in self.killed]

    # --- the stream of jobs ----------------------------------------------------------------------

    def enqueue_loop(self) -> None:
        """Batches of jobs, each with a unique key, so a batch whose commit went unanswered (the
        server restarting) is looked up rather than enqueued twice."""
        conn: psycopg.Connection | None = None
        number = 0
        while not self.stop_enqueue.is_set():
            keys = [f"chaos-{number + i}" for i in range(ENQUEUE_BATCH)]
            while True:
                try:
                    if conn is None or conn.closed:
                        conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=5)
                    known = dict(
                        conn.execute(
                            "SELECT unique_key, id FROM jobsup.jobs WHERE unique_key = ANY(%s)", (keys,)
                        ).fetchall()
                    )
                    missing = [k for k in keys if k not in known]
                    if missing:
                        client.enqueue_many(
                            conn, [{"kind": "chaos", "unique_key": k, "max_attempts": 1000} for k in missing]
                        )
                    ids = dict(
                        conn.execute(
                            "SELECT unique_key, id FROM jobsup.jobs WHERE unique_key = ANY(%s)", (keys,)
                        ).fetchall()
                    )
                    assert len(ids) == len(keys), "a batch half there"
                    self.enqueued += ids.values()
                    break
                except psycopg.OperationalError:
                    conn = None
                    time.sleep(0.05)
            number += ENQUEUE_BATCH
            self.stop_enqueue.wait(ENQUEUE_EVERY)
        if conn is not None:
            conn.close()

    # --- the blows ---------------------------------------------------------------------------------

    def kill_one(self) -> None:
        live = self.live()
        if not live:
            return
        victim = random.choice(live)
        self.killed.add(victim.pid)
        os.kill(victim.pid, signal.SIGKILL)  # the supervisor alone: its workers must die of it
        victim.process.wait(10)
        self.counts.supervisor_kills += 1
        self.start_supervisor()
        self.say(f"  {self.elapsed():5.1f}s  SIGKILL supervisor {victim.pid}, started another")

    def terminate_backends(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5) as conn:
                count = conn.execute(
                    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE application_name LIKE 'jobsup %%' AND random() < 0.6"
                ).fetchone()[0]
        except psycopg.OperationalError as exc:
            self.say(f"  {self.elapsed():5.1f}s  could not terminate backends: {exc}")
            return
        self.counts.backend_terminations += 1
        self.counts.backends_terminated += count
        self.say(f"  {self.elapsed():5.1f}s  pg_terminate_backend: {count} backends")

    def restart_server(self) -> None:
        embedded.restart(self.data_dir)
        self.counts.server_restarts += 1
        self.say(f"  {self.elapsed():5.1f}s  PostgreSQL restarted")

    def elapsed(self) -> float:
        return time.monotonic() - self.began

    # --- the run -------------------------------------------------------------------------------

    def run(self) -> Counts:
        for _ in range(SUPERVISORS):
            self.start_supervisor()
        for sup in self.supervisors:
            sup.wait_log("app.loaded", timeout=60)
        self.began = time.monotonic()
        enqueuer = threading.Thread(target=self.enqueue_loop, daemon=True)
        enqueuer.start()
        restart_at = self.seconds * random.uniform(0.35, 0.65)
        try:
            while self.elapsed() < self.seconds:
                time.sleep(random.uniform(*CHAOS_EVERY))
                if not self.counts.server_restarts and self.elapsed() >= restart_at:
                    self.restart_server()
                elif random.random() < 0.6:
                    self.kill_one()
                else:
                    self.terminate_backends()
            self.stop_enqueue.set()
            enqueuer.join(60)
            self.counts.seconds = round(self.elapsed(), 1)
            self.say(f"  {self.elapsed():5.1f}s  chaos over; waiting for every job to be done")
            self.drain()
        finally:
            self.stop_enqueue.set()
            for sup in self.live():
                sup.stop(timeout=60)
            for sup in self.supervisors:
                sup.close()
        self.check()
        return self.counts

    def drain(self) -> None:
        deadline = time.monotonic() + DRAIN_TIMEOUT
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while time.monotonic() < deadline:
                left = conn.execute("SELECT count(*) FROM jobsup.jobs WHERE status <> 'done'").fetchone()[0]
                if left == 0:
                    return
                time.sleep(0.2)
        self.counts.errors.append(f"jobs not done {DRAIN_TIMEOUT:g}s after the chaos ended")

    def check(self) -> None:
        c = self.counts
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            jobs = {
                row[0]: row[1:]
                for row in conn.execute("SELECT id, status, attempts, errors FROM jobsup.jobs WHERE kind = 'chaos'")
            }
            runs: dict[int, list[tuple]] = {}
            for job_id, attempt, supervisor, started, finished in conn.execute(
                "SELECT job_id, attempt, supervisor, started, finished FROM chaos_runs ORDER BY job_id, started"
            ):
                runs.setdefault(job_id, []).append((attempt, supervisor, started, finished))
        c.jobs = len(jobs)
        c.done = sum(1 for status, _, _ in jobs.values() if status == "done")
        c.lost = len(set(self.enqueued) - set(jobs))
        for job_id, (_, attempts, errors) in jobs.items():
            mine = runs.get(job_id, [])
            c.runs += len(mine)
            c.attempts += attempts
            if len(mine) == attempts:
                c.jobs_runs_equal_attempts += 1
            ran = [r[0] for r in mine]
            c.duplicate_runs_of_one_attempt += len(ran) - len(set(ran))
            expired = {e["attempt"]: e for e in errors or [] if str(e.get("error", "")).startswith("lease expired")}
            for attempt in set(range(1, attempts + 1)) - set(ran):
                entry = expired.get(attempt)
                if entry is not None and _supervisor_pid(entry["error"]) in self.killed:
                    c.attempts_claimed_by_killed_never_started += 1
                else:
                    c.attempts_unexplained += 1
                    c.errors.append(f"job {job_id}: attempt {attempt} has no run ({entry})")
            for first, second in pairwise(mine):
                if first[3] is not None and first[3] <= second[2]:
                    continue
                if first[3] is None and first[1] in self.killed:
                    c.overlaps_after_kill += 1
                else:
                    c.overlaps_unexplained += 1
                    c.errors.append(f"job {job_id}: runs {first} and {second} overlapped")


def _supervisor_pid(error: str) -> int | None:
    """The pid in 'lease expired: host:pid:tag stopped renewing it'."""
    try:
        return int(error.split(": ", 1)[1].split(" ", 1)[0].split(":")[-2])
    except (IndexError, ValueError):
        return None


def run(seconds: float, say=print) -> Counts:
    base = Path(tempfile.mkdtemp(prefix="jobsup-chaos-"))
    try:
        return Chaos(seconds, base / "pgdata", say).run()
    finally:
        embedded.stop(base / "pgdata")
        shutil.rmtree(base, ignore_errors=True)


def report(c: Counts) -> str:
    return "\n".join(
        [
            f"chaos: {c.seconds:g}s, {SUPERVISORS} supervisors x {PROCS} procs; {c.supervisor_kills} SIGKILLs, "
            f"{c.backend_terminations} rounds of pg_terminate_backend ({c.backends_terminated} backends), "
            f"{c.server_restarts} server restart(s)",
            f"  jobs {c.jobs}, done {c.done}, lost {c.lost}",
            f"  handler runs {c.runs}, attempts {c.attempts}; "
            f"jobs whose runs == attempts: {c.jobs_runs_equal_attempts}",
            f"  attempts with no run: {c.attempts_claimed_by_killed_never_started} claimed by a killed supervisor "
            f"before a worker started them, {c.attempts_unexplained} unexplained",
            f"  duplicate runs of one attempt: {c.duplicate_runs_of_one_attempt}",
            f"  overlapping runs of one job: {c.overlaps_after_kill} after their supervisor was killed, "
            f"{c.overlaps_unexplained} unexplained",
            *(f"  ! {e}" for e in c.errors[:20]),
            "  PASS" if c.ok else "  FAIL",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--json", action="store_true", help="print the counts as JSON too")
    args = parser.parse_args()
    counts = run(args.seconds)
    print(report(counts))
    if args.json:
        print(json.dumps(asdict(counts)))
    return 0 if counts.ok else 1


if __name__ == "__main__":
    sys.exit(main())
