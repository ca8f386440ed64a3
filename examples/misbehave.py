"""Handlers that misbehave on purpose: each costs one attempt of its job and never the pool.

    jobsup start --procs 4 --app examples.misbehave:app --timeout 5s --max-memory 300
    jobsup enqueue segfault

The tests use them, and the `record` and `sleep` kinds to count what ran.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

import psycopg

from jobsup import App, Job

app = App()


@app.handler("ok")
def ok(job: Job) -> None:
    pass


@app.handler("raise")
def raise_(job: Job) -> None:
    raise RuntimeError(f"raised on attempt {job.attempts}")


@app.handler("exit")
def exit_(job: Job) -> None:
    os._exit(3)  # no cleanup, no exception: the process is just gone


@app.handler("segfault")
def segfault(job: Job) -> None:
    ctypes.string_at(0)  # reads address 0: SIGSEGV


@app.handler("sigkill")
def sigkill(job: Job) -> None:
    os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does


@app.handler("hang", timeout=1)
def hang(job: Job) -> None:
    while True:  # a busy loop ignores everything but a signal
        pass


@app.handler("hog")
def hog(job: Job) -> None:
    """Allocate until killed. Stops growing at `cap_mb` (default 2048) so a run without --max-memory
    cannot take the machine down; then it hangs until its timeout."""
    cap = int((job.payload or {}).get("cap_mb", 2048))
    chunks = []
    while len(chunks) < cap // 16:
        chunks.append(bytearray(16 * 2**20))  # touched, so it is resident
        time.sleep(0.01)
    while True:
        time.sleep(1)


@app.handler("sysexit")
def sysexit(job: Job) -> None:
    sys.exit(3)


@app.handler("interrupt")
def interrupt(job: Job) -> None:
    raise KeyboardInterrupt


@app.handler("needs_field")
def needs_field(job: Job) -> None:
    """A payload the handler cannot use fails this attempt with the handler's own error."""
    int(job.payload["count"])


@app.handler("flaky")
def flaky(job: Job) -> None:
    if job.attempts == 1:
        raise RuntimeError("flaky: fails on its first attempt")


@app.handler("sleep")
def sleep(job: Job) -> None:
    time.sleep(float((job.payload or {}).get("seconds", 1)))
    _record(job)


@app.handler("async_ok")
async def async_ok(job: Job) -> None:
    import asyncio

    await asyncio.sleep(0)
    _record(job)


_conn: psycopg.Connection | None = None


@app.handler("record")
def record(job: Job) -> None:
    """Write (job id, attempt, pid) to the table `calls`, which the caller creates."""
    _record(job)


def _record(job: Job) -> None:
    global _conn
    if not os.environ.get("JOBSUP_RECORD_DSN"):
        return
    if _conn is None or _conn.closed:
        _conn = psycopg.connect(os.environ["JOBSUP_RECORD_DSN"], autocommit=True)
    _conn.execute("INSERT INTO calls (job_id, attempt, pid) VALUES (%s, %s, %s)", (job.id, job.attempts, os.getpid()))
