"""The guides' Python examples work as written on the default setup, their handlers under a real supervisor.

The default setup: no JOBSUP_DSN, no DATABASE_URL, no JOBSUP_DATA_DIR; the embedded server in the
per-user data directory (here XDG_DATA_HOME points at a directory of this module's own). Each page's
blocks run in one process as tests/test_docs.py runs them, except that `jobsup.testing.drain` hands
the jobs to a real `jobsup start` of the same app, started on the page's first drain, and returns what
that supervisor made of them, read from the database. A drain stays in the page's process only where a
supervisor cannot take its place: an app that only the page's `__main__` holds, jobs in a transaction
the drain's caller has not committed, or spans read from an exporter of the page's own process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from jobsup.db import embedded
from jobsup.db.migrate import migrate

from .helpers import ROOT
from .supervisor_helpers import FAST
from .test_docs import python_blocks, run_blocks

pytestmark = pytest.mark.slow  # each page starts real supervisors

TIMEOUT = 120.0

GUIDES = sorted(p for p in (ROOT / "docs" / "guides").glob("*.md") if python_blocks(p.read_text()))

# Runs in the page's process before the page's blocks: the drain that asks a real supervisor.
PRELUDE = r"""
import atexit, importlib, os, signal, subprocess, sys, time

import psycopg

import jobsup
import jobsup.testing
from jobsup.testing import Drained, Ran

_inline_drain = jobsup.testing.drain
_supervisors = {}  # every supervisor started, by number
_seen = set()
_FAST = json.loads(os.environ["GUIDE_FAST"])


def _record(how, why=""):
    with open(os.environ["GUIDE_DRAINS"], "a") as f:
        f.write(json.dumps([how, why]) + "\n")


def _target(app):
    try:
        return jobsup.testing._target_of(app)
    except jobsup.JobsupError:
        pass
    # The page's first block is also its app module (`# myapp/jobs.py`) but ran in __main__: the module
    # of the same name, whose handlers the page's app holds, is what a supervisor loads.
    for path in os.environ.get("GUIDE_MODULES", "").split(os.pathsep):
        if not path or not os.path.exists(path):
            continue
        name = os.path.relpath(path)[:-3].replace(os.sep, ".")
        try:
            module = importlib.import_module(name)
        except Exception:  # a page's test module, say: not an app
            continue
        kinds = set(getattr(getattr(module, "app", None), "handlers", {}))
        if kinds and kinds <= set(app.handlers):
            return f"{name}:app"
    return None


def _stop(process, log):
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
    log.close()


def _supervisor(target, queues):
    # One per drain, stopped at its end: a supervisor left running would take the jobs of a later
    # drain that must stay in this process.
    log = open(f"supervisor-{len(_supervisors)}.log", "w")
    argv = [sys.executable, "-m", "jobsup", "start", "--app", target, "--procs", "2",
            "--queues", ",".join(queues), *_FAST]
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    _supervisors[len(_supervisors)] = (process, log)
    atexit.register(_stop, process, log)
    return process, log


def _outcome(status, last_error):
    if status in ("done", "dead", "cancelled"):
        return status
    return "failed" if last_error else "snoozed"


def drain(app, conn, *, queues=None, with_scheduled=False, **options):
    if isinstance(app, str):
        app = jobsup.load_app(app)
    target = _target(app)
    idle = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    why = (
        "an app only __main__ holds" if target is None
        else "jobs in the caller's open transaction" if not idle
        else "spans read in this process" if "opentelemetry.sdk.trace" in sys.modules
        else ""
    )
    if why:
        _record("inline", why)
        return _inline_drain(app, conn, queues=queues, with_scheduled=with_scheduled, **options)
    _record("supervised", target)
    kinds = list(jobsup.load_app(target).handlers)
    with psycopg.connect(jobsup.dsn(), autocommit=True) as db:
        if queues is None:
            queues = [q for (q,) in db.execute(
                "SELECT DISTINCT queue FROM jobsup.jobs WHERE kind = ANY(%s) AND status IN ('queued', 'waiting')",
                [kinds])] or ["default"]
        process, log = _supervisor(target, queues)
        deadline = time.monotonic() + 60
        while True:
            [(left,)] = db.execute(
                "SELECT count(*) FROM jobsup.jobs WHERE kind = ANY(%s) AND queue = ANY(%s)"
                " AND (status IN ('running', 'waiting') OR (status = 'queued' AND (%s OR run_at <= now())))",
                [kinds, queues, with_scheduled],
            ).fetchall()
            if not left:
                break
            if process.poll() is not None or time.monotonic() > deadline:
                log.flush()
                raise AssertionError(
                    f"the supervisor of {target} left {left} jobs unfinished (exit {process.poll()}):\n"
                    + open(log.name).read()
                )
            time.sleep(0.05)
        _stop(process, log)
        rows = db.execute(
            "SELECT id, kind, attempts, status, last_error, return_value FROM jobsup.jobs"
            " WHERE kind = ANY(%s) AND queue = ANY(%s) AND attempts > 0 AND NOT (id = ANY(%s))"
            " ORDER BY coalesce(done_at, started_at), id",
            [kinds, queues, sorted(_seen)],
        ).fetchall()
    runs = Drained()
    for id, kind, attempts, status, last_error, return_value in rows:
        if status in ("done", "dead", "cancelled"):
            _seen.add(id)
        runs.append(Ran(id, kind, attempts, _outcome(status, last_error), last_error, return_value))
    return runs


jobsup.testing.drain = drain
"""


@pytest.fixture(scope="module")
def default_home() -> Iterator[Path]:
    """XDG_DATA_HOME of a first start: jobsup's embedded server in it, migrated by `jobsup migrate`."""
    base = Path(tempfile.mkdtemp(prefix="jobsup-guides-"))  # short: the server's socket lives in it
    env = _default_env(base)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "jobsup", "migrate"], env=env, cwd=ROOT, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        yield base
    finally:
        embedded.stop(base / "jobsup" / "pgdata")
        shutil.rmtree(base, ignore_errors=True)


def _default_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("JOBSUP_DSN", "DATABASE_URL", "JOBSUP_DATA_DIR")}
    env["XDG_DATA_HOME"] = str(home)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def _fresh_database(home: Path) -> None:
    """The page starts on an empty queue and no tables of an earlier page's."""
    dsn = embedded.running_dsn(home / "jobsup" / "pgdata")
    assert dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS jobsup CASCADE")
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
        migrate(conn)


def _named_modules(page: Path, cwd: Path) -> list[str]:
    names = []
    for _, source in python_blocks(page.read_text()):
        first = source.split("\n", 1)[0]
        if first.startswith("# ") and first.endswith(".py") and " " not in first[2:]:
            names.append(str(cwd / first[2:]))
    return names


def run_supervised(page: Path, home: Path, cwd: Path) -> tuple[int | None, str, str, list[list[str]]]:
    """Run the page's blocks on the default setup: (exit code or None on a timeout, stdout, stderr, drains)."""
    drains = cwd / ".guide_drains"
    env = _default_env(home)
    env["PYTHONPATH"] = os.pathsep.join([str(cwd), env["PYTHONPATH"]])  # the page's modules, for the workers
    env.update(
        GUIDE_DRAINS=str(drains), GUIDE_FAST=json.dumps(FAST), GUIDE_MODULES=os.pathsep.join(_named_modules(page, cwd))
    )
    code, out, err = run_blocks(page, cwd, env, TIMEOUT, prelude="import json\n" + PRELUDE)
    ran = [json.loads(line) for line in drains.read_text().splitlines()] if drains.exists() else []
    return code, out, err, ran


# The pages whose handlers a supervisor must have run: each defines its app in a module of its own.
SUPERVISED = {"handlers.md", "middleware.md", "workflows.md"}


@pytest.mark.parametrize("page", GUIDES, ids=lambda page: page.name)
def test_a_guide_works_as_written_on_the_default_setup(page: Path, default_home: Path, tmp_path: Path):
    _fresh_database(default_home)
    code, out, err, drains = run_supervised(page, default_home, tmp_path)
    logs = "".join(f"\n--- {log.name}:\n{log.read_text()[-3000:]}" for log in sorted(tmp_path.glob("supervisor-*.log")))
    assert code == 0, f"{page.name}: exit {code}\n--- stderr:\n{err}\n--- stdout:\n{out[-2000:]}{logs}"
    if page.name in SUPERVISED:
        assert ["supervised"] == sorted({how for how, _ in drains if how == "supervised"}), drains
