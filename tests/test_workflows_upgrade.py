"""Upgrading to workflows (schema 9) without stopping: a supervisor of the release before (schema 8)
goes on running against the migrated schema with its own statements, which know nothing of workflows.
Its claim never takes a waiting job, and its outcome writes (complete, fail, snooze, cancel_held) and
its reaper still release a workflow's jobs, or cancel them, through the schema's trigger.

The statements are that release's, as it shipped them (tests/previous_release/lifecycle_v8.sql), run
with the parameters its jobsup/db/lifecycle.py passed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobsup.db.sql import load

from .apps.flows import app
from .helpers import wait_for

OLD = load((Path(__file__).parent / "previous_release" / "lifecycle_v8.sql").read_text())
# The old supervisors' names (its locked_by), and the old reaper's.
OLD_A, OLD_B, REAPER = "old-a", "old-b", "old-reaper"
FINISHED = ["done", "dead", "cancelled"]


# --- the previous release's statements, with the parameters its lifecycle.py passed ------------------


def old_claim(conn: psycopg.Connection, locked_by: str = OLD_A, lease: float = 30, limit: int = 100) -> list[tuple]:
    """Rows (id, kind, payload, queue, attempts, ...) of the jobs claimed, from the head of `default`."""
    return conn.execute(
        OLD["claim"],
        {
            "queues": ["default"],
            "limit": limit,
            "locked_by": locked_by,
            "lease": lease,
            "after_priorities": [None],
            "after_run_ats": [None],
            "after_ids": [None],
            "kinds": None,
        },
    ).fetchall()


def old_complete(conn: psycopg.Connection, jobs: list[tuple], locked_by: str = OLD_A) -> list[int]:
    params = {
        "ids": [j[0] for j in jobs],
        "attempts": [j[4] for j in jobs],
        "locked_by": locked_by,
        "return_values": [json.dumps(j[2].get("n")) for j in jobs],
    }
    return sorted(r[0] for r in conn.execute(OLD["complete"], params))


def old_fail(conn: psycopg.Connection, jobs: list[tuple], locked_by: str = OLD_A) -> list[tuple]:
    # A backoff of 0: the retry is due at once, so the test needs no clock of its own.
    params = {
        "ids": [j[0] for j in jobs],
        "attempts": [j[4] for j in jobs],
        "errors": [f"RuntimeError: step {j[2].get('n')} failed on purpose" for j in jobs],
        "tracebacks": [None for _ in jobs],
        "delays": [None for _ in jobs],
        "locked_by": locked_by,
        "backoff_base": 0.0,
        "backoff_cap": 3600.0,
        "jitter": 0.0,
    }
    return conn.execute(OLD["fail"], params).fetchall()


def old_snooze(conn: psycopg.Connection, jobs: list[tuple], locked_by: str = OLD_A) -> list[tuple]:
    params = {
        "ids": [j[0] for j in jobs],
        "attempts": [j[4] for j in jobs],
        "delays": [0.0 for _ in jobs],
        "reasons": ["Snooze: snoozed for 0s" for _ in jobs],
        "locked_by": locked_by,
    }
    return conn.execute(OLD["snooze"], params).fetchall()


def old_discard(conn: psycopg.Connection, jobs: list[tuple], locked_by: str = OLD_A) -> list[tuple]:
    params = {
        "ids": [j[0] for j in jobs],
        "attempts": [j[4] for j in jobs],
        "reasons": ["Discard: not wanted" for _ in jobs],
        "tracebacks": [None for _ in jobs],
        "bys": ["handler" for _ in jobs],
        "locked_by": locked_by,
    }
    return conn.execute(OLD["cancel_held"], params).fetchall()


def old_release(conn: psycopg.Connection, jobs: list[tuple], locked_by: str = OLD_A) -> list[tuple]:
    params = {"ids": [j[0] for j in jobs], "attempts": [j[4] for j in jobs], "reasons": [None] * len(jobs)}
    return conn.execute(OLD["release"], {**params, "locked_by": locked_by}).fetchall()


def old_extend(conn: psycopg.Connection, jobs: list[tuple], locked_by: str = OLD_A) -> list[tuple]:
    params = {"ids": [j[0] for j in jobs], "attempts": [j[4] for j in jobs], "locked_by": locked_by, "lease": 30}
    return conn.execute(OLD["extend"], params).fetchall()


def old_release_orphans(conn: psycopg.Connection, locked_by: str, held: list[int]) -> list[tuple]:
    return conn.execute(OLD["release_orphans"], {"locked_by": locked_by, "held": held}).fetchall()


def old_reap(conn: psycopg.Connection) -> list[tuple]:
    return conn.execute(OLD["reap"], {"reaper": REAPER, "limit": 1000}).fetchall()


# --- what the database says -----------------------------------------------------------------------


def statuses(conn: psycopg.Connection) -> dict[int, str]:
    return dict(conn.execute("SELECT id, status FROM jobsup.jobs").fetchall())


def unfinished_parents(conn: psycopg.Connection, ids: list[int]) -> list[tuple]:
    """(child, parent, parent's status) for each of `ids` with a parent that has not finished."""
    return conn.execute(
        "SELECT d.child_id, d.parent_id, p.status FROM jobsup.dependencies d JOIN jobsup.jobs p ON p.id = d.parent_id"
        " WHERE d.child_id = ANY(%s) AND p.status NOT IN ('done', 'dead', 'cancelled')",
        (ids,),
    ).fetchall()


def claim_checked(conn: psycopg.Connection, **kwargs: Any) -> list[tuple]:
    """The old claim, checked: it took no job that was waiting, and none with a parent not finished."""
    waiting = {i for i, s in statuses(conn).items() if s == "waiting"}
    claimed = old_claim(conn, **kwargs)
    ids = [row[0] for row in claimed]
    assert not waiting & set(ids), f"the old claim took waiting jobs {sorted(waiting & set(ids))}"
    assert unfinished_parents(conn, ids) == []
    return claimed


def run_like_the_old_supervisor(conn: psycopg.Connection) -> int:
    """Claim and answer as the old supervisor would, each job by its payload, until nothing is left to
    claim or reap; how many claims that took. A `lose` job is claimed and never answered: its lease runs
    out (claimed for 0.3 s) and the old reaper returns it."""
    rounds = 0
    while True:
        rounds += 1
        assert rounds < 50, statuses(conn)
        claimed = claim_checked(conn, lease=0.3)
        if not claimed:
            running = [i for i, s in statuses(conn).items() if s == "running"]
            if not running:
                return rounds
            # Until every lost job's lease has run out, as the old reaper reads it (locked_until < now()).
            wait_for(
                lambda ids=running: conn.execute(
                    "SELECT bool_and(locked_until < now()) FROM jobsup.jobs WHERE id = ANY(%s)", (ids,)
                ).fetchone()[0],
                timeout=5,
                interval=0.02,
                message="the lost jobs' leases to run out",
            )
            assert sorted(r[0] for r in old_reap(conn)) == sorted(running)
            continue
        by = {"fail": [], "snooze": [], "discard": [], "complete": []}
        for job in claimed:
            payload, snoozes = job[2], job[9]
            if payload.get("lose"):
                continue
            if payload.get("fail"):
                by["fail"].append(job)
            elif payload.get("snooze") and snoozes == 0:
                by["snooze"].append(job)
            elif payload.get("discard"):
                by["discard"].append(job)
            else:
                by["complete"].append(job)
        # One write of each kind per round, as the old supervisor's flush batches them.
        if by["fail"]:
            old_fail(conn, by["fail"])
        if by["snooze"]:
            old_snooze(conn, by["snooze"])
        if by["discard"]:
            old_discard(conn, by["discard"])
        if by["complete"]:
            assert old_extend(conn, by["complete"]) != []  # its lease renewal still works
            assert old_complete(conn, by["complete"]) == sorted(j[0] for j in by["complete"])


def test_a_supervisor_of_the_previous_release_runs_a_workflow_to_its_end(conn):
    """root -> 3 members -> fan-in; beside them, a member that dies through the old `fail` (a retry, then
    dead) with a chain of two under policy `cancel` and one job under `run`; one that dies through the old
    reaper (its lease lost, max_attempts 1), likewise; one snoozed by the old `snooze` (not its end: its
    child waits); one discarded by the old `cancel_held`. Driven only by the previous release's
    statements: its claims take only released jobs, and every job ends where it should."""
    wf = app.workflow("upgrade")
    root = wf.add("step", {"n": 0})
    members = [wf.add("step", {"n": n}, after=root) for n in (1, 2, 3)]
    fan_in = wf.add("gather", {"n": 4}, after=members)
    dies = wf.add("step", {"n": 10, "fail": True}, after=root, max_attempts=2)
    dies_cancel = wf.chain({"kind": "step", "payload": {"n": 11}}, {"kind": "step", "payload": {"n": 12}}, after=dies)
    dies_run = wf.add("step", {"n": 13}, after=dies, on_parent_failure="run")
    lost = wf.add("step", {"n": 20, "lose": True}, after=root, max_attempts=1)
    lost_cancel = wf.add("step", {"n": 21}, after=lost)
    lost_run = wf.add("step", {"n": 22}, after=lost, on_parent_failure="run")
    snoozed = wf.add("step", {"n": 30, "snooze": True}, after=root)
    snoozed_child = wf.add("step", {"n": 31}, after=snoozed)
    discarded = wf.add("step", {"n": 40, "discard": True}, after=root)
    discarded_child = wf.add("step", {"n": 41}, after=discarded)
    workflow_id = wf.enqueue(conn)
    everything = conn.execute("SELECT count(*) FROM jobsup.jobs").fetchone()[0]
    assert everything == 16 and list(statuses(conn).values()).count("waiting") == 15

    # Its claim takes the root alone; its two ways of handing a job back (release, release_orphans)
    # give it back without finishing it: its children still wait.
    [held] = claim_checked(conn)
    assert held[0] == root.id
    assert [r[0] for r in old_release(conn, [held])] == [root.id]
    [held] = claim_checked(conn, locked_by=OLD_B)
    assert [r[0] for r in old_release_orphans(conn, OLD_B, [])] == [root.id]
    assert list(statuses(conn).values()).count("waiting") == 15
    # Its complete releases the root's children, in the same transaction.
    [held] = claim_checked(conn)
    assert old_complete(conn, [held]) == [root.id]
    released = sorted(i for i, s in statuses(conn).items() if s == "queued")
    assert released == sorted([*(m.id for m in members), dies.id, lost.id, snoozed.id, discarded.id])

    run_like_the_old_supervisor(conn)

    rows = {
        r[0]: r[1:]
        for r in conn.execute("SELECT id, status, attempts, snoozes, last_error, return_value FROM jobsup.jobs")
    }
    assert len(rows) == everything

    def ended(ref) -> tuple[str, int]:
        return rows[ref.id][:2]

    def why(ref) -> str | None:
        return rows[ref.id][3]

    assert ended(root) == ("done", 1)
    assert [ended(m) for m in members] == [("done", 1)] * 3
    assert ended(fan_in) == ("done", 1) and rows[fan_in.id][4] == 4  # the return value the old complete wrote
    assert ended(dies) == ("dead", 2) and why(dies) == "RuntimeError: step 10 failed on purpose"
    assert [ended(r) for r in dies_cancel] == [("cancelled", 0)] * 2
    assert [why(r) for r in dies_cancel] == [f"cancelled: job {dies.id}, which it waits for, ended dead"] * 2
    assert ended(dies_run) == ("done", 1)
    assert ended(lost) == ("dead", 1) and why(lost) == f"lease expired: {OLD_A} stopped renewing it"
    assert ended(lost_cancel) == ("cancelled", 0)
    assert why(lost_cancel) == f"cancelled: job {lost.id}, which it waits for, ended dead"
    assert ended(lost_run) == ("done", 1)
    assert ended(snoozed) == ("done", 1) and rows[snoozed.id][2] == 1
    assert ended(snoozed_child) == ("done", 1)
    assert ended(discarded) == ("cancelled", 1) and why(discarded) == "Discard: not wanted"
    assert ended(discarded_child) == ("cancelled", 0)
    assert why(discarded_child) == f"cancelled: job {discarded.id}, which it waits for, ended cancelled"
    # Nothing stranded: every dependency settled, no job waiting with no parent left to wait for.
    assert conn.execute("SELECT count(*) FROM jobsup.dependencies WHERE NOT settled").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM jobsup.jobs WHERE status <> ALL(%s)", (FINISHED,)).fetchone() == (0,)
    # A child claimed only after each of its parents was done (the claim's started_at is the old one's).
    early = conn.execute(
        "SELECT d.child_id, d.parent_id FROM jobsup.dependencies d JOIN jobsup.jobs c ON c.id = d.child_id"
        " JOIN jobsup.jobs p ON p.id = d.parent_id WHERE c.started_at IS NOT NULL AND c.started_at <= p.done_at"
    ).fetchall()
    assert early == []
    assert conn.execute("SELECT count(*) FROM jobsup.jobs WHERE workflow_id = %s", (workflow_id,)).fetchone() == (16,)


@pytest.mark.parametrize("status", ["queued", "running"])
def test_the_previous_releases_claim_never_takes_a_waiting_job(conn, status):
    """20 waiting jobs, of a higher priority than their parent and due since their enqueue: the old
    claim, asked for 100, takes none of them; their parent (queued, or held by another) is all it may
    take."""
    wf = app.workflow()
    parent = wf.add("step", {"n": 0}, priority=-5)
    wf.group([{"kind": "step", "payload": {"n": n}, "priority": 10} for n in range(1, 21)], after=parent)
    wf.enqueue(conn)
    if status == "running":
        assert [r[0] for r in old_claim(conn, locked_by=OLD_B)] == [parent.id]
    claimed = old_claim(conn)
    assert [r[0] for r in claimed] == ([parent.id] if status == "queued" else [])
    assert conn.execute("SELECT count(*) FROM jobsup.jobs WHERE status = 'waiting'").fetchone() == (20,)


def test_the_indexes_built_beforehand_are_kept_by_the_migration(empty_dsn):
    """The upgrade procedure for a large table (docs/operations/upgrading.md, schema 9): the column and
    the two indexes built beforehand without blocking, then `jobsup migrate`, which keeps them."""
    from jobsup.db import migrate as migrations

    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA jobsup")
        conn.execute(migrations.SQL["migrations_table"])
        for migration in migrations.available():
            if migration.version < 9:
                conn.execute(migration.sql.encode())
                conn.execute(migrations.SQL["migration_done"], {"version": migration.version, "name": migration.name})
        conn.execute("INSERT INTO jobsup.jobs (kind) VALUES ('k')")
        conn.execute("ALTER TABLE jobsup.jobs ADD COLUMN IF NOT EXISTS workflow_id bigint")
        conn.execute(
            "CREATE INDEX CONCURRENTLY jobs_workflow_idx ON jobsup.jobs (workflow_id, status)"
            " WHERE workflow_id IS NOT NULL"
        )
        conn.execute("CREATE INDEX CONCURRENTLY jobs_waiting_idx ON jobsup.jobs (queue, kind) WHERE status = 'waiting'")
        assert [m.version for m in migrations.migrate(conn)][0] == 9
        indexes = [r[0] for r in conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = 'jobsup'")]
        assert indexes.count("jobs_workflow_idx") == 1 and indexes.count("jobs_waiting_idx") == 1
        assert conn.execute("SELECT status, workflow_id, parents_left FROM jobsup.jobs").fetchall() == [
            ("queued", None, 0)
        ]
