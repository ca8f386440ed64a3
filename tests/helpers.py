"""Test helpers: a polling wait with a deadline (never a fixed sleep) and the CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent


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
