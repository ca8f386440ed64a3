"""Handlers of known run times, for the latency tests: each sleeps as long as its name says."""

from __future__ import annotations

import time

from jobsup import App, Job

app = App()


@app.handler("sleep10")
def sleep10(job: Job) -> None:
    time.sleep(0.010)


@app.handler("sleep100")
def sleep100(job: Job) -> None:
    time.sleep(0.100)


@app.handler("quick")
def quick(job: Job) -> None:
    pass


@app.handler("boom", max_attempts=1)
def boom(job: Job) -> None:
    raise RuntimeError("boom")
