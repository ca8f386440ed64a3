"""Retention of workflows and of jobs with parents, against a real PostgreSQL: the sweep that marks a
workflow finished, a finished workflow pruned whole past its window, an unfinished one kept whole
however old its jobs, and a parent kept while a child of it has not finished.

Jobs are made "old" by moving their done_at back (`age`), never by waiting.
"""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from jobsup import client
from jobsup.db import lifecycle
from jobsup.ops import control
from jobsup.ops.prune import BatchSize, Retention, aprunable, aprune
from jobsup.testing import drain

from .apps.flows import RUNS_TABLE, app
from .helpers import jobsup

HOUR = 3600.0
WINDOWS = Retention(keep_done=HOUR, keep_dead=4 * HOUR)
FOREVER = Retention(keep_done=0, keep_dead=0)  # prunes no job: a round that only sweeps


@pytest.fixture
def runs(conn, dsn, monkeypatch):
    conn.execute(RUNS_TABLE)
    monkeypatch.setenv("JOBSUP_DSN", dsn)
    return conn


def prune(conn: psycopg.Connection, retention: Retention, **kwargs) -> dict[str, int]:
    """One pruning round, as the supervisors' pruner runs it; what it says it removed."""

    async def go():
        aconn = await psycopg.AsyncConnection.connect(conn.info.dsn, autocommit=True)
        try:
            return await aprune(aconn, retention, **kwargs)
        finally:
            await aconn.close()

    return asyncio.run(go()).to_json()


def prunable(conn: psycopg.Connection, retention: Retention) -> dict[str, int]:
    async def go():
        aconn = await psycopg.AsyncConnection.connect(conn.info.dsn, autocommit=True)
        try:
            return await aprunable(aconn, retention)
        finally:
            await aconn.close()

    return asyncio.run(go()).to_json()


def age(conn: psycopg.Connection, ids: list[int], hours: float) -> None:
    """Make the finished ones of `ids` look as if they finished `hours` ago."""
    conn.execute(
        "UPDATE jobsup.jobs SET done_at = now() - make_interval(hours => %s)"
        " WHERE id = ANY(%s) AND done_at IS NOT NULL",
        (hours, ids),
    )


def members(conn: psycopg.Connection, workflow_id: int) -> list[int]:
    return [r[0] for r in conn.execute("SELECT id FROM jobsup.jobs WHERE workflow_id = %s ORDER BY id", (workflow_id,))]


def edges(conn: psycopg.Connection, ids: list[int]) -> int:
    """Rows of jobsup.dependencies naming any of `ids`, as parent or as child."""
    return conn.execute(
        "SELECT count(*) FROM jobsup.dependencies WHERE parent_id = ANY(%s) OR child_id = ANY(%s)", (ids, ids)
    ).fetchone()[0]


def workflow(conn: psycopg.Connection, workflow_id: int) -> tuple | None:
    return conn.execute("SELECT finished_at, failed FROM jobsup.workflows WHERE id = %s", (workflow_id,)).fetchone()


def existing(conn: psycopg.Connection, ids: list[int]) -> list[int]:
    return [r[0] for r in conn.execute("SELECT id FROM jobsup.jobs WHERE id = ANY(%s) ORDER BY id", (ids,))]


def enqueue_diamond(conn: psycopg.Connection, name: str, fail: bool = False) -> int:
    """A workflow a -> (b, c) -> d of steps, enqueued; b fails (and dies) when `fail`; d runs anyway."""
    wf = app.workflow(name)
    a = wf.add("step", {"n": 1})
    group = wf.group(
        [{"kind": "step", "payload": {"n": 2, "fail": fail}}, {"kind": "step", "payload": {"n": 3}}],
        after=a,
    )
    wf.add("step", {"n": 4}, after=group.members, on_parent_failure="run")
    workflow_id = wf.enqueue(conn)
    assert workflow_id is not None
    return workflow_id


def test_the_sweep_marks_a_workflow_finished_when_its_last_job_did_and_failed_if_one_failed(runs):
    done = enqueue_diamond(runs, "done")
    failed = enqueue_diamond(runs, "failed", fail=True)
    drain(app, runs, with_scheduled=True)
    still_open = enqueue_diamond(runs, "open")
    assert workflow(runs, done) == workflow(runs, failed) == (None, None)  # nothing sets them but the sweep

    assert prune(runs, FOREVER) == {"done": 0, "dead": 0, "events": 0, "workflows": 0}

    for workflow_id, was_failed in ((done, False), (failed, True)):
        [last] = runs.execute("SELECT max(done_at) FROM jobsup.jobs WHERE workflow_id = %s", (workflow_id,)).fetchone()
        assert workflow(runs, workflow_id) == (last, was_failed)
    statuses = [r[0] for r in runs.execute("SELECT status FROM jobsup.jobs WHERE workflow_id = %s", (failed,))]
    assert sorted(statuses) == ["dead", "done", "done", "done"]  # d ran anyway: failed says a job failed
    assert workflow(runs, still_open) == (None, None)


def test_the_sweep_goes_through_the_open_workflows_in_batches_and_reopens_nothing(runs):
    ids = [enqueue_diamond(runs, f"w{n}") for n in range(5)]
    drain(app, runs)
    left_open = enqueue_diamond(runs, "left open")

    prune(runs, FOREVER, batch=BatchSize(size=2, largest=2))  # 6 open workflows: 3 batches and one more

    assert all(workflow(runs, i)[0] is not None for i in ids)
    assert workflow(runs, left_open) == (None, None)
    finished = workflow(runs, ids[0])
    prune(runs, FOREVER)
    assert workflow(runs, ids[0]) == finished  # swept once: a later sweep does not move it


def test_a_finished_workflow_past_its_window_is_pruned_whole(runs):
    old = enqueue_diamond(runs, "old")
    young = enqueue_diamond(runs, "young")
    drain(app, runs)
    plain = client.enqueue(runs, "step", {"n": 9})
    drain(app, runs)
    old_jobs, young_jobs = members(runs, old), members(runs, young)
    age(runs, [*old_jobs, plain], 2)
    assert edges(runs, old_jobs) == 4

    removed = prune(runs, WINDOWS)

    assert removed == {"done": 5, "dead": 0, "events": 0, "workflows": 1}  # 4 of the workflow, 1 plain job
    assert existing(runs, [*old_jobs, plain]) == [] and edges(runs, old_jobs) == 0
    assert workflow(runs, old) is None
    assert existing(runs, young_jobs) == young_jobs and edges(runs, young_jobs) == 4  # inside its window
    assert workflow(runs, young)[0] is not None


def test_a_failed_workflow_is_kept_as_long_as_dead_jobs_and_its_dead_job_leaves_the_dead_count(runs):
    failed = enqueue_diamond(runs, "failed", fail=True)
    drain(app, runs, with_scheduled=True)
    jobs = members(runs, failed)
    age(runs, jobs, 2)  # past --keep-done, inside --keep-dead

    assert prune(runs, WINDOWS)["workflows"] == 0
    assert existing(runs, jobs) == jobs  # its done jobs too, though past --keep-done: they go together
    [dead_before] = runs.execute("SELECT sum(dead) FROM jobsup.kind_totals WHERE kind = 'step'").fetchone()
    assert dead_before == 1

    age(runs, jobs, 5)
    runs.execute("UPDATE jobsup.workflows SET finished_at = now() - interval '5 hours' WHERE id = %s", (failed,))
    assert prunable(runs, WINDOWS) == {"done": 3, "dead": 1, "events": 0, "workflows": 1}
    assert prune(runs, WINDOWS) == {"done": 3, "dead": 1, "events": 0, "workflows": 1}
    assert existing(runs, jobs) == [] and workflow(runs, failed) is None
    [dead_after] = runs.execute("SELECT sum(dead) FROM jobsup.kind_totals WHERE kind = 'step'").fetchone()
    assert dead_after == 0  # dead now: a pruned dead job is no longer one


def test_an_unfinished_workflows_finished_jobs_are_kept_however_old(runs):
    wf = app.workflow("slow")
    alone = wf.add("step", {"n": 0})  # no job depends on it: nothing but its workflow keeps it
    chain = wf.chain(*[{"kind": "step", "payload": {"n": n}} for n in range(1, 4)])
    workflow_id = wf.enqueue(runs)
    first = lifecycle.claim(runs, ["default"], 2, "sup-a", 30)
    assert {j.id for j in first} == {alone.id, chain[0].id}
    lifecycle.complete(runs, [(j.id, j.attempts) for j in first], "sup-a")  # the 2nd link is queued, the 3rd waits
    plain = client.enqueue(runs, "step", {"n": 9})
    claimed = lifecycle.claim(runs, ["default"], 2, "sup-a", 30)
    lifecycle.complete(runs, [(j.id, j.attempts) for j in claimed if j.id == plain], "sup-a")
    jobs = members(runs, workflow_id)
    age(runs, [*jobs, plain], 30 * 24)

    removed = prune(runs, Retention(keep_done=1, keep_dead=1))

    assert removed == {"done": 1, "dead": 0, "events": 0, "workflows": 0}  # the plain job
    assert existing(runs, [plain]) == []
    assert existing(runs, jobs) == jobs and edges(runs, jobs) == 2
    assert workflow(runs, workflow_id) == (None, None)


def test_a_requeued_job_keeps_its_finished_workflow_from_pruning_until_it_finishes_again(runs):
    failed = enqueue_diamond(runs, "failed", fail=True)
    drain(app, runs, with_scheduled=True)
    prune(runs, FOREVER)
    jobs = members(runs, failed)
    swept = workflow(runs, failed)
    assert swept is not None and swept[1] is True
    [dead] = [
        r[0] for r in runs.execute("SELECT id FROM jobsup.jobs WHERE workflow_id = %s AND status = 'dead'", (failed,))
    ]
    assert control.requeue_dead(runs, ids=[dead]) == [dead]
    age(runs, jobs, 30 * 24)
    runs.execute("UPDATE jobsup.workflows SET finished_at = now() - interval '30 days' WHERE id = %s", (failed,))

    assert prunable(runs, WINDOWS)["workflows"] == 0
    assert prune(runs, WINDOWS)["workflows"] == 0
    assert existing(runs, jobs) == jobs
    assert workflow(runs, failed)[0] is not None  # not reopened

    drain(app, runs, with_scheduled=True)  # it fails again, and dies again
    age(runs, jobs, 30 * 24)
    assert prune(runs, WINDOWS) == {"done": 3, "dead": 1, "events": 0, "workflows": 1}
    assert existing(runs, jobs) == []


def test_a_plain_parent_is_kept_while_its_child_has_not_finished_then_pruned_with_its_dependencies(runs):
    parent, other = client.enqueue_many(runs, [{"kind": "step", "payload": {"n": n}} for n in (1, 2)])
    child = client.enqueue(runs, "step", {"n": 3}, after=[parent, other])
    [job] = lifecycle.claim(runs, ["default"], 1, "sup-a", 30)
    assert job.id == parent
    lifecycle.complete(runs, [(job.id, job.attempts)], "sup-a")
    age(runs, [parent], 30 * 24)
    assert edges(runs, [parent]) == 1

    # The child waits (for `other`): its old, done parent stays, and is not counted.
    assert prunable(runs, WINDOWS)["done"] == 0
    assert prune(runs, WINDOWS)["done"] == 0
    assert existing(runs, [parent]) == [parent]

    [job] = lifecycle.claim(runs, ["default"], 1, "sup-a", 30)
    assert job.id == other
    lifecycle.complete(runs, [(job.id, job.attempts)], "sup-a")
    assert runs.execute("SELECT status FROM jobsup.jobs WHERE id = %s", (child,)).fetchone() == ("queued",)
    assert prune(runs, WINDOWS)["done"] == 0  # queued: it may still read what its parent returned
    assert existing(runs, [parent]) == [parent]

    drain(app, runs)
    assert prunable(runs, WINDOWS)["done"] == 1
    assert prune(runs, WINDOWS)["done"] == 1
    assert existing(runs, [parent, other, child]) == [other, child]
    assert edges(runs, [parent]) == 0 and edges(runs, [child]) == 1  # other's stays while other does

    age(runs, [other, child], 2)
    assert prune(runs, WINDOWS)["done"] == 2
    assert runs.execute("SELECT count(*) FROM jobsup.dependencies").fetchone() == (0,)


def test_a_parent_that_had_finished_when_its_child_was_enqueued_is_kept_too(runs):
    parent = client.enqueue(runs, "step", {"n": 1})
    drain(app, runs)
    other = client.enqueue(runs, "step", {"n": 2}, delay=3600)
    client.enqueue(runs, "step", {"n": 3}, after=[parent, other])  # waits for other
    age(runs, [parent], 30 * 24)

    prune(runs, WINDOWS)

    assert existing(runs, [parent]) == [parent]


def test_many_kept_parents_do_not_hold_back_the_done_jobs_after_them(runs):
    parents = client.enqueue_many(runs, [{"kind": "step", "payload": {"n": n}} for n in range(6)])
    blocker = client.enqueue(runs, "step", {"n": 9}, delay=3600)  # queued, not run by the drain
    client.enqueue(runs, "step", {"n": 10}, after=[*parents, blocker])  # waits for the blocker
    drain(app, runs)
    younger = client.enqueue_many(runs, [{"kind": "step", "payload": {"n": n}} for n in range(4)])
    drain(app, runs)
    age(runs, parents, 3)
    age(runs, younger, 2)  # finished after the parents: behind them in the index's order

    # Batches of 3: were the 6 kept parents picked, they would fill two batches that delete nothing.
    removed = prune(runs, WINDOWS, batch=BatchSize(size=3, largest=3))

    assert removed["done"] == 4
    assert existing(runs, parents) == parents and existing(runs, younger) == []


@pytest.mark.slow  # the CLI in a subprocess
def test_the_prune_command_says_how_many_workflows_it_removed(runs, dsn):
    for name in ("a", "b"):
        enqueue_diamond(runs, name)
    drain(app, runs)
    age(runs, [r[0] for r in runs.execute("SELECT id FROM jobsup.jobs")], 48)

    dry = jobsup("prune", "--dsn", dsn, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith("would delete 8 done jobs, 0 dead jobs, 0 events, 2 workflows (kept: done 24h")
    result = jobsup("prune", "--dsn", dsn)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("deleted 8 done jobs, 0 dead jobs, 0 events, 2 workflows (kept: done 24h")
    assert runs.execute("SELECT count(*) FROM jobsup.workflows").fetchone() == (0,)
