"""Test helpers: a polling wait with a deadline (never a fixed sleep), the CLI in a subprocess, and the
test databases' names."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg import conninfo

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent

# The migrated database each test's own is cloned from (tests/conftest.py).
TEMPLATE = "jobsup_test_template"


def with_dbname(dsn: str, dbname: str) -> str:
    """The same server and credentials, another database."""
    return conninfo.make_conninfo(dsn, dbname=dbname)


def wait_for(
    condition: Callable[[], T], timeout: float = 15.0, interval: float = 0.01, message: str = "condition"
) -> T:
    """Poll `condition` until it returns something truthy; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message} (last: {value!r})")
        time.sleep(interval)


async def wait_for_async(
    condition: Callable[[], T],
    pause: Callable[[float], Any],
    timeout: float = 15.0,
    interval: float = 0.02,
    message: str = "condition",
) -> T:
    """wait_for for a test that runs in an event loop: `pause` (such as a Pilot's) yields to it."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message} (last: {value!r})")
        await pause(interval)


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("JOBSUP_DSN", "DATABASE_URL")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def jobsup(
    *args: str, input: str | None = None, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run `python -m jobsup ARGS` and capture what it printed."""
    return subprocess.run(
        [sys.executable, "-m", "jobsup", *args],
        input=input,
        capture_output=True,
        text=True,
        env=env or cli_env(),
        timeout=timeout,
        cwd=ROOT,
    )


def refused_all(dsn: str, cases: list[tuple[list[str], str | tuple[str, ...]]]) -> None:
    """Run every `jobsup ARGS --dsn DSN` case at once: each must exit 2 with one line on stderr that holds
    its expected text(s), no traceback, and nothing on stdout."""
    procs = [
        (
            args,
            says,
            subprocess.Popen(
                [sys.executable, "-m", "jobsup", *args, "--dsn", dsn],
                cwd=ROOT,
                env=cli_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ),
        )
        for args, says in cases
    ]
    for args, says, proc in procs:
        out, err = proc.communicate(timeout=180)  # many at once, on a loaded machine
        assert proc.returncode == 2, (args, out, err)
        assert "Traceback" not in err, (args, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1, (args, err)
        for text in (says,) if isinstance(says, str) else says:
            assert text in lines[0], (args, text, lines[0])
        assert out == "", (args, out)


def notifications_before_marker(listener: psycopg.Connection, sender: psycopg.Connection) -> list:
    """The 'jobsup' notifications that reach `listener` before a marker sent now from `sender`.

    PostgreSQL delivers notifications in commit order, so whatever was committed before the marker has
    arrived when the marker does, and nothing uncommitted can be among them: no fixed wait is needed.
    """
    sender.execute("SELECT pg_notify('jobsup', 'marker')")
    got = []
    for note in listener.notifies(timeout=15):
        if note.payload == "marker":
            return got
        got.append(note)
    raise AssertionError(f"the marker notification never arrived (got {got!r})")
