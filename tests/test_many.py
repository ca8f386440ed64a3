"""Many supervisors on one database share the work with no coordinator but PostgreSQL."""

from __future__ import annotations

import pytest

from .helpers import wait_for
from .supervisor_helpers import enqueue_kinds, make_calls_table, status_counts

pytestmark = pytest.mark.slow  # every test runs real supervisors

JOBS = 2000


def connections(conn) -> dict[str, int]:
    return dict(
        conn.execute(
            "SELECT application_name, count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name LIKE 'jobsup %%' "
            "GROUP BY 1"
        ).fetchall()
    )


def test_four_supervisors_of_two_processes_handle_every_job_exactly_once(conn, start):
    make_calls_table(conn)
    supervisors = [start(procs=2) for _ in range(4)]
    for sup in supervisors:
        sup.wait_ready()
    # One connection each for claims, the housekeeping, the listener and the pruner, and one for
    # outcome writes from the first outcome on; whatever --procs is: workers open none.
    each = {"jobsup claims": 4, "jobsup house": 4, "jobsup listen": 4, "jobsup prune": 4}
    wait_for(lambda: connections(conn) == each, message="4 connections per idle supervisor")
    ids = enqueue_kinds(conn, ["record"] * JOBS)
    wait_for(lambda: status_counts(conn).get("done") == JOBS, timeout=120, message=f"{JOBS} done")
    calls = dict(conn.execute("SELECT job_id, count(*) FROM calls GROUP BY job_id").fetchall())
    assert sorted(calls) == sorted(ids)
    assert set(calls.values()) == {1}
    attempts = {r[0] for r in conn.execute("SELECT DISTINCT attempts FROM jobsup.jobs")}
    assert attempts == {1}
    # Each supervisor took a share: the claim does not starve any of them.
    shares = conn.execute("SELECT count(DISTINCT locked_by) FROM jobsup.jobs").fetchone()[0]
    assert shares == 4
    assert connections(conn) == {**each, "jobsup writes": 4}
    for sup in supervisors:
        assert sup.stop() == 0
    done = conn.execute("SELECT sum(done) FROM jobsup.kind_totals").fetchone()[0]
    assert done == JOBS
