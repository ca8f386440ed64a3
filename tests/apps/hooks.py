"""Worker start and stop functions, for their tests: each writes a line to the file HOOKS_FILE names
(`start PID`, `astart PID LOOP`, `stop PID`), and a shared job writes the loop it runs on
(`job PID LOOP`). With HOOKS_FAIL set, the start function raises."""

from __future__ import annotations

import asyncio
import os

from jobsup import App, Job

app = App()


def _write(line: str) -> None:
    with open(os.environ["HOOKS_FILE"], "a") as out:
        out.write(line + "\n")


@app.on_worker_start
def start() -> None:
    if os.environ.get("HOOKS_FAIL"):
        raise RuntimeError("no credentials for the mail API")
    _write(f"start {os.getpid()}")


@app.on_worker_start
async def astart() -> None:
    _write(f"astart {os.getpid()} {id(asyncio.get_running_loop())}")


@app.on_worker_stop
async def stop() -> None:
    _write(f"stop {os.getpid()}")


@app.handler("where", shared=True)
async def where(job: Job) -> None:
    _write(f"job {os.getpid()} {id(asyncio.get_running_loop())}")
