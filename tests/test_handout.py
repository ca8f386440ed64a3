"""The hand-out of alone jobs: short jobs go to a worker several at a time, but never one behind a job
that is slow, and those behind one that turns out slow go to a free worker (tests/apps/handout.py)."""

from __future__ import annotations

import psycopg
import pytest

from jobsup import JobSpec, enqueue_many
from tests.apps.handout import SCHEMA

from .helpers import wait_for

APP = "tests.apps.handout:app"
# The same kinds beside a shared one: the hand-out of an app of both classes must do the same.
APPS = pytest.mark.parametrize("app", [APP, "tests.apps.handout:mixed_app"], ids=["alone", "mixed"])

pytestmark = pytest.mark.slow


def starts(conn: psycopg.Connection, ids: list[int]) -> dict[int, float]:
    rows = conn.execute(
        "SELECT job_id, extract(epoch FROM started)::float8 FROM handout_runs WHERE job_id = ANY(%s)", (ids,)
    ).fetchall()
    return dict(rows)


def quick_emails(conn: psycopg.Connection, count: int) -> None:
    """`count` emails that do nothing, run to the end: the supervisor sees jobs that take microseconds."""
    ids = enqueue_many(conn, [JobSpec("email") for _ in range(count)])
    wait_for(lambda: all_done(conn, ids), 30, message=f"{count} quick emails")


def all_done(conn: psycopg.Connection, ids: list[int]) -> bool:
    query = "SELECT count(*) FROM jobsup.jobs WHERE id = ANY(%s) AND status = 'done'"
    return conn.execute(query, (ids,)).fetchone()[0] == len(ids)


@APPS
def test_a_slow_job_does_not_hold_up_the_job_handed_out_behind_it(conn, start, app):
    """A new user's repro: --procs 4, 300 quick `email` jobs, then [fetch 3 s, fetch 3 s, 6 x email] in
    one enqueue. Both fetches start within 100 ms of each other, each in a process of its own, and the
    emails do not wait for them; three times."""
    conn.execute(SCHEMA)
    sup = start(app=app, procs=4)
    sup.wait_ready()
    for attempt in range(3):
        quick_emails(conn, 300)
        conn.execute("TRUNCATE handout_runs")
        fetches = [JobSpec("fetch", {"seconds": 3}), JobSpec("fetch", {"seconds": 3})]
        ids = enqueue_many(conn, fetches + [JobSpec("email", {"record": True}) for _ in range(6)])
        wait_for(lambda ids=ids: len(starts(conn, ids)) == len(ids), 20, message="every job started")
        at = starts(conn, ids)
        assert abs(at[ids[0]] - at[ids[1]]) < 0.1, (attempt, at)
        pids = dict(conn.execute("SELECT job_id, pid FROM handout_runs WHERE kind = 'fetch'").fetchall())
        assert pids[ids[0]] != pids[ids[1]]
        assert max(at[i] for i in ids[2:]) - min(at.values()) < 1.0, at
        wait_for(lambda ids=ids: all_done(conn, ids), 20)
    sup.stop()


@APPS
def test_short_jobs_handed_out_behind_one_that_turns_out_slow_go_to_a_free_worker(conn, start, app):
    """`email` is a short kind, so several of its jobs go to one worker at once; when one of them turns
    out slow (3 s), the ones behind it are given back and run by the other worker at once."""
    conn.execute(SCHEMA)
    sup = start(app=app, procs=2)
    sup.wait_ready()
    for attempt in range(3):
        quick_emails(conn, 500)
        conn.execute("TRUNCATE handout_runs")
        ids = enqueue_many(
            conn,
            [JobSpec("email", {"record": True, "seconds": 3})]
            + [JobSpec("email", {"record": True}) for _ in range(20)],
        )
        wait_for(lambda ids=ids: len(starts(conn, ids)) == len(ids), 20, message="every job started")
        at = starts(conn, ids)
        assert max(at[i] for i in ids[1:]) - at[ids[0]] < 1.0, (attempt, at)
        wait_for(lambda ids=ids: all_done(conn, ids), 20)
    sup.stop()
