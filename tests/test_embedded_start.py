"""The first start of the embedded PostgreSQL: a Ctrl-C at any moment of its creation leaves nothing
that the next command cannot finish, and a start that fails says why and what to do."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from jobsup.db import embedded

from .helpers import ROOT, cli_env, jobsup, wait_for

pytestmark = pytest.mark.slow  # each case creates a server of its own (initdb: seconds)


@pytest.fixture
def data_dir() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="jobsup-first-"))  # short: the server's socket lives in it
    try:
        yield base / "pgdata"
    finally:
        if embedded.running_dsn(base / "pgdata", wait=0) is not None:
            embedded.stop(base / "pgdata")
        shutil.rmtree(base, ignore_errors=True)


def _env(data_dir: Path) -> dict[str, str]:
    return cli_env(JOBSUP_DATA_DIR=str(data_dir))


def _creating(data_dir: Path) -> Path:
    return data_dir.parent / f".{data_dir.name}.creating"


# The moments of a first start, each a condition on what is on disk: before anything, initdb begun,
# initdb half way (the version file written, the bootstrap not yet), initdb's bootstrap done, the data
# directory in place and the server starting, the server up.
MOMENTS: dict[str, Callable[[Path], bool]] = {
    "at once": lambda d: True,
    "initdb begun": lambda d: _creating(d).exists(),
    "initdb half way": lambda d: (_creating(d) / "PG_VERSION").exists(),
    "initdb bootstrapped": lambda d: (_creating(d) / "global" / "pg_control").exists(),
    "server starting": lambda d: (d / "PG_VERSION").exists(),
    "server up": lambda d: (d / "postmaster.pid").exists(),
}


@pytest.mark.parametrize("moment", list(MOMENTS))
@pytest.mark.parametrize("target", ["command", "terminal"])
def test_a_ctrl_c_during_the_first_migrate_leaves_what_the_next_migrate_finishes(data_dir, moment, target):
    # "command": SIGINT to jobsup alone, so its children (initdb, pg_ctl) are killed, not asked to stop;
    # "terminal": to the whole process group, as a terminal's Ctrl-C does.
    first = subprocess.Popen(
        [sys.executable, "-m", "jobsup", "migrate"],
        cwd=ROOT,
        env=_env(data_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    reached = MOMENTS[moment]
    wait_for(lambda: reached(data_dir) or first.poll() is not None, timeout=120, interval=0.002, message=moment)
    if target == "command":
        first.send_signal(signal.SIGINT)
    else:
        os.killpg(first.pid, signal.SIGINT)
    _, err = first.communicate(timeout=60)
    # 130, or killed by the signal itself when it comes before Python handles SIGINT: both are what a
    # shell reports as 130.
    assert first.returncode in (0, 130, -signal.SIGINT), err
    assert "Traceback" not in err, err

    again = jobsup("migrate", env=_env(data_dir), timeout=120)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(("applied migration", "schema up to date")), again.stdout
    assert not _creating(data_dir).exists()
    assert jobsup("stats", "--json", env=_env(data_dir)).returncode == 0


def test_what_an_initdb_interrupted_in_place_left_is_removed_and_made_anew(data_dir):
    # The state an earlier release left after a Ctrl-C during initdb, which ran in the data directory
    # itself: every later start failed on "initdb: directory ... exists but is not empty".
    (data_dir / "base" / "1").mkdir(parents=True)
    (data_dir / "global").mkdir()
    (data_dir / "pg_wal").mkdir()
    (data_dir / "PG_VERSION").write_text("18\n")
    (data_dir / "postgresql.conf").write_text("")
    done = jobsup("migrate", env=_env(data_dir), timeout=120)
    assert done.returncode == 0, done.stderr
    assert (data_dir / "global" / "pg_control").exists()


def test_an_empty_data_directory_made_beforehand_is_used(data_dir):
    data_dir.mkdir()  # as a user (or a racing command) may have made it
    done = jobsup("migrate", env=_env(data_dir), timeout=120)
    assert done.returncode == 0, done.stderr
    assert (data_dir / "global" / "pg_control").exists() and not _creating(data_dir).exists()


def test_a_directory_of_other_files_is_refused_in_one_line_that_says_what_to_do(data_dir):
    data_dir.mkdir()
    (data_dir / "notes.txt").write_text("mine")
    done = jobsup("stats", env=_env(data_dir))
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert f"{data_dir} is not empty and is not a PostgreSQL data directory" in line, line
    assert "--data-dir" in line and "JOBSUP_DATA_DIR" in line, line
    assert (data_dir / "notes.txt").read_text() == "mine"  # never removed


def test_a_server_that_cannot_start_names_the_cause_from_its_log(data_dir):
    assert jobsup("db", "start", env=_env(data_dir), timeout=120).returncode == 0
    assert jobsup("db", "stop", env=_env(data_dir)).returncode == 0
    with (data_dir / "postgresql.conf").open("a") as conf:
        conf.write("shared_buffers = 'lots'\n")
    done = jobsup("stats", env=_env(data_dir))
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert f"could not start the embedded PostgreSQL in {data_dir}" in line, line
    assert "shared_buffers" in line or "configuration file" in line, line  # the log's own words
    assert f"see {data_dir / 'log'}" in line and (data_dir / "log").exists(), line


def test_an_initdb_that_fails_says_why_in_its_own_words_and_leaves_nothing(data_dir):
    done = jobsup("migrate", env={**_env(data_dir), "LC_ALL": "xx_XX.UTF-8"}, timeout=120)
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert f"could not create the embedded PostgreSQL in {data_dir}: initdb failed: invalid locale" in line, line
    assert not data_dir.exists() and not _creating(data_dir).exists()
    assert jobsup("migrate", env=_env(data_dir), timeout=120).returncode == 0  # the cause gone, it works
