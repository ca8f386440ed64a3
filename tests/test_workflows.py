"""Workflows against a real server: release on the last parent's outcome, the failure policies, the
builder's refusals, dynamic fan-out, and the drain running a workflow to its end."""

from __future__ import annotations

import re

import psycopg
import pytest

from jobsup import Workflow, children, client, parents
from jobsup.db import lifecycle
from jobsup.errors import BadInput
from jobsup.testing import drain

from .apps.flows import RUNS_TABLE, app


@pytest.fixture
def runs(conn, dsn, monkeypatch):
    conn.execute(RUNS_TABLE)
    monkeypatch.setenv("JOBSUP_DSN", dsn)
    return conn


def statuses(conn, ids) -> list[str]:
    found = dict(conn.execute("SELECT id, status FROM jobsup.jobs WHERE id = ANY(%s)", (list(ids),)).fetchall())
    return [found.get(i) for i in ids]


def starts(conn) -> list[int]:
    return [r[0] for r in conn.execute("SELECT job_id FROM flow_runs WHERE event = 'start' ORDER BY at")]


def test_a_chain_runs_in_order_and_each_link_waits_for_the_one_before(runs):
    wf = app.workflow("chain")
    links = wf.chain(*[{"kind": "step", "payload": {"n": n}} for n in range(100)])
    workflow_id = wf.enqueue(runs)
    assert workflow_id is not None and all(ref.id is not None for ref in links)
    ids = [ref.id for ref in links]
    assert statuses(runs, ids[:2]) == ["queued", "waiting"]
    drain(app, runs)
    assert starts(runs) == ids
    assert set(statuses(runs, ids)) == {"done"}


def test_a_dead_parent_cancels_its_dependents_with_the_reason_and_the_run_policy_runs_them(runs):
    wf = app.workflow()
    bad = wf.add("step", {"n": 0, "fail": True})
    cancelled = wf.chain({"kind": "step", "payload": {"n": 1}}, {"kind": "step", "payload": {"n": 2}}, after=bad)
    anyway = wf.add("step", {"n": 3}, after=bad, on_parent_failure="run")
    wf.enqueue(runs)
    drain(app, runs, with_scheduled=True)
    assert statuses(runs, [bad.id, *(r.id for r in cancelled), anyway.id]) == ["dead", "cancelled", "cancelled", "done"]
    errors = [
        r[0]
        for r in runs.execute(
            "SELECT last_error FROM jobsup.jobs WHERE id = ANY(%s) ORDER BY id", ([r.id for r in cancelled],)
        )
    ]
    assert errors == [f"cancelled: job {bad.id}, which it waits for, ended dead"] * 2
    [parent] = parents(runs, anyway.id)
    assert (parent.id, parent.status, parent.last_error) == (bad.id, "dead", "RuntimeError: step 0 failed on purpose")


def test_a_dependency_on_a_finished_job_is_settled_at_once(runs):
    done = client.enqueue(runs, "step", {"n": 1})
    dead = client.enqueue(runs, "step", {"n": 2, "fail": True}, max_attempts=1)
    drain(app, runs)
    after_done = client.enqueue(runs, "step", {"n": 3}, after=[done])
    after_dead = client.enqueue(runs, "step", {"n": 4}, after=[done, dead])
    after_dead_run = client.enqueue(runs, "step", {"n": 5}, after=[dead], on_parent_failure="run")
    assert statuses(runs, [after_done, after_dead, after_dead_run]) == ["queued", "cancelled", "queued"]


def test_after_a_running_job_waits_for_its_outcome_and_not_its_retries(runs):
    parent = client.enqueue(runs, "step", {"n": 1})
    [job] = lifecycle.claim(runs, ["default"], 1, "sup-a", 30)
    child = client.enqueue(runs, "step", {"n": 2}, after=[parent])
    assert statuses(runs, [child]) == ["waiting"]
    lifecycle.fail(runs, [lifecycle.Failure(job.id, job.attempts, "boom", None)], "sup-a")
    assert statuses(runs, [parent, child]) == ["queued", "waiting"]  # a retry is not an end
    runs.execute("UPDATE jobsup.jobs SET run_at = now() WHERE id = %s", (parent,))
    [job] = lifecycle.claim(runs, ["default"], 1, "sup-a", 30)
    lifecycle.complete(runs, [(job.id, job.attempts)], "sup-a")
    assert statuses(runs, [parent, child]) == ["done", "queued"]


def test_a_parent_finishing_while_the_child_is_enqueued_in_an_open_transaction_releases_it(runs, dsn):
    parent = client.enqueue(runs, "step", {"n": 1})
    [job] = lifecycle.claim(runs, ["default"], 1, "sup-a", 30)
    with psycopg.connect(dsn) as other:  # the caller's transaction, open across the parent's outcome
        child = client.enqueue(other, "step", {"n": 2}, after=[parent])
        lifecycle.complete(runs, [(job.id, job.attempts)], "sup-a")  # not held up by the open transaction
        assert statuses(runs, [parent]) == ["done"]
    assert statuses(runs, [child]) == ["queued"]


def test_a_group_with_a_callback_reads_what_every_member_returned(runs):
    wf = Workflow("fan", app=app)
    group = wf.group([{"kind": "parse", "payload": {"n": n}} for n in range(20)], then="report")
    wf.enqueue(runs)
    drain(app, runs)
    [value] = runs.execute("SELECT return_value FROM jobsup.jobs WHERE id = %s", (group.then.id,)).fetchone()
    assert value == {"parents": 20, "parsed": 20, "sum": sum(n * 2 for n in range(20))}


def test_a_handler_adds_jobs_at_run_time_and_the_report_waits_for_all_of_them(runs):
    wf = app.workflow("files")
    scan = wf.add("scan", {"files": 500})
    report = wf.add("report", after=scan)
    workflow_id = wf.enqueue(runs)
    drain(app, runs)
    [(value, status)] = runs.execute("SELECT return_value, status FROM jobsup.jobs WHERE id = %s", (report.id,))
    assert status == "done"
    assert value == {"parents": 501, "parsed": 500, "sum": sum(n * 2 for n in range(500))}
    [(count,)] = runs.execute("SELECT count(*) FROM jobsup.jobs WHERE workflow_id = %s", (workflow_id,))
    assert count == 502
    assert [c.kind for c in children(runs, scan.id)] == ["report"]


def test_a_workflow_in_a_rolled_back_transaction_leaves_nothing(dsn, conn):
    with psycopg.connect(dsn) as other:
        wf = app.workflow("gone")
        wf.group([{"kind": "parse", "payload": {"n": 1}}], then="report")
        wf.enqueue(other)
        other.rollback()
    assert conn.execute(
        "SELECT (SELECT count(*) FROM jobsup.jobs), (SELECT count(*) FROM jobsup.workflows),"
        " (SELECT count(*) FROM jobsup.dependencies)"
    ).fetchone() == (0, 0, 0)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda wf: None, "a workflow needs at least one job"),
        (lambda wf: wf.add("step", after=[999_999]), "no job 999999"),
        (lambda wf: wf.add("step", after=["12"]), "after= takes job ids (whole numbers from 1), not '12'"),
        (lambda wf: wf.add("step", after=[True]), "after= takes job ids"),
        (lambda wf: wf.add("step", after=Workflow().add("step")), "names a job of another workflow"),
    ],
)
def test_bad_input_is_one_clear_error_and_writes_nothing(conn, build, message):
    with pytest.raises(BadInput, match=re.escape(message)):
        wf = app.workflow()
        build(wf)
        wf.enqueue(conn)
    assert conn.execute("SELECT count(*) FROM jobsup.jobs").fetchone() == (0,)


def test_a_cycle_is_refused(conn):
    wf = app.workflow()
    a = wf.add("step")
    wf.add("step", after=a, before=a)
    with pytest.raises(BadInput, match="cycle"):
        wf.enqueue(conn)
    with pytest.raises(BadInput, match="no job 424242"):
        client.enqueue(conn, "step", after=[424242])
    assert conn.execute("SELECT count(*) FROM jobsup.jobs").fetchone() == (0,)


def test_a_parent_given_twice_is_one_parent(conn, capsys):
    from jobsup.cli import main

    first = client.enqueue(conn, "step")
    # enqueue(after=[1, 1]), from Python and from the command line, and Workflow.add(after=[a, a],
    # before=[b, b]): each is after that parent, once, never the database's unique violation.
    child = client.enqueue(conn, "step", after=[first, first])
    assert main(["enqueue", "step", "--after", f"{first},{first}", "--after", str(first), "--dsn", conn.info.dsn]) == 0
    assert capsys.readouterr().out == f"enqueued job {child + 1}, after {first}\n"
    wf = app.workflow()
    a = wf.add("step")
    b = wf.add("step", after=[a, a, first, first])
    c = wf.add("step", after=[a, a], before=[b, b])
    wf.enqueue(conn)
    counts = dict(
        conn.execute(
            "SELECT child_id, count(*) FROM jobsup.dependencies WHERE child_id = ANY(%s) GROUP BY child_id",
            ([child, child + 1, b.id, c.id],),
        ).fetchall()
    )
    assert counts == {child: 1, child + 1: 1, b.id: 3, c.id: 1}  # b: a, first and c
    assert [p.id for p in parents(conn, child)] == [first]
    # Its count of parents left is one per parent too: b is released once a, first and c are done.
    assert conn.execute("SELECT parents_left FROM jobsup.jobs WHERE id = %s", (b.id,)).fetchone() == (3,)
