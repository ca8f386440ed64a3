"""A supervisor claims only the kinds its app can run: the others stay queued, attempts untouched, for
a supervisor that can, and doctor and check name them meanwhile. The rolling deploy every release with a
new kind goes through: supervisors of release 1 still running when jobs of the new kind arrive."""

from __future__ import annotations

import json
import time

import psycopg
import pytest

import jobsup
from jobsup.db import lifecycle
from jobsup.ops.unserved import unserved
from jobsup.testing import drain
from tests.apps.deploy_v1 import app as v1
from tests.helpers import jobsup as run_jobsup
from tests.helpers import wait_for
from tests.supervisor_helpers import Supervisor


def _statuses(conn: psycopg.Connection, kind: str) -> list[tuple[str, int]]:
    return conn.execute("SELECT status, attempts FROM jobsup.jobs WHERE kind = %s ORDER BY id", [kind]).fetchall()


def test_a_claim_takes_only_the_kinds_given(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        # the other kind first and of a higher priority: the claim must step over it
        jobsup.enqueue_many(conn, [{"kind": "c", "priority": 5}, {"kind": "a"}, {"kind": "b"}])
        taken = lifecycle.claim(conn, ["default"], 10, "test", 30.0, kinds=["a", "b"])
        assert sorted(j.kind for j in taken) == ["a", "b"]
        assert _statuses(conn, "c") == [("queued", 0)]
        assert [j.kind for j in lifecycle.claim(conn, ["default"], 10, "test", 30.0)] == ["c"]  # None: any kind


def test_drain_leaves_a_kind_its_app_cannot_run_queued(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        jobsup.enqueue_many(conn, [{"kind": "a"}, {"kind": "newkind"}])
        ran = drain(v1, conn)
        assert [r.kind for r in ran] == ["a"]
        assert _statuses(conn, "newkind") == [("queued", 0)]


@pytest.mark.slow
def test_a_rolling_deploy_leaves_the_new_kind_to_the_new_release(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        old = Supervisor(dsn, "--queues", "deploy", app="tests.apps.deploy_v1:app", procs=2)
        new = None
        try:
            old.wait_ready()
            wait_for(lambda: conn.execute("SELECT kinds FROM jobsup.supervisors").fetchone() == (["a", "b"],))
            c_ids = [jobsup.enqueue(conn, "c", queue="deploy", priority=1) for _ in range(5)]
            a_ids = [jobsup.enqueue(conn, "a", queue="deploy") for _ in range(20)]
            # release 1 ran the jobs behind the new kind's, so its claims went past them
            wait_for(
                lambda: conn.execute(
                    "SELECT count(*) = 20 FROM jobsup.jobs WHERE id = ANY(%s) AND status = 'done'", [a_ids]
                ).fetchone()[0],
                message="release 1 to run the jobs of kind a",
            )
            assert _statuses(conn, "c") == [("queued", 0)] * 5
            assert "no handler" not in old.log()

            [waiting] = unserved(conn)
            assert (waiting.queue, waiting.kind, waiting.ready) == ("deploy", "c", 5)
            doctor = json.loads(run_jobsup("doctor", "--json", "--dsn", dsn).stdout)
            [check] = [c for c in doctor["checks"] if c["name"] == "unserved"]
            assert check["level"] == "warn" and "5 ready jobs of kind c" in check["message"], check
            alert = run_jobsup("check", "--max-unserved-age", "1ms", "--max-oldest-age", "0", "--dsn", dsn)
            assert alert.returncode == 1, alert.stderr
            assert "queue deploy: 5 ready jobs of kind c that no live supervisor can run" in alert.stdout

            new = Supervisor(dsn, "--queues", "deploy", app="tests.apps.deploy_v2:app", procs=2)
            new.wait_log("app.loaded")
            loaded = time.time()
            wait_for(lambda: _statuses(conn, "c") == [("done", 1)] * 5, message="release 2 to run kind c")
            (first_start,) = conn.execute(
                "SELECT extract(epoch FROM min(started_at))::float8 FROM jobsup.jobs WHERE id = ANY(%s)", [c_ids]
            ).fetchone()
            # from the moment this test saw the new release's app loaded (polled, so a little late)
            assert first_start - loaded < 1.0, f"kind c started {first_start - loaded:.3f}s after release 2 loaded"
            assert unserved(conn) == []
            ok = run_jobsup("check", "--max-unserved-age", "1ms", "--max-oldest-age", "0", "--dsn", dsn)
            assert ok.returncode == 0, ok.stdout
        finally:
            old.close()
            if new is not None:
                new.close()
