"""`make demo`, as the README's first line gives it: examples/demo.py on a terminal of its own, with an
embedded PostgreSQL of its own, until a person presses q."""

from __future__ import annotations

import os
import sys

import psycopg
import pytest

from jobsup.db import embedded

from .helpers import wait_for
from .terminal import Terminal

pytestmark = pytest.mark.slow  # a database, a supervisor of 8 workers and the console


def test_the_demo_shows_limits_and_workflows_and_leaves_nothing_running_after_q(tmp_path):
    data_dir = tmp_path / "pgdata"
    env = {**os.environ, "TERM": "xterm-256color", "JOBSUP_DATA_DIR": str(data_dir), "TMPDIR": str(tmp_path)}
    for name in ("JOBSUP_DSN", "DATABASE_URL"):  # the demo's own embedded server, not the suite's
        env.pop(name, None)
    demo = Terminal([sys.executable, "examples/demo.py"], env)
    try:
        demo.wait_for(b"supervisors", timeout=90)  # the console is up
        dsn = embedded.running_dsn(data_dir)
        assert dsn is not None
        with psycopg.connect(dsn, autocommit=True) as conn:

            def albums_done() -> bool:
                demo.read(0)
                row = conn.execute(
                    "SELECT count(*) FROM jobsup.jobs WHERE kind = 'album' AND status = 'done'"
                ).fetchone()
                return row is not None and row[0] >= 1

            # The app's limits, recorded by its supervisor; a workflow's fan-in, run after its resizes.
            wait_for(albums_done, timeout=60, message="an album done")
            limits = dict(conn.execute("SELECT kind, set_by FROM jobsup.limits WHERE limited").fetchall())
            assert limits == {"export": None, "webhook": None}
            [(first, last)] = conn.execute(
                "SELECT max(r.done_at), max(a.started_at) FROM jobsup.jobs a"
                " JOIN jobsup.dependencies d ON d.child_id = a.id JOIN jobsup.jobs r ON r.id = d.parent_id"
                " WHERE a.kind = 'album' AND a.status = 'done' GROUP BY a.id ORDER BY a.id LIMIT 1"
            ).fetchall()
            assert first <= last  # the album started after the last of its resizes finished
        assert demo.quit(b"q", timeout=60) == 0, demo.seen[-2000:]
    finally:
        demo.close()
        left = embedded.running_dsn(data_dir, wait=0)
        if left is not None:  # the demo failed, or was killed above: its server would outlive the test
            embedded.stop(data_dir)
    said = demo.seen.decode(errors="replace")
    assert "supervisor exited with code 0" in said and "stopped the embedded PostgreSQL" in said, said[-2000:]
    assert left is None, "the demo left its embedded PostgreSQL running"
