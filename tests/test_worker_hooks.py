"""App.on_worker_start and on_worker_stop under a real supervisor: once in each worker, an async one on
the loop the worker's shared jobs run on, the stop ones at a clean exit; a start function that raises
keeps the supervisor from starting, in one line (tests/apps/hooks.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from jobsup import JobSpec, enqueue_many

from .helpers import wait_for

APP = "tests.apps.hooks:app"

pytestmark = pytest.mark.slow


def lines(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def test_start_functions_run_once_in_each_worker_and_stop_ones_at_a_clean_exit(conn, start, tmp_path):
    record = tmp_path / "hooks.txt"
    sup = start(app=APP, procs=2, env={"HOOKS_FILE": str(record)})
    sup.wait_ready()
    enqueue_many(conn, [JobSpec("where") for _ in range(10)])
    wait_for(lambda: sum(1 for line in lines(record) if line[0] == "job") == 10, 30)
    assert sup.stop() == 0
    seen = lines(record)
    pids = {line[1] for line in seen if line[0] == "start"}
    assert len(pids) == 2
    counts = Counter((line[0], line[1]) for line in seen if line[0] in ("start", "astart", "stop"))
    assert counts == {(what, pid): 1 for pid in pids for what in ("start", "astart", "stop")}
    # The async start function ran on the loop the worker's shared jobs run on (a pool it opens works).
    loops = {line[1]: line[2] for line in seen if line[0] == "astart"}
    assert all(loops[line[1]] == line[2] for line in seen if line[0] == "job")


def test_a_start_function_that_raises_stops_the_supervisor_with_one_line(start, tmp_path):
    sup = start(app=APP, procs=2, env={"HOOKS_FILE": str(tmp_path / "hooks.txt"), "HOOKS_FAIL": "1"})
    assert sup.process.wait(60) == 3
    log = sup.log()
    assert (
        "a worker start function of tests.apps.hooks:app failed: RuntimeError: no credentials for the mail API" in log
    )
    assert "Traceback" not in log
