"""The enqueue API's options are typed: a misspelt option is a BadInput naming it (at run time) and a
type error (for mypy, checked on a file of calls)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

import jobsup
from jobsup.errors import BadInput


def test_a_misspelt_option_is_refused_naming_it(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(BadInput, match=r"no option 'priorty' \(did you mean 'priority'\?\)"):
            jobsup.enqueue(conn, "email", {}, priorty=5)  # type: ignore[call-arg]
        with pytest.raises(BadInput, match=r"a job of enqueue_many has no option 'max_attempt'"):
            jobsup.enqueue_many(conn, [{"kind": "email", "max_attempt": 2}])
        with pytest.raises(BadInput, match="no option 'qeue'"):
            jobsup.App().enqueue(conn, "email", qeue="mail")  # type: ignore[call-arg]
        assert conn.execute("SELECT count(*) FROM jobsup.jobs").fetchone() == (0,)
        job_id = jobsup.enqueue(conn, "email", {"to": "a@example.com"}, priority=5, max_attempts=2)
        row = conn.execute("SELECT kind, priority, max_attempts FROM jobsup.jobs WHERE id = %s", [job_id]).fetchone()
    assert row == ("email", 5, 2)


def test_options_given_twice_are_refused(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(BadInput, match="in its JobSpec or as keywords, not both"):
            jobsup.enqueue(conn, jobsup.JobSpec("email"), priority=1)


@pytest.mark.slow  # a whole mypy run in a subprocess
def test_mypy_reports_a_misspelt_option(tmp_path: Path) -> None:
    calls = tmp_path / "calls.py"
    calls.write_text(
        "import psycopg\nimport jobsup\n\n"
        "def f(conn: psycopg.Connection) -> None:\n"
        "    jobsup.enqueue(conn, 'email', priority=1, unique_key='k')\n"
        "    jobsup.enqueue(conn, 'email', priorty=1)\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--config-file", "/dev/null", str(calls)],
        capture_output=True,
        text=True,
    )
    errors = [line for line in result.stdout.splitlines() if line.startswith(str(calls)) and "error:" in line]
    assert len(errors) == 1, result.stdout
    assert f"{calls}:6:" in errors[0] and 'Unexpected keyword argument "priorty"' in errors[0]
