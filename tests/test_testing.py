"""jobsup.testing: drain inline and in real worker processes, compared with a real supervisor; and
enqueued / assert_enqueued."""

from __future__ import annotations

import pytest

from jobsup import client
from jobsup.testing import Ran, assert_enqueued, drain, enqueued

from .apps.control import app
from .helpers import wait_for
from .supervisor_helpers import make_calls_table

APP = "tests.apps.control:app"
JOBS = [
    {"kind": "twice", "max_attempts": 3},
    {"kind": "broken", "max_attempts": 2},
    {"kind": "snoozer", "payload": {"times": 1, "seconds": 0.05}},
    {"kind": "discarded"},
]


def final(conn) -> list[tuple]:
    return conn.execute(
        "SELECT kind, status, attempts, snoozes, jsonb_array_length(errors), last_error, "
        "return_value FROM jobsup.jobs ORDER BY id"
    ).fetchall()


def test_drain_gives_what_the_supervisor_gives(conn, start):
    make_calls_table(conn)  # the supervisor's workers record their calls there
    ids = client.enqueue_many(conn, JOBS)
    runs = drain(app, conn, with_scheduled=True)
    twice, broken, snoozer, discarded = ids
    assert [(r.id, r.attempt, r.outcome) for r in runs if r.id == twice] == [
        (twice, 1, "failed"),
        (twice, 2, "failed"),
        (twice, 3, "done"),
    ]
    assert [(r.attempt, r.outcome) for r in runs if r.id == broken] == [(1, "failed"), (2, "dead")]
    assert [(r.attempt, r.outcome) for r in runs if r.id == snoozer] == [(1, "snoozed"), (1, "done")]
    assert runs.outcomes() == {twice: "done", broken: "dead", snoozer: "done", discarded: "cancelled"}
    assert runs.counts() == {"failed": 3, "done": 2, "dead": 1, "snoozed": 1, "cancelled": 1}
    assert [r for r in runs if r.id == twice][-1].return_value == [
        "RuntimeError: twice: attempt 1 fails",
        "RuntimeError: twice: attempt 2 fails",
    ]
    drained = final(conn)

    conn.execute("TRUNCATE jobsup.jobs, jobsup.kind_totals")
    client.enqueue_many(conn, JOBS)
    start(app=APP, procs=2)  # --backoff-base 20ms
    wait_for(
        lambda: (
            conn.execute("SELECT count(*) FROM jobsup.jobs WHERE status IN ('done', 'dead', 'cancelled')").fetchone()[0]
            == len(JOBS)
        ),
        60,
        0.05,
        "the supervisor to finish every job",
    )
    assert final(conn) == drained
    assert [row[1:4] for row in drained] == [("done", 3, 0), ("dead", 2, 0), ("done", 1, 1), ("cancelled", 1, 0)]


def test_drain_without_scheduled_stops_at_what_waits(conn):
    [job_id] = client.enqueue_many(conn, [{"kind": "twice"}])
    assert drain(app, conn) == [Ran(job_id, "twice", 1, "failed", "RuntimeError: twice: attempt 1 fails")]
    assert conn.execute("SELECT status, attempts FROM jobsup.jobs").fetchone() == ("queued", 1)
    assert drain(app, conn) == []  # its retry is a second away (the default backoff)


@pytest.mark.slow  # real worker processes, and a timeout waited out
def test_drain_in_real_worker_processes_survives_a_crash_and_enforces_a_timeout(conn):
    crash, slow, done = client.enqueue_many(
        conn,
        [
            {"kind": "crash", "max_attempts": 1},
            {"kind": "sleep", "payload": {"seconds": 60}, "max_attempts": 1},
            {"kind": "twice", "max_attempts": 3},
        ],
    )
    runs = drain(app, conn, processes=True, timeout=0.5, with_scheduled=True)
    assert [(r.id, r.outcome, r.error) for r in runs if r.id in (crash, slow)] == [
        (crash, "dead", "worker exited with code 3"),
        (slow, "dead", "timed out after 0.5s"),
    ]
    assert runs.outcomes()[done] == "done"


def test_drain_of_an_app_by_name_leaves_a_kind_it_lacks_queued(conn):
    # as a supervisor of this app does: the job waits, attempts untouched, for an app that handles it
    [job_id] = client.enqueue_many(conn, [{"kind": "nobody", "max_attempts": 1}])
    assert drain(APP, conn) == []
    assert conn.execute("SELECT status, attempts FROM jobsup.jobs WHERE id = %s", [job_id]).fetchone() == ("queued", 0)


def test_enqueued_and_assert_enqueued(conn):
    client.enqueue_many(
        conn,
        [
            {"kind": "email", "payload": {"to": "a@example.com", "lang": "de"}},
            {"kind": "email", "payload": {"to": "b@example.com"}},
            {"kind": "sms"},
        ],
    )
    assert [j["payload"]["to"] for j in enqueued(conn, "email")] == ["a@example.com", "b@example.com"]
    assert [j["kind"] for j in enqueued(conn)] == ["email", "email", "sms"]
    [found] = assert_enqueued(conn, "email", to="a@example.com")
    assert found["payload"] == {"to": "a@example.com", "lang": "de"}
    assert_enqueued(conn, "email", count=2)
    with pytest.raises(AssertionError) as failure:
        assert_enqueued(conn, "email", to="c@example.com")
    message = str(failure.value)
    assert message.startswith("expected a job of kind='email' to='c@example.com', found 0; enqueued were 3:")
    assert 'email queue=default queued payload={"to": "b@example.com"}' in message
    assert "sms queue=default queued payload={}" in message


SCRIPT = """\
import os
import sys

import psycopg

from jobsup import client
from jobsup.testing import drain


def run():
    with psycopg.connect(os.environ["SCRIPT_DSN"], autocommit=True) as conn:
        conn.execute("TRUNCATE jobsup.jobs")
        client.enqueue(conn, "twice", max_attempts=3)
        with open(os.environ["SCRIPT_LOG"], "a") as log:  # one line per run of this code
            log.write(f"enqueued {{os.getpid()}}\\n")
        runs = drain("tests.apps.control:app", conn, processes=True, with_scheduled=True)
        print("outcomes", sorted(runs.outcomes().values()))


{call}
"""


@pytest.mark.slow  # scripts that start real worker processes
def test_drain_in_processes_from_a_script_without_the_main_guard_says_so_and_runs_nothing_twice(conn, dsn, tmp_path):
    import subprocess
    import sys

    from .helpers import ROOT, cli_env

    def script(call: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
        path, log = tmp_path / "script.py", tmp_path / "script.log"
        path.write_text(SCRIPT.format(call=call))
        log.unlink(missing_ok=True)
        done = subprocess.run(
            [sys.executable, str(path)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=cli_env(SCRIPT_DSN=dsn, SCRIPT_LOG=str(log)),
            timeout=120,
        )
        return done, log.read_text().splitlines()

    # Without the guard: the worker process would import the script again (as multiprocessing does).
    unguarded, log = script("run()")
    assert unguarded.returncode == 1, unguarded.stderr
    assert len(log) == 1, log  # the TRUNCATE and the enqueue ran once, in the script's own process
    assert "RuntimeError" not in unguarded.stderr and "the worker did not start" not in unguarded.stderr
    last = unguarded.stderr.strip().splitlines()[-1]
    assert last == (
        "jobsup.errors.BadInput: drain(processes=True) was called by code that runs when the script "
        f"{tmp_path / 'script.py'} is imported, and each worker process imports it again (as multiprocessing "
        'does): put the code that calls it under `if __name__ == "__main__":`'
    )
    assert conn.execute("SELECT status, attempts FROM jobsup.jobs").fetchall() == [("queued", 0)]

    # With it: the same script drains its job in a worker process.
    guarded, log = script('if __name__ == "__main__":\n    run()')
    assert guarded.returncode == 0, guarded.stderr
    assert guarded.stdout == "outcomes ['done']\n" and len(log) == 1


def test_migrate_sets_up_a_test_database_from_a_dsn_or_a_connection(empty_dsn):
    import psycopg

    from jobsup.db.migrate import LATEST
    from jobsup.testing import migrate

    applied = migrate(empty_dsn)
    assert applied[0] == "0001_initial" and applied[-1].startswith(f"{LATEST:04d}_"), applied
    assert len(applied) == LATEST
    with psycopg.connect(empty_dsn) as conn:
        assert migrate(conn) == []  # current: nothing to apply
        assert conn.execute("SELECT count(*) FROM jobsup.migrations").fetchone() == (LATEST,)


def test_the_place_of_migrate_in_0_1_0_still_works_with_a_deprecation_warning(empty_dsn):
    import psycopg

    import jobsup.db.migrate

    with pytest.warns(DeprecationWarning, match=r"jobsup\.migrate\.migrate goes .* jobsup\.testing\.migrate"):
        from jobsup.migrate import migrate
    assert migrate is jobsup.db.migrate.migrate
    with pytest.warns(DeprecationWarning, match=r"jobsup\.db\.migrate\.LATEST"):
        from jobsup.migrate import LATEST
    assert LATEST == jobsup.db.migrate.LATEST
    with psycopg.connect(empty_dsn) as conn:
        assert [m.version for m in migrate(conn)][-1] == LATEST  # 0.1.0's: the Migration records
    with pytest.raises(ImportError):
        from jobsup.migrate import nothing_of_the_kind  # noqa: F401
