"""Running a real `jobsup start` in a subprocess, for the tests of the supervisor."""

from __future__ import annotations

import os
import signal as signals
import subprocess
import sys
import tempfile
from collections.abc import Sequence

import psutil
import psycopg

from .helpers import ROOT, cli_env, wait_for

# Short intervals, so time-based behaviour shows within a test's patience.
FAST = [
    "--heartbeat-interval",
    "200ms",
    "--reap-interval",
    "100ms",
    "--poll-interval",
    "500ms",
    "--backoff-base",
    "20ms",
    "--backoff-jitter",
    "0",
]


def _as_from_a_terminal() -> None:
    signals.signal(signals.SIGINT, signals.SIG_DFL)


class Supervisor:
    def __init__(
        self,
        dsn: str,
        *args: str,
        procs: int = 2,
        app: str | None = "examples.misbehave:app",
        fast: bool = True,
        env: dict[str, str] | None = None,
    ) -> None:
        self.logfile = tempfile.NamedTemporaryFile("w+", prefix="jobsup-sup-", suffix=".log", delete=False)
        argv = [
            sys.executable,
            "-m",
            "jobsup",
            "start",
            "--dsn",
            dsn,
            *(["--app", app] if app else []),
            "--procs",
            str(procs),
            *(FAST if fast else []),
            *args,
        ]
        # A session of its own: signals reach it only when a test sends them, as from a terminal. And
        # Ctrl-C not ignored, as in a terminal: a suite run in the background by a shell without job
        # control (`make test &` in a script) inherits SIGINT ignored, and so would every supervisor.
        self.process = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=cli_env(JOBSUP_RECORD_DSN=dsn, **(env or {})),
            stdout=self.logfile,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_as_from_a_terminal,
        )
        self.pid = self.process.pid

    def log(self) -> str:
        with open(self.logfile.name) as handle:
            return handle.read()

    def wait_log(self, text: str, timeout: float = 20) -> str:
        return wait_for(lambda: text in self.log() and self.log(), timeout, message=f"log line {text!r}\n")

    def wait_ready(self, procs: int | None = None) -> None:
        self.wait_log("supervisor.started")
        self.wait_log("app.loaded")

    def workers(self) -> list[psutil.Process]:
        """The live worker processes: children of the fork server, which is the supervisor's child."""
        workers = []
        try:
            for child in psutil.Process(self.pid).children():
                workers += [w for w in child.children() if w.status() != psutil.STATUS_ZOMBIE]
        except psutil.Error:
            pass
        return workers

    def signal(self, sig: int, group: bool = False) -> None:
        if group:
            os.killpg(self.pid, sig)  # as Ctrl-C in a terminal: every process of the group
        else:
            os.kill(self.pid, sig)

    def stop(self, sig: int = signals.SIGTERM, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"supervisor did not stop within {timeout}s:\n{self.log()}") from None

    def kill(self) -> None:
        try:
            os.killpg(self.pid, signals.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(10)

    def close(self) -> None:
        if self.process.poll() is None:
            self.kill()
        self.logfile.close()
        os.unlink(self.logfile.name)


def make_calls_table(conn: psycopg.Connection) -> None:
    conn.execute(
        "CREATE TABLE IF NOT EXISTS calls"
        " (job_id bigint, attempt int, pid int, at timestamptz DEFAULT clock_timestamp())"
    )


def status_counts(conn: psycopg.Connection) -> dict[str, int]:
    return dict(conn.execute("SELECT status, count(*) FROM jobsup.jobs GROUP BY status").fetchall())


def enqueue_kinds(conn: psycopg.Connection, kinds: Sequence[str], **opts) -> list[int]:
    from jobsup import client

    return client.enqueue_many(conn, [dict(kind=k, **opts) for k in kinds])


def went_on_past(conn: psycopg.Connection, sup: Supervisor, seconds: float = 0.5) -> None:
    """Wait until `sup` records a heartbeat `seconds` (by the database's clock) after now: its loop ran
    that long past this moment. A test that asserts something did not happen waits for this rather than
    a fixed sleep, so that a supervisor that stalled cannot pass it: it had its chance to do the thing."""
    (moment,) = conn.execute("SELECT clock_timestamp()").fetchone()
    wait_for(
        lambda: (
            conn.execute(
                "SELECT heartbeat_at > %s + make_interval(secs => %s) FROM jobsup.supervisors WHERE pid = %s",
                (moment, seconds, sup.pid),
            ).fetchone()
            == (True,)
        ),
        timeout=seconds + 15,
        interval=0.05,
        message=f"a heartbeat {seconds}s after {moment:%H:%M:%S.%f}",
    )


def alive(process: psutil.Process) -> bool:
    """Running and not a zombie; a process that ends while we look is not alive."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
