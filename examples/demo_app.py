"""The handlers of `make demo`: a steady mix in which most jobs succeed and the rest go wrong on purpose.

What happens to a job is written in its payload by examples/demo.py (`fate`), so the console shows each
kind of trouble at a known rate:

    ok       succeeds after a short pause
    flaky    raises on its first attempts, then succeeds (a retry with backoff)
    doomed   raises on every attempt, so it ends dead with its last error
    crash    kills its own worker with os._exit: the pool replaces the worker, the attempt fails
    slow     takes a few seconds (reports, in their own queue)
    hang     never returns: the supervisor terminates it at the handler's timeout

Two kinds have limits, held by the database (the console's Limits tab, `jobsup limit`): webhooks start at
most 3 a second, one at a time per customer; exports run one at a time. Every few seconds the feed
enqueues a workflow: four resizes, then an album after all of them (the Workflows tab).
"""

from __future__ import annotations

import os
import random
import time

from jobsup import App, Job

app = App()


def _pause(job: Job, low: float, high: float) -> None:
    time.sleep(random.Random(job.id).uniform(low, high))


@app.handler("email", max_attempts=4)
def email(job: Job) -> None:
    _pause(job, 0.05, 0.4)
    fate = job.payload.get("fate")
    if fate == "flaky" and job.attempts <= job.payload.get("fails", 1):
        raise ConnectionError("SMTPServerDisconnected: Connection unexpectedly closed")
    if fate == "doomed":
        raise ConnectionError("SMTPRecipientsRefused: 550 mailbox unavailable")


# A customer's endpoint takes one delivery at a time, and all of them together at most 3 a second.
@app.handler(
    "webhook",
    max_attempts=3,
    rate="3/s",
    burst=3,
    key=lambda payload: payload.get("customer", "anyone"),
    key_concurrency=1,
)
def webhook(job: Job) -> None:
    _pause(job, 0.02, 0.2)
    if job.payload.get("fate") == "doomed":
        raise RuntimeError(f"HTTP 502 Bad Gateway from {job.payload.get('url', 'https://hooks.example')}")


@app.handler("resize", max_attempts=3)
def resize(job: Job) -> None:
    _pause(job, 0.1, 0.6)
    fate = job.payload.get("fate")
    if fate == "crash" and (job.payload.get("always") or job.attempts == 1):
        os._exit(70)  # the worker is gone mid-job, as after a segfault in an image library


@app.handler("report", queue="reports", max_attempts=2)
def report(job: Job) -> None:
    _pause(job, 2.0, 6.0)


@app.handler("export", timeout=3, max_attempts=2, concurrency=1)  # one export at a time
def export(job: Job) -> None:
    if job.payload.get("fate") == "hang":
        while True:
            time.sleep(1)
    _pause(job, 0.2, 1.0)


@app.handler("album")
def album(job: Job) -> None:  # the fan-in of a workflow: runs once all its resizes have finished
    _pause(job, 0.1, 0.3)
